// Whether vector work runs alongside the tile unit: tdpbsud into 4 independent sums (tiles in
// registers, no loads), alone, and with K vector instructions of one kind (vpdpwssd, vpermd,
// vcvtdq2ps, vpaddd, on 8 independent registers) between each pair of products; one thread.
// "together" near max(products alone, vector alone) means they overlap; near their sum, they
// share an issue port. Needs AMX-INT8 (Linux grants the tile state on request).
// Build: g++ -O2 -mavx512f -mamx-tile -mamx-int8 amx_vector.cpp -o amx_vector && ./amx_vector
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <initializer_list>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
alignas(64) static uint8_t W[2][1024];
alignas(64) static int8_t X[2][1024];
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// K instructions of one kind over 8 independent registers: vpdpwssd, vpermd, vcvtdq2ps, vpaddd
template <int KIND>
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline void vector_work(__m512i* v, int K) {
    const __m512i f = _mm512_set1_epi32(3), idx = _mm512_set1_epi32(5);
    for (int k = 0; k < K; ++k) {
        if (KIND == 0) v[k & 7] = _mm512_dpwssd_epi32(v[k & 7], f, f);
        else if (KIND == 1) v[k & 7] = _mm512_permutexvar_epi32(idx, v[k & 7]);
        else if (KIND == 2) v[k & 7] = _mm512_castps_si512(_mm512_cvtepi32_ps(v[k & 7]));
        else v[k & 7] = _mm512_add_epi32(v[k & 7], f);
    }
}

// seconds for N products (TILES) with K vector instructions after every two, or the vector work
// of N products alone
template <int KIND, bool TILES>
__attribute__((target("avx512f,avx512bw,avx512vnni,amx-tile,amx-int8"), noinline))
double run(long N, int K, __m512i* sink) {
    __m512i v[8];
    for (int j = 0; j < 8; ++j) v[j] = _mm512_set1_epi32(j + 1);
    const double t = now();
    for (long i = 0; i < N / 2; ++i) {
        if constexpr (TILES) {
            if (i & 1) {
                _tile_dpbsud(2, 5, 6);
                _tile_dpbsud(3, 5, 7);
            } else {
                _tile_dpbsud(0, 4, 6);
                _tile_dpbsud(1, 4, 7);
            }
        }
        vector_work<KIND>(v, K);
    }
    const double s = now() - t;
    __m512i a = v[0];
    for (int j = 1; j < 8; ++j) a = _mm512_add_epi32(a, v[j]);
    *sink = a;
    return s;
}
__attribute__((target("amx-tile,amx-int8")))
int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { puts("no amx"); return 1; }
    Cfg c; for (int t = 0; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
    memset(W, 3, sizeof W); memset(X, 1, sizeof X);
    _tile_loadd(4, X[0], 64); _tile_loadd(5, X[1], 64); _tile_loadd(6, W[0], 64); _tile_loadd(7, W[1], 64);
    const long N = 4000000;
    __m512i sink;
    const char* names[4] = {"vpdpwssd", "vpermd", "vcvtdq2ps", "vpaddd"};
    const double base = run<0, true>(N, 0, &sink) / N * 1e9;
    printf("tdpbsud alone: %.2f ns each\n", base);
    for (int K : {4, 8, 16, 24}) {
        double r[4], v[4];
        r[0] = run<0, true>(N, K, &sink), v[0] = run<0, false>(N, K, &sink);
        r[1] = run<1, true>(N, K, &sink), v[1] = run<1, false>(N, K, &sink);
        r[2] = run<2, true>(N, K, &sink), v[2] = run<2, false>(N, K, &sink);
        r[3] = run<3, true>(N, K, &sink), v[3] = run<3, false>(N, K, &sink);
        printf("K %2d per 2 products:", K);
        for (int j = 0; j < 4; ++j) printf("  %s together %.2f (vector alone %.2f)", names[j], r[j] / N * 1e9, v[j] / N * 1e9);
        printf("  ns a product\n");
    }
    _tile_release();
    if (_mm512_reduce_add_epi32(sink) == 1) puts("");
}
