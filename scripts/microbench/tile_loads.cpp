// What tile loads add to tile products: ns per tdpbsud for the AMX kernel's pattern (a tile of x
// and two weight tiles loaded for each pair of products into two sums, 4 pairs, then the sums
// stored and zeroed) and for the same with parts left out; one thread. Needs AMX-INT8.
//   mode 0: the products alone (tiles stay in registers)
//   mode 1: the kernel's pattern; mode 2: without the stores and zeroing
//   mode 3: without the x loads (the weights' still); mode 4: without the weights' loads
// x rows at strides of 64, 1536 and 8960 bytes (the default target's input widths); the weight
// tiles cycle through 64 KB.
// Build: g++ -O2 -mavx512f -mamx-tile -mamx-int8 tile_loads.cpp -o tile_loads && taskset -c 1 ./tile_loads
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <initializer_list>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
alignas(64) static uint8_t W[64][1024];
alignas(64) static int8_t X[16 * 8192];
alignas(64) static int32_t C[4][256];
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
#define T __attribute__((target("avx512f,amx-tile,amx-int8"), noinline))
// ns per product over N products in mode (see the header), x rows xs bytes apart
T double run(int mode, long N, long xs) {
    const double t = now();
    for (long i = 0; i < N / 8; ++i) {
        if (mode == 1 || mode == 3 || mode == 4) { _tile_zero(0); _tile_zero(1); }
        for (int p = 0; p < 4; ++p) {
            const uint8_t* b = W[(i * 8 + 2 * p) & 63];
            if (mode != 0 && mode != 4) _tile_loadd(6, b, 64);
            if (mode != 0 && mode != 3) _tile_loadd(4, X + 64 * p, xs);
            _tile_dpbsud(0, 4, 6);
            if (mode != 0 && mode != 4) _tile_loadd(7, b + 1024, 64);
            _tile_dpbsud(1, 4, 7);
        }
        if (mode == 1 || mode == 3 || mode == 4) { _tile_stored(0, C[0], 64); _tile_stored(1, C[1], 64); }
    }
    return (now() - t) / N * 1e9;
}
T int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { puts("no amx"); return 1; }
    Cfg c; for (int t = 0; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
    memset(W, 1, sizeof W); memset(X, 1, sizeof X);
    const long N = 8 << 20;
    for (long xs : {64L, 1536L, 8960L})
        for (int rep = 0; rep < 2; ++rep) {
            printf("x stride %5ld:", xs);
            for (int m = 0; m < 5; ++m) printf("  mode%d %.2f", m, run(m, N, xs));
            printf("  ns/product\n");
        }
    _tile_release();
}
