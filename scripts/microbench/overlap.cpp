// How much vector work a core can do under a streaming read before the read slows: a 1 GB
// stream (64 bytes a load, prefetched DIST bytes ahead) with K vpmullw zmm (8 independent chains) per 128
// bytes, against the same work over 1 MB in the caches (the work alone). A kernel whose compute
// per weight byte is C ms/GB and whose weights stream at M ms/GB costs max(C, M) with perfect
// overlap and C + M with none; this says where between the two a machine lands.
// Build: g++ -O2 -mavx512f -mavx512bw -fopenmp overlap.cpp -o overlap
// Run:   for K in 0 2 4 8 12 16; do OMP_NUM_THREADS=2 ./overlap $K 2048; done
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: overlap K DIST\n");
        return 2;
    }
    const size_t n = size_t(1) << 30, hot = size_t(1) << 20;
    const int K = std::atoi(argv[1]), dist = std::atoi(argv[2]);
    char* a = static_cast<char*>(std::aligned_alloc(64, n));
#pragma omp parallel for
    for (size_t i = 0; i < n; i += 4096)
        for (size_t j = 0; j < 4096; ++j) a[i + j] = char(j);
    double best[2] = {0, 0};  // GB/s: [0] 1 MB a thread in the caches, [1] the 1 GB stream
    for (int rep = 0; rep < 4; ++rep)
        for (int mem = 0; mem < 2; ++mem) {
            const auto t0 = std::chrono::steady_clock::now();
            __m512i total = _mm512_setzero_si512();
#pragma omp parallel
            {
                __m512i s0 = _mm512_setzero_si512(), s1 = s0, c[8];
                for (int j = 0; j < 8; ++j) c[j] = _mm512_set1_epi16(short(j + 3));
                const __m512i f = _mm512_set1_epi16(7);
                const size_t own = size_t(omp_get_thread_num()) * hot;
#pragma omp for
                for (size_t i = 0; i < n; i += 128) {
                    const size_t o = mem ? i : i % hot + own;
                    if (dist && mem) {
                        _mm_prefetch(a + o + dist, _MM_HINT_T0);
                        _mm_prefetch(a + o + dist + 64, _MM_HINT_T0);
                    }
                    s0 = _mm512_add_epi8(s0, _mm512_load_si512(a + o));
                    s1 = _mm512_add_epi8(s1, _mm512_load_si512(a + o + 64));
                    for (int k = 0; k < K; ++k) c[k & 7] = _mm512_mullo_epi16(c[k & 7], f);  // 8 independent chains
                }
                __m512i cc = c[0];
                for (int j = 1; j < 8; ++j) cc = _mm512_add_epi16(cc, c[j]);
#pragma omp critical
                total = _mm512_add_epi8(total, _mm512_add_epi8(_mm512_add_epi8(s0, s1), cc));
            }
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (n / s / 1e9 > best[mem]) best[mem] = n / s / 1e9;
            if (_mm512_reduce_add_epi32(total) == 12345) std::printf(" ");  // keeps the sums live
        }
    std::printf("K %2d dist %5d: work alone %.1f ms/GB, stream with it %.1f ms/GB (%.1f GB/s)\n", K, dist,
                1e3 / best[0], 1e3 / best[1], best[1]);
}
