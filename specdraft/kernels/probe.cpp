// How fast this core issues the vector instructions the AVX2 GGUF kernels are made of, now: a probe
// of the machine's phase. On shared virtual machines a neighbour on the same physical core takes a
// share of its vector units for minutes at a time (AVX2 EPYC: `vpaddw` 8.6-9.5 G/s when free, ~4
// while shared), so a benchmark records these rates as it runs, to say which phase its ratios met.
// The loops are scripts/microbench/peak.cpp's: 16 instructions a round on 14 independent registers
// named in the assembly (operands the compiler picks could tie the chains through one register).
#include "ops.h"

#include <immintrin.h>
#include <chrono>

namespace {

#define PROBE_OP(I, R) I " %%ymm15, %%ymm" #R ", %%ymm" #R "\n"
#define PROBE_ROUND(I)                                                                                              \
    PROBE_OP(I, 0) PROBE_OP(I, 1) PROBE_OP(I, 2) PROBE_OP(I, 3) PROBE_OP(I, 4) PROBE_OP(I, 5) PROBE_OP(I, 6)      \
    PROBE_OP(I, 7) PROBE_OP(I, 8) PROBE_OP(I, 9) PROBE_OP(I, 10) PROBE_OP(I, 11) PROBE_OP(I, 12) PROBE_OP(I, 13)   \
    PROBE_OP(I, 0) PROBE_OP(I, 1)
#define PROBE_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
                       "xmm11", "xmm12", "xmm13", "xmm15"

// instructions per second of `round` (16 instructions) run for about `seconds`, in batches of 4096 rounds
template <typename Round>
double rate(Round round, double seconds) {
    using clock = std::chrono::steady_clock;
    __asm__ volatile("vpxor %%ymm15, %%ymm15, %%ymm15" ::: "xmm15");
    const auto t0 = clock::now();
    long rounds = 0;
    double elapsed = 0.0;
    do {
        for (int i = 0; i < 4096; ++i) round();
        rounds += 4096;
        elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    } while (elapsed < seconds);
    return rounds * 16.0 / elapsed;
}

}  // namespace

std::vector<double> issue_rates(double seconds) {
    TORCH_CHECK(seconds > 0.0 && seconds <= 10.0, "issue_rates: seconds must be in (0, 10]");
    const double paddw = rate([] { __asm__ volatile(PROBE_ROUND("vpaddw")::: PROBE_CLOBBERS); }, seconds / 2);
    const double maddubs = rate([] { __asm__ volatile(PROBE_ROUND("vpmaddubsw")::: PROBE_CLOBBERS); }, seconds / 2);
    _mm256_zeroupper();
    return {paddw, maddubs};
}
