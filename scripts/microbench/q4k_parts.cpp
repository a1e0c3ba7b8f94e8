// Where the AVX2 Q4_K kernel's time goes: q4k_rows<8> as in specdraft/kernels/gguf_matmul.cpp
// (8 rows of x against groups of 8 output rows, 6 super-blocks of 256 inputs each: the
// default target's 1536-wide products), timed against variants that each leave one part out
// (their results are wrong; only their speed is read), one after the other, rounds averaged:
//   no unpack            weights read from a copy unpacked to one byte a weight (twice the bytes)
//   no sum round trip    each row's sub-block sum not added to its sum in L1 (folded into a register)
//   no mins/float        no mins and no float step once a super-block (the integer sums kept)
//   no prefetch          no software prefetch of the records 2 ahead
// GROUPS 40: the records stay in L2; 2000: they stream from memory. Build and run on one core:
//   g++ -O3 -mavx2 -mfma -fopenmp q4k_parts.cpp -o q4k_parts && taskset -c 1 ./q4k_parts 40 200 10 && taskset -c 1 ./q4k_parts 2000 4 10
// With "rows" first, the shipped kernel by rows of x (1, 2, 3, 4, 8) on THREADS threads, the records
// in 2 MB pages: ns a record, so that from L2 (taskset -c 1 ./q4k_parts rows 40 20000 1) it is the
// kernel's compute and from memory (./q4k_parts rows 40000 5 2: 292 MB) whether a check's extra
// rows overlap the weight stream or add their multiplies to it.
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>
#include <vector>
#include <sys/mman.h>
static inline __m256i bcast4(const void* p) { int32_t v; std::memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
constexpr int REC = 1216;
template <int V, int NT>
__attribute__((noinline)) void q4k_rows(const uint8_t* w, const uint8_t* wu, const int8_t* qx, const float* xs, const int32_t* pairs,
    int64_t nb, int64_t in, float* out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    alignas(32) float acc[NT][8];
    alignas(32) int32_t sum[NT][8];
    __m256i sink = _mm256_setzero_si256();
    for (int r = 0; r < NT; ++r) _mm256_store_ps(acc[r], _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = w + b * REC;
        const int8_t* xb = qx + b * 256;
        for (int r = 0; r < NT; ++r) _mm256_store_si256((__m256i*)sum[r], _mm256_setzero_si256());
        for (int s = 0; s < 8; ++s) {
            if (V != 4) { const uint8_t* p = rec + 2 * REC + 152 * s; for (int o = 0; o < 152 + 63; o += 64) _mm_prefetch((const char*)(p + o), _MM_HINT_T0); }
            const __m128i sc8 = _mm_loadl_epi64((const __m128i*)(rec + 1024 + 8 * s));
            const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8));
            __m256i q[8];
            if (V == 1) {
                const uint8_t* u = wu + (b * 8 + s) * 256;
                for (int k = 0; k < 8; ++k) q[k] = _mm256_loadu_si256((const __m256i*)(u + 32 * k));
            } else {
                for (int c = 0; c < 4; ++c) {
                    const __m256i v = _mm256_loadu_si256((const __m256i*)(rec + 128 * s + 32 * c));
                    q[2 * c] = _mm256_and_si256(v, low4);
                    q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                }
            }
            for (int r = 0; r < NT; ++r) {
                const int8_t* x = xb + r * in + 32 * s;
                __m256i p = _mm256_maddubs_epi16(q[0], bcast4(x));
                for (int k = 1; k < 8; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[k], bcast4(x + 4 * k)));
                if (V == 2) { sink = _mm256_xor_si256(sink, _mm256_madd_epi16(p, sc)); continue; }
                __m256i* sm = (__m256i*)sum[r];
                _mm256_store_si256(sm, _mm256_add_epi32(_mm256_load_si256(sm), _mm256_madd_epi16(p, sc)));
            }
        }
        if (V == 3) { for (int r = 0; r < NT; ++r) sink = _mm256_xor_si256(sink, _mm256_load_si256((const __m256i*)sum[r])); continue; }
        __m256i mn[4];
        for (int q = 0; q < 4; ++q) mn[q] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(rec + 1088 + 16 * q)));
        const __m256 d = _mm256_loadu_ps((const float*)(rec + 1152)), dmin = _mm256_loadu_ps((const float*)(rec + 1184));
        for (int r = 0; r < NT; ++r) {
            const int32_t* pr = pairs + (r * nb + b) * 4;
            __m256i m = _mm256_setzero_si256();
            for (int q = 0; q < 4; ++q) m = _mm256_add_epi32(m, _mm256_madd_epi16(mn[q], _mm256_set1_epi32(pr[q])));
            const __m256 x = _mm256_set1_ps(xs[r * nb + b]);
            __m256 a = _mm256_load_ps(acc[r]);
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i*)sum[r])), _mm256_mul_ps(d, x), a);
            a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, x), a);
            _mm256_store_ps(acc[r], a);
        }
    }
    for (int r = 0; r < NT; ++r) std::memcpy(out + r * 8, acc[r], 32);
    alignas(32) int32_t sk[8]; _mm256_store_si256((__m256i*)sk, sink); out[0] += sk[0];
}
template <int V>
double run(int groups, int nb, const std::vector<uint8_t>& w, const std::vector<uint8_t>& wu, const std::vector<int8_t>& qx,
           const std::vector<float>& xs, const std::vector<int32_t>& pairs, int reps) {
    std::vector<float> out(8 * 8 * groups);
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < reps; ++it)
        for (int g = 0; g < groups; ++g)
            q4k_rows<V, 8>(w.data() + (size_t)g * nb * REC, wu.data() + (size_t)g * nb * 8 * 256, qx.data(), xs.data(), pairs.data(), nb, nb * 256, out.data() + g * 64);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return (double)reps * groups * 8 * nb * 256 * 8 / t / 1e9;
}
template <int NT>
double ns_a_record(int groups, int nb, const uint8_t* w, const int8_t* qx, const float* xs, const int32_t* pairs, int reps, int threads) {
    std::vector<float> out(8 * 8 * groups);
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < reps; ++it) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int g = 0; g < groups; ++g)
            q4k_rows<0, NT>(w + (size_t)g * nb * REC, nullptr, qx, xs, pairs, nb, nb * 256, out.data() + g * 64);
    }
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return t / reps / ((double)groups * nb / threads) * 1e9;
}
int rows(int argc, char** argv) {
    if (argc < 5) { fprintf(stderr, "usage: q4k_parts rows GROUPS REPS THREADS\n"); return 2; }
    const int groups = atoi(argv[2]), reps = atoi(argv[3]), threads = atoi(argv[4]), nb = 6;
    const size_t huge = 1 << 21, bytes = ((size_t)groups * nb * REC + 4 * REC + huge - 1) / huge * huge;
    uint8_t* w = (uint8_t*)aligned_alloc(huge, bytes);
    madvise(w, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < bytes; ++i) w[i] = rand() & 0x3F;
    std::vector<int8_t> qx(8 * nb * 256); for (auto& v : qx) v = (rand() % 255) - 127;
    std::vector<float> xs(8 * nb, 0.02f); std::vector<int32_t> pairs(8 * nb * 4, 100);
    for (int round = 0; round < 3; ++round)
        printf("groups %d, %d threads: ns a record a thread at 1 / 2 / 3 / 4 / 8 rows of x: %.0f / %.0f / %.0f / %.0f / %.0f\n", groups, threads,
               ns_a_record<1>(groups, nb, w, qx.data(), xs.data(), pairs.data(), reps, threads),
               ns_a_record<2>(groups, nb, w, qx.data(), xs.data(), pairs.data(), reps, threads),
               ns_a_record<3>(groups, nb, w, qx.data(), xs.data(), pairs.data(), reps, threads),
               ns_a_record<4>(groups, nb, w, qx.data(), xs.data(), pairs.data(), reps, threads),
               ns_a_record<8>(groups, nb, w, qx.data(), xs.data(), pairs.data(), reps, threads));
    free(w);
    return 0;
}
int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "rows") return rows(argc, argv);
    if (argc < 4) { fprintf(stderr, "usage: q4k_parts GROUPS REPS ROUNDS | q4k_parts rows GROUPS REPS THREADS\n"); return 2; }
    const int groups = atoi(argv[1]), nb = 6, reps = atoi(argv[2]), rounds = atoi(argv[3]);
    std::vector<uint8_t> w((size_t)groups * nb * REC + 4 * REC), wu((size_t)groups * nb * 8 * 256 + 64);
    for (auto& v : w) v = rand() & 0x3F;
    for (int g = 0; g < groups; ++g) for (int b = 0; b < nb; ++b) for (int i = 1152; i < 1216; i += 4) { float f = 0.01f; std::memcpy(&w[((size_t)g * nb + b) * REC + i], &f, 4); }
    for (auto& v : wu) v = rand() & 0x0F;
    std::vector<int8_t> qx(8 * nb * 256); for (auto& v : qx) v = (rand() % 255) - 127;
    std::vector<float> xs(8 * nb, 0.02f); std::vector<int32_t> pairs(8 * nb * 4, 100);
    double tot[5] = {0};
    for (int r = 0; r < rounds; ++r) {
        double g0 = run<0>(groups, nb, w, wu, qx, xs, pairs, reps), g1 = run<1>(groups, nb, w, wu, qx, xs, pairs, reps),
               g2 = run<2>(groups, nb, w, wu, qx, xs, pairs, reps), g3 = run<3>(groups, nb, w, wu, qx, xs, pairs, reps),
               g4 = run<4>(groups, nb, w, wu, qx, xs, pairs, reps);
        tot[0] += g0; tot[1] += g1 / g0; tot[2] += g2 / g0; tot[3] += g3 / g0; tot[4] += g4 / g0;
    }
    printf("groups %d: shipped %.1f G products/s; relative speed: no unpack %.3f, no sum round trip %.3f, no mins/float %.3f, no prefetch %.3f\n",
           groups, tot[0] / rounds, tot[1] / rounds, tot[2] / rounds, tot[3] / rounds, tot[4] / rounds);
}
