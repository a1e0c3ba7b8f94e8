// The Q4_K / Q6_K kernels for CPUs with AVX-512 VNNI (Ice Lake, Zen 4 and later): the kernels of
// gguf_vnni_kernels.h over two 8-row groups a zmm (16 rows: half the instructions a row of the
// ymm form) and, for blocks of few rows, one group a ymm (EVEX vpdpbusd): one weight stream a
// thread, as the AVX2 kernels read it (measured below). Built in every build with target
// attributes (the rest of the extension is AVX2), called only where the CPU has the ISA.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "gguf_common.h"

#define KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define YMM_DPBUSD _mm256_dpbusd_epi32
#define YMM_DPWSSD _mm256_dpwssd_epi32

namespace gguf {
namespace avx512 {

#include "gguf_vnni_kernels.h"

#include "gguf_zmm.h"

}  // namespace avx512

bool cpu_has_avx512_vnni() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

// Which form a block of 1..8 rows takes, per weight type, per rows (a block of more rows always
// takes the zmm form, 9-16 rows in one pass, see vnni_matmul) and per row length (short: < 16
// super-blocks, the 1536-wide inputs of the default target; long: the MLP's down projection): bit n of
// zmm_rows[type][length] set = two 8-row groups a zmm (16 rows a vector, half the instructions of a ymm
// a row), clear = one group a ymm (EVEX vpdpbusd, 32 registers: tiles of 8 rows too). The two
// forms give the same bits (the same integer sums, the same float steps per lane); which is
// faster depends on the core: on one whose 512-bit units are full width (Zen 5) the zmm form
// wins from a few rows, on one that splits a zmm in two halves (Zen 4) the ymm form's single
// weight stream a thread wins up to ~4 rows (measured, kernels alone, default target's shapes,
// 2 threads: 3 rows 33.6-34.7 ms against 38.8-39.0, 4 rows 34.7-35.8 against 38.5-39.2; 6 rows
// 40.6-41.2 against 39.0-39.6). The default is what was measured on the Zen 5 (one row against
// short rows: 5.2 ms a ymm against 6.3-6.9 over pairs, Q6_K 151936 x 1536, one thread; Q6_K
// 1536 x 8960: pairs 0.30, one group 0.35); kernels.plan measures this CPU and sets its own.
namespace {
constexpr uint32_t DEFAULT_ZMM_SHORT = 0x1F8, DEFAULT_ZMM_LONG = 0x1FE;  // bits 3..8 / 1..8
// [Q4_K, Q6_K][short, long]
std::atomic<uint32_t> zmm_rows[2][2] = {{DEFAULT_ZMM_SHORT, DEFAULT_ZMM_LONG}, {DEFAULT_ZMM_SHORT, DEFAULT_ZMM_LONG}};
}  // namespace

uint32_t vnni_zmm_rows(int64_t kind, bool long_rows) { return zmm_rows[kind == 6][long_rows].load(); }

void set_vnni_zmm_rows(int64_t kind, uint32_t short_rows, uint32_t long_rows) {
    zmm_rows[kind == 6][0] = short_rows;
    zmm_rows[kind == 6][1] = long_rows;
}

void vnni_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                 const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    if (T > 8)
        // 9-16 rows in one pass of the zmm form, not two of 8: the second pass re-reads records
        // already in cache while the memory stream idles; in one pass the stream overlaps the
        // products (measured, Zen 5, whole forwards of the default target: 10 rows 43.6 -> 34.7
        // ms, 12 rows 50.8 -> 47.7, 16 rows 58.3 -> 56.0). Whatever the forms measured for 1-8 rows
        // say: two ymm passes of 9-10 rows took 51-55 ms against 34-35 (Zen 5).
        avx512::matmul<avx512::Zmm, 16>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    else if (zmm_rows[kind == 6][in / 256 >= 16].load() >> T & 1)
        avx512::matmul<avx512::Zmm, 8>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    else
        avx512::matmul<avx512::Ymm, 8>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
}

}  // namespace gguf
