// vpdpbusd issue rate on zmm and ymm (12 independent chains). Build: g++ -O2 -mavx512f -mavx512vnni -mavx512vl vnni.cpp -o vnni
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#define RATE(NAME, OP, REG) { auto t0 = std::chrono::steady_clock::now(); \
  for (long n = 0; n < N; n++) __asm__ volatile( \
   OP " %%" REG "20, %%" REG "21, %%" REG "0\n " OP " %%" REG "20, %%" REG "21, %%" REG "1\n " OP " %%" REG "20, %%" REG "21, %%" REG "2\n " OP " %%" REG "20, %%" REG "21, %%" REG "3\n " \
   OP " %%" REG "20, %%" REG "21, %%" REG "4\n " OP " %%" REG "20, %%" REG "21, %%" REG "5\n " OP " %%" REG "20, %%" REG "21, %%" REG "6\n " OP " %%" REG "20, %%" REG "21, %%" REG "7\n " \
   OP " %%" REG "20, %%" REG "21, %%" REG "8\n " OP " %%" REG "20, %%" REG "21, %%" REG "9\n " OP " %%" REG "20, %%" REG "21, %%" REG "10\n " OP " %%" REG "20, %%" REG "21, %%" REG "11\n" \
   ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11"); \
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); \
  printf(NAME ": %.3f G/s\n", N * 12 / s / 1e9); }
int main(){ const long N = 100000000;
 RATE("vpdpbusd zmm", "vpdpbusd", "zmm")
 RATE("vpdpbusd ymm", "vpdpbusd", "ymm")
 RATE("vpdpbusd zmm", "vpdpbusd", "zmm")
 RATE("vpdpbusd ymm", "vpdpbusd", "ymm")
}
