// Issue rate of vpmaddubsw / vpaddw / vpmaddwd / vfmadd (8 independent chains). Build: g++ -O2 -mavx2 -mfma peak.cpp -o peak
#include <immintrin.h>
#include <chrono>
#include <cstdio>

// N rounds of OP on 8 independent registers (OP: the instruction and its source operands, AT&T order;
// each register is the other source and the destination), then the instructions per second
#define RATE(NAME, OP) \
  {                                                                                                          \
    auto t0 = std::chrono::steady_clock::now();                                                              \
    for (long n = 0; n < N; n++)                                                                             \
      __asm__ volatile(OP "%0, %0\n " OP "%1, %1\n " OP "%2, %2\n " OP "%3, %3\n " OP "%4, %4\n " OP "%5, %5\n " OP "%6, %6\n " OP "%7, %7\n" \
                       : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7)        \
                       :                                                                                     \
                       : "ymm8");                                                                            \
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();                 \
    printf(NAME ": %.3f G/s\n", N * 8 / s / 1e9);                                                            \
  }

int main() {
  __m256i a0 = _mm256_set1_epi16(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const long N = 100000000;
  RATE("maddubs ymm", "vpmaddubsw %%ymm8, ")
  RATE("vpaddw ymm", "vpaddw %%ymm8, ")
  RATE("vpmaddwd ymm", "vpmaddwd %%ymm8, ")
  RATE("vfmadd ymm", "vfmadd231ps %%ymm8, ")
  int x = _mm256_extract_epi16(a0, 0) + _mm256_extract_epi16(a7, 0);
  printf("%d\n", x & 1);
}
