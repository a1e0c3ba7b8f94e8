// Streaming read bandwidth over 1 GB. Build: g++ -O2 -mavx2 -fopenmp bw.cpp -o bw && OMP_NUM_THREADS=2 ./bw
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <omp.h>
int main(){
  size_t n = (size_t)1 << 30; // 1 GB
  char* a = (char*)aligned_alloc(64, n);
  #pragma omp parallel for
  for (size_t i = 0; i < n; i += 4096) for (size_t j = 0; j < 4096; j++) a[i + j] = (char)j;
  for (int rep = 0; rep < 5; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    __m256i tot = _mm256_setzero_si256();
    #pragma omp parallel
    {
      __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
      #pragma omp for
      for (size_t i = 0; i < n; i += 128) {
        s0 = _mm256_add_epi8(s0, _mm256_load_si256((__m256i*)(a + i)));
        s1 = _mm256_add_epi8(s1, _mm256_load_si256((__m256i*)(a + i + 32)));
        s2 = _mm256_add_epi8(s2, _mm256_load_si256((__m256i*)(a + i + 64)));
        s3 = _mm256_add_epi8(s3, _mm256_load_si256((__m256i*)(a + i + 96)));
      }
      #pragma omp critical
      tot = _mm256_add_epi8(tot, _mm256_add_epi8(_mm256_add_epi8(s0, s1), _mm256_add_epi8(s2, s3)));
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%.1f GB/s (%d)\n", n / s / 1e9, _mm256_extract_epi8(tot, 0) & 1);
  }
}
