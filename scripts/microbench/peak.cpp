// Issue rates of the AVX2 instructions the GGUF kernels are made of, on one core. Build and run:
//   g++ -O2 -mavx2 -mfma peak.cpp -o peak && ./peak
// Each loop runs 16 instructions a round on 14 registers named in the assembly (independent
// chains, as many as the longest latency times the widest issue needs; operands the compiler
// picks could tie the chains through one register, as an earlier version of this file did,
// which halved vpmaddubsw's rate), then prints instructions per second. The mixed loops show
// which instructions share pipes: on Zen 3, vpmaddubsw and vpmaddwd issue on two pipes that
// vpaddw may also take, so a kernel's 16-bit adds slow its multiplies; on Zen 1, vfmadd231ps
// issues beside vpmaddubsw at its own full rate (dual_pipe.cpp tries to use that).
#include <chrono>
#include <cstdio>

#define OP(I, R) I " %%ymm15, %%ymm" #R ", %%ymm" #R "\n"
#define ROUND(A, B) \
    OP(A, 0) OP(B, 1) OP(A, 2) OP(B, 3) OP(A, 4) OP(B, 5) OP(A, 6) OP(B, 7) OP(A, 8) OP(B, 9) OP(A, 10) OP(B, 11) OP(A, 12) OP(B, 13) OP(A, 0) OP(B, 1)
#define RATE(NAME, A, B)                                                                                   \
    {                                                                                                      \
        auto t0 = std::chrono::steady_clock::now();                                                        \
        for (long n = 0; n < N; n++)                                                                       \
            __asm__ volatile(ROUND(A, B)::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", \
                             "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13");                          \
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();           \
        printf(NAME ": %.3f G/s\n", N * 16 / s / 1e9);                                                     \
    }

int main() {
    const long N = 50000000;
    __asm__ volatile("vpxor %%ymm15, %%ymm15, %%ymm15" ::: "xmm15");
    RATE("maddubs ymm", "vpmaddubsw", "vpmaddubsw")
    RATE("vpaddw ymm", "vpaddw", "vpaddw")
    RATE("vpmaddwd ymm", "vpmaddwd", "vpmaddwd")
    RATE("vfmadd ymm", "vfmadd231ps", "vfmadd231ps")
    RATE("maddubs + vpmaddwd", "vpmaddubsw", "vpmaddwd")
    RATE("maddubs + vpaddw", "vpmaddubsw", "vpaddw")
    RATE("maddubs + vfmadd", "vpmaddubsw", "vfmadd231ps")
}
