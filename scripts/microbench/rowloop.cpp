// The bound of the AVX2 Q4_K kernel's inner loop (specdraft/kernels/gguf_matmul.cpp, q4k_rows):
// per row of x and sub-block of 8 output rows x 32 inputs, 8 vpmaddubsw (each 4 inputs of all
// 8 rows against 4 inputs of x broadcast from L1), 7 vpaddw, one vpmaddwd by the scales and a
// vpaddd, with the weights already unpacked in registers and nothing else: no weight stream,
// no unpacking, no per-super-block float step. What the kernel reaches against this is what its
// other work costs. Build and run on one core:
//   g++ -O3 -mavx2 -mfma rowloop.cpp -o rowloop && ./rowloop
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

static inline __m256i bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// n rounds of 8 rows x one sub-block; returns a sum so nothing is optimised away
__attribute__((noinline)) __m256i rows(const int8_t* xb, long n, __m256i seed) {
    __m256i q[8];
    for (int k = 0; k < 8; ++k) q[k] = _mm256_add_epi8(seed, _mm256_set1_epi8((char)k));
    const __m256i sc = _mm256_set1_epi16(3);
    __m256i total = _mm256_setzero_si256();
    for (long i = 0; i < n; ++i)
        for (int r = 0; r < 8; ++r) {
            const int8_t* x = xb + r * 64 + (i & 1) * 32;
            __m256i p = _mm256_maddubs_epi16(q[0], bcast4(x));
            for (int k = 1; k < 8; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[k], bcast4(x + 4 * k)));
            total = _mm256_add_epi32(total, _mm256_madd_epi16(p, sc));
        }
    return total;
}

int main() {
    alignas(64) int8_t xb[512];
    for (int i = 0; i < 512; ++i) xb[i] = (int8_t)(i * 7);
    const long n = 20000000;
    for (int rep = 0; rep < 3; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        __m256i s = rows(xb, n, _mm256_set1_epi8((char)rep));
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("%.1f G products/s (%.2f G vpmaddubsw/s) [%d]\n", n * 8 * 256 / sec / 1e9, n * 64 / sec / 1e9,
               _mm256_extract_epi32(s, 0) & 1);
    }
}
