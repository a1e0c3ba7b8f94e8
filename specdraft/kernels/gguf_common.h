// What the GGUF matrix kernels of every ISA share: the record layout's sizes (documented in
// gguf_matmul.cpp), prefetching of the weight stream, and the cut of a block of rows into tiles.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace gguf {

constexpr int Q4K_REC = 1216, Q6K_REC = 1728;  // bytes per super-block record of 8 output rows
constexpr int GROUP = 8;  // output rows per record
constexpr int PREFETCH = 2;  // records ahead in the weight stream (AVX2 kernels)
// records ahead in the VNNI and AMX kernels' weight streams: 4 for passes of up to 8 rows (whole
// forwards, Zen 5: 1-11% faster at 2-8 rows than 2 ahead, the most where memory is fastest), 2
// for passes of 9-16 (their products take long enough; 4 ahead measured 0.96-1.00 there)
template <int NT>
constexpr int VNNI_PREFETCH = NT <= 8 ? 4 : 2;
constexpr int AMX_MIN_ROWS = 12;  // rows of x from which the AMX path takes tiles (fewer: AVX-512 VNNI)

// Step s of a record's STEPS (its sub-blocks) prefetches the matching 1 / STEPS of the record
// AHEAD records ahead: spread over the record, not one burst at its start (measured, Q6_K
// 1536 x 8960, one row: 1.3 -> 0.7 ms; hardware prefetching alone: 1.8 ms). skip: bytes to jump
// where the stream does not go on with the next group's records (two groups read side by side).
template <int REC, int STEPS, int AHEAD = PREFETCH>
inline void prefetch_ahead(const uint8_t* rec, int s, int64_t skip = 0) {
    constexpr int span = (REC + STEPS - 1) / STEPS;
    const uint8_t* p = rec + AHEAD * REC + skip + span * s;
    for (int o = 0; o < span + 63; o += 64) _mm_prefetch((const char*)(p + o), _MM_HINT_T0);
}

// prefetch_ahead's skip at super-block b of nb, for a pass of NT rows over groups read side by
// side: none while the records AHEAD are still the group's own, else past its end, where the
// stream goes on in the next side-by-side set (after the `beside` groups read with this one)
template <int NT, int REC>
inline int64_t stream_skip(int64_t b, int64_t nb, int64_t beside) {
    return b + VNNI_PREFETCH<NT> < nb ? 0 : beside * nb * REC;
}

// f(std::integral_constant<int, n>{}, t0) for a tile of n (1 .. TILE) rows starting at t0
template <int TILE, typename F>
inline void tile_call(int64_t n, int64_t t0, F& f) {
    if constexpr (TILE > 1) {
        if (n < TILE) return tile_call<TILE - 1>(n, t0, f);
    }
    f(std::integral_constant<int, TILE>{}, t0);
}

// Calls f over ceil(T / TILE) tiles of balanced sizes (T = 6, TILE 4: 3 + 3, not 4 + 2: a pass
// over the weights costs its decoding whatever the tile's size, so even tiles share it best). A
// row's result never depends on its tile: every row of a tile takes the same steps.
template <int TILE, typename F>
inline void over_tiles(int64_t T, F&& f) {
    const int64_t passes = (T + TILE - 1) / TILE, base = T / (passes > 0 ? passes : 1), extra = T % (passes > 0 ? passes : 1);
    int64_t t0 = 0;
    for (int64_t p = 0; p < passes; ++p) {
        const int64_t n = base + (p < extra);
        tile_call<TILE>(n, t0, f);
        t0 += n;
    }
}

// body(first, last) over [0, n) split across the threads: each thread first runs its own
// contiguous share of STATIC_SHARE of the range (one sequential stream, as the prefetchers like),
// then takes chunks of the rest from a shared counter as it frees up. On shared VMs one vCPU
// runs slower than the other for seconds at a time (AVX2 EPYC, `python scripts/core_phases.py`:
// the two cores' `vpaddw` rates, probed together every second, 16-17% apart on average), and with
// fixed halves every product waits for the slower one. Which thread runs an index changes no bit
// of its result. Measured (benchmarks/kernel-ab-zen3-balanced.txt, against fixed halves, 2
// threads): whole forwards 1.05 / 1.05 / 1.10 / 1.08x faster at 2 / 4 / 8 / 32 rows.
constexpr double STATIC_SHARE = 0.75;
template <typename Body>
inline void balanced_for(int64_t n, int64_t grain, Body&& body) {
    const int64_t threads = at::get_num_threads();
    if (threads < 2 || at::in_parallel_region() || n < 4 * threads * grain) {
        at::parallel_for(0, n, grain, body);
        return;
    }
    const int64_t share = (int64_t)(n * STATIC_SHARE) / threads;
    const int64_t chunk = std::max<int64_t>(grain, (n - share * threads) / (8 * threads));
    std::atomic<int64_t> next{share * threads};
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) body(t * share, (t + 1) * share);
        for (int64_t g; (g = next.fetch_add(chunk)) < n;) body(g, std::min(n, g + chunk));
    });
}

// The VNNI and AMX kernels (gguf_vnni.cpp: AVX-512, gguf_avxvnni.cpp: AVX-VNNI, gguf_amx.cpp: AMX-INT8), present in every build,
// each to be called only where its cpu_has_ says so. y[t, 0 .. O) (row stride ldy) for T rows of
// quantized x against kind 4 (Q4_K) or 6 (Q6_K) records pw [groups, in / 256 * REC]; bit for bit
// what the AVX2 kernels give.
bool cpu_has_avx512_vnni();
void vnni_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                 const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy);
// the AVX-512 VNNI kernels' form per rows a pass (bit n set: n rows take the zmm form; see gguf_vnni.cpp),
// for weights of kind 4 / 6 with short (< 16 super-blocks) and long rows
uint32_t vnni_zmm_rows(int64_t kind, bool long_rows);
void set_vnni_zmm_rows(int64_t kind, uint32_t short_rows, uint32_t long_rows);
// whether the form of 1..8 rows is chosen per product by timing (gguf_forms.h; the default) or by
// the masks above; what the timing saw ([key, timed ymm, timed zmm, mean ns ymm, mean ns zmm] per
// product, gguf_forms.h's form_key), forgotten by clear; the chooser's picks for a sequence of
// made-up times (tests)
bool vnni_forms_timed();
void set_vnni_forms_timed(bool on);
std::vector<std::array<double, 5>> vnni_form_stats();
void clear_vnni_form_stats();
std::vector<int> simulate_form_choice(const std::vector<double>& ymm_ns, const std::vector<double>& zmm_ns, int fixed);
bool cpu_has_avx_vnni();
void avxvnni_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                    const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy);
bool cpu_has_amx_int8();
// the AMX kernel with its tile registers emulated in plain code (tests of its logic on a CPU with
// AVX-512 VNNI and no AMX; slow): while on, the amx-int8 path runs it, on any AVX-512 VNNI CPU
bool amx_emulated();
void set_amx_emulated(bool on);
// rows of x from which the amx-int8 path takes the tiles (fewer: AVX-512 VNNI); n <= 0: the default
int64_t amx_min_rows();
void set_amx_min_rows(int64_t n);
void amx_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy);

}  // namespace gguf
