// Can Zen 1's second multiply pipe help the AVX2 Q4_K products? Zen 1 runs vpmaddubsw on one pipe
// only, and vfmadd231ps on two (scripts/microbench/peak.cpp's pairs: vpmaddubsw + vfmadd 1:1 issue
// together at the sum of their rates), so this tries rows of x computed in float beside the
// integer rows: the weights of a group pre-multiplied by their sub-block scales into floats
// (sc * q <= 945, exact), each float row's sub-block sums by vfmadd on the integer values of x
// (|sum| <= 32 * 945 * 127 < 2^24: exact), converted to int32 once a sub-block. The integer sums
// equal the vpmaddubsw rows' bit for bit (checked at start), so such rows would keep every path's
// logits identical. NI + NF: NI rows by vpmaddubsw as in gguf_matmul.cpp's q4k_rows, NF rows in
// float, their work spread among the integer rows' so the two pipes can overlap; records of
// GROUPS groups of 8 output rows, 6 super-blocks (1536 inputs), G products/s on one core.
// Build and run on one core:
//   g++ -O3 -mavx2 -mfma dual_pipe.cpp -o dual_pipe && taskset -c 1 ./dual_pipe 8 1000
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
static inline __m256i bcast4(const void* p) { int32_t v; std::memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
constexpr int REC = 1216;
// wf: [nb][8 s][32 i][8 o] float = sc[s][o] * q[o][32s+i]
void to_float(const uint8_t* w, int nb, float* wf) {
    for (int b = 0; b < nb; ++b) {
        const uint8_t* rec = w + b * REC;
        for (int s = 0; s < 8; ++s)
            for (int c = 0; c < 4; ++c)
                for (int o = 0; o < 8; ++o)
                    for (int i = 0; i < 4; ++i) {
                        uint8_t byte = rec[128 * s + 32 * c + 4 * o + i];
                        float sc = rec[1024 + 8 * s + o];
                        wf[((b * 8 + s) * 32 + 8 * c + i) * 8 + o] = sc * (byte & 15);
                        wf[((b * 8 + s) * 32 + 8 * c + 4 + i) * 8 + o] = sc * (byte >> 4);
                    }
    }
}
template <int NI, int NF>
__attribute__((noinline)) void sums(const uint8_t* w, const float* wf, const int8_t* qx, const float* xf, int nb, int in, int32_t* out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    alignas(32) int32_t sum[NI > 0 ? NI : 1][8];
    for (int b = 0; b < nb; ++b) {
        const uint8_t* rec = w + b * REC;
        for (int r = 0; r < NI; ++r) _mm256_store_si256((__m256i*)sum[r], _mm256_setzero_si256());
        __m256i fs[NF > 0 ? NF : 1];
        for (int r = 0; r < NF; ++r) fs[r] = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {
            const __m128i sc8 = _mm_loadl_epi64((const __m128i*)(rec + 1024 + 8 * s));
            const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8));
            __m256i q[8];
            for (int c = 0; c < 4; ++c) {
                const __m256i v = _mm256_loadu_si256((const __m256i*)(rec + 128 * s + 32 * c));
                q[2 * c] = _mm256_and_si256(v, low4);
                q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
            const float* ws = wf + (b * 8 + s) * 256;
            // float rows: 2 accumulator chains a row (even and odd inputs)
            __m256 a[NF > 0 ? NF : 1][2];
            for (int r = 0; r < NF; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
            _Pragma("GCC unroll 8") for (int r = 0; r < NI; ++r) {
                const int8_t* x = qx + r * in + b * 256 + 32 * s;
                __m256i p = _mm256_maddubs_epi16(q[0], bcast4(x));
                for (int k = 1; k < 8; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[k], bcast4(x + 4 * k)));
                __m256i* sm = (__m256i*)sum[r];
                _mm256_store_si256(sm, _mm256_add_epi32(_mm256_load_si256(sm), _mm256_madd_epi16(p, sc)));
                if (NF && r < 4) {  // spread the float work among the int rows
                    _Pragma("GCC unroll 8") for (int i = 8 * r; i < 8 * r + 8; ++i) {
                        const __m256 wv = _mm256_loadu_ps(ws + 8 * i);
                        _Pragma("GCC unroll 4") for (int f = 0; f < NF; ++f)
                            a[f][i & 1] = _mm256_fmadd_ps(wv, _mm256_broadcast_ss(xf + f * in + b * 256 + 32 * s + i), a[f][i & 1]);
                    }
                }
            }
            if (NI < 4)
                _Pragma("GCC unroll 32") for (int i = 8 * NI; i < 32; ++i) {
                    const __m256 wv = _mm256_loadu_ps(ws + 8 * i);
                    for (int f = 0; f < NF; ++f)
                        a[f][i & 1] = _mm256_fmadd_ps(wv, _mm256_broadcast_ss(xf + f * in + b * 256 + 32 * s + i), a[f][i & 1]);
                }
            for (int f = 0; f < NF; ++f) fs[f] = _mm256_add_epi32(fs[f], _mm256_cvtps_epi32(_mm256_add_ps(a[f][0], a[f][1])));
        }
        for (int r = 0; r < NI; ++r) for (int o = 0; o < 8; ++o) out[(r * nb + b) * 8 + o] = sum[r][o];
        for (int f = 0; f < NF; ++f) _mm256_storeu_si256((__m256i*)(out + ((NI + f) * nb + b) * 8), fs[f]);
    }
}
template <int NI, int NF>
double rate(int groups, int nb, const std::vector<uint8_t>& w, const std::vector<float>& wf, const std::vector<int8_t>& qx,
            const std::vector<float>& xf, int reps, std::vector<int32_t>& out) {
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < reps; ++it)
        for (int g = 0; g < groups; ++g)
            sums<NI, NF>(w.data() + (size_t)g * nb * REC, wf.data() + (size_t)g * nb * 2048, qx.data(), xf.data() + NI * nb * 256, nb, nb * 256, out.data());
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return (double)reps * groups * 8 * nb * 256 * (NI + NF) / t / 1e9;
}
int main(int argc, char** argv) {
    // GROUPS 8: 58 KB of records and 393 KB of float weights, in L2
    const int groups = argc > 1 ? atoi(argv[1]) : 8, reps = argc > 2 ? atoi(argv[2]) : 2000, nb = 6, in = nb * 256;
    std::vector<uint8_t> w((size_t)groups * nb * REC);
    for (auto& v : w) v = rand();
    for (int g = 0; g < groups * nb; ++g) for (int i = 0; i < 64; ++i) w[g * REC + 1024 + i] &= 63;
    std::vector<float> wf((size_t)groups * nb * 2048);
    for (int g = 0; g < groups; ++g) to_float(w.data() + (size_t)g * nb * REC, nb, wf.data() + (size_t)g * nb * 2048);
    std::vector<int8_t> qx(8 * in); for (auto& v : qx) v = (rand() % 255) - 127;
    std::vector<float> xf(8 * in); for (int i = 0; i < 8 * in; ++i) xf[i] = qx[i];
    // check: row r by either path gives the same sums
    std::vector<int32_t> o8(8 * nb * 8), o44(8 * nb * 8);
    sums<8, 0>(w.data(), wf.data(), qx.data(), xf.data() + 8 * in, nb, in, o8.data());
    sums<4, 4>(w.data(), wf.data(), qx.data(), xf.data() + 4 * in, nb, in, o44.data());
    printf("sums equal (rows 4-7 float): %s\n", o8 == o44 ? "yes" : "NO");
    std::vector<int32_t> out(8 * nb * 8);
    for (int round = 0; round < 5; ++round)
        printf("G products/s: 8+0 %.2f  7+1 %.2f  6+2 %.2f  6+1 %.2f  5+2 %.2f  4+2 %.2f 4+4 %.2f  0+2 %.2f\n",
               rate<8, 0>(groups, nb, w, wf, qx, xf, reps, out), rate<7, 1>(groups, nb, w, wf, qx, xf, reps, out),
               rate<6, 2>(groups, nb, w, wf, qx, xf, reps, out), rate<6, 1>(groups, nb, w, wf, qx, xf, reps, out),
               rate<5, 2>(groups, nb, w, wf, qx, xf, reps, out), rate<4, 2>(groups, nb, w, wf, qx, xf, reps, out),
               rate<4, 4>(groups, nb, w, wf, qx, xf, reps, out), rate<0, 2>(groups, nb, w, wf, qx, xf, reps, out));
}
