// Issue rate of vpmaddubsw / vpaddw / vpmaddwd / vfmadd (8 independent chains). Build: g++ -O2 -mavx2 -mfma peak.cpp -o peak
#include <immintrin.h>
#include <chrono>
#include <cstdio>
int main(){
  __m256i a0=_mm256_set1_epi16(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
  __m256i c=_mm256_set1_epi8(5);
  long N=100000000;
  auto t0=std::chrono::steady_clock::now();
  for(long n=0;n<N;n++){
    __asm__ volatile(
      "vpmaddubsw %%ymm8, %0, %0\n vpmaddubsw %%ymm8, %1, %1\n vpmaddubsw %%ymm8, %2, %2\n vpmaddubsw %%ymm8, %3, %3\n"
      "vpmaddubsw %%ymm8, %4, %4\n vpmaddubsw %%ymm8, %5, %5\n vpmaddubsw %%ymm8, %6, %6\n vpmaddubsw %%ymm8, %7, %7\n"
      : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7) : : "ymm8");
  }
  auto t1=std::chrono::steady_clock::now();
  double s=std::chrono::duration<double>(t1-t0).count();
  printf("maddubs ymm: %.3f G/s\n", N*8/s/1e9);
  t0=std::chrono::steady_clock::now();
  for(long n=0;n<N;n++){
    __asm__ volatile(
      "vpaddw %%ymm8, %0, %0\n vpaddw %%ymm8, %1, %1\n vpaddw %%ymm8, %2, %2\n vpaddw %%ymm8, %3, %3\n"
      "vpaddw %%ymm8, %4, %4\n vpaddw %%ymm8, %5, %5\n vpaddw %%ymm8, %6, %6\n vpaddw %%ymm8, %7, %7\n"
      : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7) : : "ymm8");
  }
  t1=std::chrono::steady_clock::now(); s=std::chrono::duration<double>(t1-t0).count();
  printf("vpaddw ymm: %.3f G/s\n", N*8/s/1e9);
  t0=std::chrono::steady_clock::now();
  for(long n=0;n<N;n++){
    __asm__ volatile(
      "vpmaddwd %%ymm8, %0, %0\n vpmaddwd %%ymm8, %1, %1\n vpmaddwd %%ymm8, %2, %2\n vpmaddwd %%ymm8, %3, %3\n"
      "vpmaddwd %%ymm8, %4, %4\n vpmaddwd %%ymm8, %5, %5\n vpmaddwd %%ymm8, %6, %6\n vpmaddwd %%ymm8, %7, %7\n"
      : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7) : : "ymm8");
  }
  t1=std::chrono::steady_clock::now(); s=std::chrono::duration<double>(t1-t0).count();
  printf("vpmaddwd ymm: %.3f G/s\n", N*8/s/1e9);
  t0=std::chrono::steady_clock::now();
  for(long n=0;n<N;n++){
    __asm__ volatile(
      "vfmadd231ps %%ymm8, %%ymm8, %0\n vfmadd231ps %%ymm8, %%ymm8, %1\n vfmadd231ps %%ymm8, %%ymm8, %2\n vfmadd231ps %%ymm8, %%ymm8, %3\n"
      "vfmadd231ps %%ymm8, %%ymm8, %4\n vfmadd231ps %%ymm8, %%ymm8, %5\n vfmadd231ps %%ymm8, %%ymm8, %6\n vfmadd231ps %%ymm8, %%ymm8, %7\n"
      : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7) : : "ymm8");
  }
  t1=std::chrono::steady_clock::now(); s=std::chrono::duration<double>(t1-t0).count();
  printf("vfmadd ymm: %.3f G/s\n", N*8/s/1e9);
  int x=_mm256_extract_epi16(a0,0)+_mm256_extract_epi16(a7,0); printf("%d\n",x&1);
}
