// The Q4_K / Q6_K kernels for CPUs with AVX-512 VNNI (Ice Lake, Zen 4 and later): the kernels of
// gguf_vnni_kernels.h over two 8-row groups a zmm (16 rows: half the instructions a row of the
// ymm form) and, for blocks of few rows, one group a ymm (EVEX vpdpbusd): one weight stream a
// thread, as the AVX2 kernels read it (measured below). Built in every build with target
// attributes (the rest of the extension is AVX2), called only where the CPU has the ISA.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "gguf_common.h"
#include "gguf_forms.h"

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

// Which form a block of 1..8 rows takes (a block of more rows always takes the zmm form, 9-16 rows
// in one pass, see vnni_matmul): by default chosen per product and rows by timing (gguf_forms.h);
// else fixed per weight type, per rows and per row length (short: < 16 super-blocks, the
// 1536-wide inputs of the default target; long: the MLP's down projection): bit n of
// zmm_rows[type][length] set = two 8-row groups a zmm (16 rows a vector, half the instructions of
// a ymm a row), clear = one group a ymm (EVEX vpdpbusd, 32 registers: tiles of 8 rows too). The
// two forms give the same bits (the same integer sums, the same float steps per lane). On a core
// whose 512-bit units are full width (Zen 5) the zmm form wins from a few rows while memory is
// fast; on one that splits a zmm in two halves (Zen 4) the ymm form's single weight stream a
// thread wins up to ~4 rows (measured, kernels alone, default target's shapes, 2 threads: 3 rows
// 33.6-34.7 ms against 38.8-39.0, 4 rows 34.7-35.8 against 38.5-39.2; 6 rows 40.6-41.2 against
// 39.0-39.6). The fixed default is the Zen 5's fast-memory choice (one row against short rows:
// 5.2 ms a ymm against 6.3-6.9 over pairs, Q6_K 151936 x 1536, one thread; Q6_K 1536 x 8960:
// pairs 0.30, one group 0.35).
namespace {
constexpr uint32_t DEFAULT_ZMM_SHORT = 0x1F8, DEFAULT_ZMM_LONG = 0x1FE;  // bits 3..8 / 1..8
// [Q4_K, Q6_K][short, long]
std::atomic<uint32_t> zmm_rows[2][2] = {{DEFAULT_ZMM_SHORT, DEFAULT_ZMM_LONG}, {DEFAULT_ZMM_SHORT, DEFAULT_ZMM_LONG}};
std::atomic<bool> timed_forms{true};
FormChooser& chooser() {
    static FormChooser c;
    return c;
}
}  // namespace

uint32_t vnni_zmm_rows(int64_t kind, bool long_rows) { return zmm_rows[kind == 6][long_rows].load(); }

void set_vnni_zmm_rows(int64_t kind, uint32_t short_rows, uint32_t long_rows) {
    zmm_rows[kind == 6][0] = short_rows;
    zmm_rows[kind == 6][1] = long_rows;
}

bool vnni_forms_timed() { return timed_forms.load(); }

void set_vnni_forms_timed(bool on) { timed_forms = on; }

std::vector<std::array<double, 5>> vnni_form_stats() { return chooser().stats(); }

void clear_vnni_form_stats() { chooser().clear(); }

std::vector<int> simulate_form_choice(const std::vector<double>& ymm_ns, const std::vector<double>& zmm_ns, int fixed) {
    FormChooser c;
    std::vector<int> picks;
    for (size_t i = 0; i < ymm_ns.size() && i < zmm_ns.size(); ++i) {
        const int f = c.pick(1, fixed);
        c.record(1, f, f ? zmm_ns[i] : ymm_ns[i]);
        picks.push_back(f);
    }
    return picks;
}

void vnni_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                 const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    if (T > 8) {
        // 9-16 rows in one pass of the zmm form, not two of 8: the second pass re-reads records
        // already in cache while the memory stream idles; in one pass the stream overlaps the
        // products (measured, Zen 5, whole forwards of the default target: 10 rows 43.6 -> 34.7
        // ms, 12 rows 50.8 -> 47.7, 16 rows 58.3 -> 56.0). Two ymm passes of 9-10 rows took 51-55
        // ms against 34-35 (Zen 5).
        avx512::matmul<avx512::Zmm, 16>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
        return;
    }
    const int fixed = zmm_rows[kind == 6][in / 256 >= 16].load() >> T & 1;
    const bool timed = timed_forms.load();
    const uint64_t key = form_key(kind, in, O, T);
    const int form = timed ? chooser().pick(key, fixed) : fixed;
    const auto t0 = std::chrono::steady_clock::now();
    if (form)
        avx512::matmul<avx512::Zmm, 8>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    else
        avx512::matmul<avx512::Ymm, 8>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    if (timed)
        chooser().record(key, form, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace gguf
