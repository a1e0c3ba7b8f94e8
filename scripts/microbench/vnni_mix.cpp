// What issues beside vpdpbusd: rounds of 8 independent vpdpbusd chains with the VNNI Q4_K kernel's
// other instructions mixed in (x's broadcasts from memory, the scale's vpmulld, vpmaddwd, vpandd,
// embedded broadcasts, ymm forms), one core, G vpdpbusd a second (a ymm one does half a zmm's work).
// Build: g++ -O2 -mavx512f -mavx512vnni -mavx512vl vnni_mix.cpp -o vnni_mix && taskset -c 1 ./vnni_mix
#include <chrono>
#include <cstdio>
#include <cstdint>
alignas(64) static int32_t buf[64];
#define T(name, body) { auto t0 = std::chrono::steady_clock::now(); long n = 20000000; \
  for (long i = 0; i < n; ++i) { __asm__ volatile(body :: "r"(buf) : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","memory"); } \
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); printf("%-40s %.3f G dpbusd/s\n", name, n * 8.0 / s / 1e9); }
#define D(a, b) "vpdpbusd %%zmm" #b ", %%zmm20, %%zmm" #a "\n"
#define DY(a, b) "vpdpbusd %%ymm" #b ", %%ymm20, %%ymm" #a "\n"
#define B(r, off) "vpbroadcastd " #off "(%0), %%zmm" #r "\n"
#define BY(r, off) "vpbroadcastd " #off "(%0), %%ymm" #r "\n"
#define E(a, off) "vpdpbusd " #off "(%0)%{1to16%}, %%zmm20, %%zmm" #a "\n"
#define M(a) "vpmulld %%zmm20, %%zmm" #a ", %%zmm" #a "\n"
#define A(a) "vpaddd %%zmm20, %%zmm" #a ", %%zmm" #a "\n"
#define U(a) "vpandd %%zmm20, %%zmm" #a ", %%zmm" #a "\n"
#define ML(a) "vpmaddwd %%zmm20, %%zmm" #a ", %%zmm" #a "\n"
int main() {
  T("8 dpbusd + 8 bcast + 1 vpmulld", B(16,0) D(0,16) B(17,4) D(1,17) B(18,8) D(2,18) B(19,12) D(3,19) B(21,16) D(4,21) B(22,20) D(5,22) B(23,24) D(6,23) B(16,28) D(7,16) M(8))
  T("8 dpbusd + 8 bcast + 1 vpmulld + 1 add", B(16,0) D(0,16) B(17,4) D(1,17) B(18,8) D(2,18) B(19,12) D(3,19) B(21,16) D(4,21) B(22,20) D(5,22) B(23,24) D(6,23) B(16,28) D(7,16) M(8) A(9))
  T("8 dpbusd + 1 vpmulld", D(0,16) D(1,16) D(2,16) D(3,16) D(4,16) D(5,16) D(6,16) D(7,16) M(8))
  T("8 dpbusd + 2 vpmulld", D(0,16) D(1,16) D(2,16) D(3,16) D(4,16) D(5,16) D(6,16) D(7,16) M(8) M(9))
  T("8 dpbusd + 1 vpmaddwd", D(0,16) D(1,16) D(2,16) D(3,16) D(4,16) D(5,16) D(6,16) D(7,16) ML(8))
  T("8 dpbusd + 2 vpandd", D(0,16) D(1,16) D(2,16) D(3,16) D(4,16) D(5,16) D(6,16) D(7,16) U(8) U(9))
  T("8 zmm dpbusd, 8 chains", D(0,16) D(1,16) D(2,16) D(3,16) D(4,16) D(5,16) D(6,16) D(7,16))
  T("8 zmm dpbusd + 8 zmm bcast m32", B(16,0) D(0,16) B(17,4) D(1,17) B(18,8) D(2,18) B(19,12) D(3,19) B(21,16) D(4,21) B(22,20) D(5,22) B(23,24) D(6,23) B(16,28) D(7,16))
  T("8 zmm dpbusd + 4 zmm bcast m32", B(16,0) D(0,16) D(1,16) B(17,4) D(2,17) D(3,17) B(18,8) D(4,18) D(5,18) B(19,12) D(6,19) D(7,19))
  T("8 zmm dpbusd embedded {1to16}", E(0,0) E(1,4) E(2,8) E(3,12) E(4,16) E(5,20) E(6,24) E(7,28))
  T("8 ymm dpbusd (x0.5 of zmm work)", DY(0,16) DY(1,16) DY(2,16) DY(3,16) DY(4,16) DY(5,16) DY(6,16) DY(7,16))
  T("8 ymm dpbusd + 8 ymm bcast m32", BY(16,0) DY(0,16) BY(17,4) DY(1,17) BY(18,8) DY(2,18) BY(19,12) DY(3,19) BY(21,16) DY(4,21) BY(22,20) DY(5,22) BY(23,24) DY(6,23) BY(16,28) DY(7,16))
}
