// The AVX-512 VNNI Q4_K kernel at the rows a tree check has (1-8), and what its super-block close
// costs: the shipped q4k_rows<Zmm, NT> of specdraft/kernels/gguf_vnni_kernels.h against copies
// that change one thing each, over 6 super-blocks (the default target's 1536-wide products),
// records in L2, one core, variants interleaved, medians of 11 rounds, G zmm `vpdpbusd` a second.
// The close (once a row and super-block) is acc + sum * (d x) - (mins' sum) * (dmin x), the mins'
// int32 sum 4 `vpdpwssd` against x's sub-block pair sums. Variants (results of 1 and 2 wrong;
// only speed is read; 3-6 form the same bits as the shipped kernel):
//   1 d only      the close without the mins (no `vpdpwssd`, no mins' loads)
//   2 no close    one fma a row and super-block, x's scale taken once
//   3 acc in L1   the float accumulators kept in an L1 array, as q6k_rows does (8 registers free)
//   4 mins first  the mins' int32 sums formed at the super-block's start, kept in L1 as floats
//   5 pre-pass    every super-block's mins formed before the main loop, kept in L1 as floats
//   6 embedded    x's broadcast embedded in `vpdpbusd` ({1to16}) instead of its own load
//   7 x in regs   x from 4 registers (no broadcast loads; wrong results)
// Build and run (torch's headers for gguf_common.h):
//   g++ -O3 -std=c++17 -mavx2 -mfma -mf16c $(python -c "import torch.utils.cpp_extension as c; print(' '.join('-I'+p for p in c.include_paths()))") \
//       -Ispecdraft/kernels scripts/microbench/q4k_close.cpp -o q4k_close && taskset -c 1 ./q4k_close 40 200
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "gguf_common.h"
#define KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define YMM_DPBUSD _mm256_dpbusd_epi32
#define YMM_DPWSSD _mm256_dpwssd_epi32
namespace gguf { namespace avx512 {
#include "gguf_vnni_kernels.h"
#include "gguf_zmm.h"

enum Variant { D_ONLY = 1, NO_CLOSE, ACC_L1, MINS_FIRST, PRE_PASS, EMBEDDED, X_REGS };

// the mins' int32 sum of row r's super-block b (records r0, r1), as a float vector
template <class V>
KERNEL_TARGET typename V::F mins_sum(const typename V::I (&mn)[4], const int32_t* ms) {
    typename V::I m = V::zero();
    for (int k = 0; k < 4; ++k) m = V::dpwssd(m, mn[k], V::set1(ms[k]));
    return V::cvt(m);
}

template <class V>
KERNEL_TARGET void load_mins(const uint8_t* r0, const uint8_t* r1, typename V::I (&mn)[4]) {
    for (int k = 0; k < 4; ++k) mn[k] = V::u8to16(r0 + 1088 + 16 * k, r1 + 1088 + 16 * k);
}

template <class V, int NT, int VAR>
__attribute__((noinline)) KERNEL_TARGET void q4k_var(const uint8_t* w0, const uint8_t* w1, const int8_t* x0, int64_t xrow,
                                                     int64_t xblk, const float* xs, const int32_t* msum, int64_t nb,
                                                     int64_t t0, float* out, int64_t ldy, int valid) {
    using I = typename V::I;
    using F = typename V::F;
    constexpr int L = sizeof(F) / sizeof(float);
    const I low4 = V::bytes(0x0F);
    F acc[NT];
    alignas(64) float accm[NT][L];  // ACC_L1
    alignas(64) float mf[VAR == PRE_PASS ? 8 * NT : NT][L];  // MINS_FIRST: this super-block's; PRE_PASS: all (nb <= 8)
    for (int r = 0; r < NT; ++r) acc[r] = V::fzero(), V::fstore(accm[r], V::fzero());
    I xr[4];
    for (int k = 0; k < 4; ++k) xr[k] = V::bcast4(x0 + 4 * k);
    if (VAR == PRE_PASS)
        for (int64_t b = 0; b < nb; ++b) {
            I mn[4];
            load_mins<V>(w0 + b * Q4K_REC, w1 + b * Q4K_REC, mn);
            for (int r = 0; r < NT; ++r) V::fstore(mf[b * NT + r], mins_sum<V>(mn, msum + ((t0 + r) * nb + b) * 4));
        }
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *r0 = w0 + b * Q4K_REC, *r1 = w1 + b * Q4K_REC;
        const int64_t skip = stream_skip<NT, Q4K_REC>(b, nb, V::GROUPS - 1);
        const int8_t* xb = x0 + b * xblk;
        if (VAR == MINS_FIRST) {
            I mn[4];
            load_mins<V>(r0, r1, mn);
            for (int r = 0; r < NT; ++r) V::fstore(mf[r], mins_sum<V>(mn, msum + ((t0 + r) * nb + b) * 4));
        }
        I sum[NT];
        for (int r = 0; r < NT; ++r) sum[r] = V::zero();
        for (int s = 0; s < 8; ++s) {
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r0, s, skip);
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r1, s, skip);
            const I sc = V::u8to32(r0 + 1024 + 8 * s, r1 + 1024 + 8 * s);
            I dot[NT];
            for (int r = 0; r < NT; ++r) dot[r] = V::zero();
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                const I v = V::load32(r0 + 128 * s + 32 * c, r1 + 128 * s + 32 * c);
                const I lo = V::and_(v, low4), hi = V::and_(V::srli16(v, 4), low4);
                for (int r = 0; r < NT; ++r) {
                    const int8_t* x = xb + r * xrow + 32 * s + 8 * c;
                    if (VAR == X_REGS) {  // the asm barriers keep the compiler from folding the products
                        dot[r] = V::dpbusd(dot[r], lo, xr[(r + c) & 3]);
                        __asm__("" : "+v"(dot[r]));
                        dot[r] = V::dpbusd(dot[r], hi, xr[(r + c + 1) & 3]);
                        __asm__("" : "+v"(dot[r]));
                    } else if (VAR == EMBEDDED) {
                        __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(dot[r]) : "m"(*(const int32_t*)x), "v"(lo));
                        __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(dot[r]) : "m"(*(const int32_t*)(x + 4)), "v"(hi));
                    } else {
                        dot[r] = V::dpbusd(dot[r], lo, V::bcast4(x));
                        dot[r] = V::dpbusd(dot[r], hi, V::bcast4(x + 4));
                    }
                }
            }
            for (int r = 0; r < NT; ++r) sum[r] = V::add(sum[r], V::mullo(dot[r], sc));
        }
        if (VAR == NO_CLOSE) {
            for (int r = 0; r < NT; ++r) acc[r] = V::fmadd(V::cvt(sum[r]), V::fset1(xs[r]), acc[r]);
        } else if (VAR == D_ONLY) {
            const F d = V::load8f(r0 + 1152, r1 + 1152);
            for (int r = 0; r < NT; ++r)
                acc[r] = V::fmadd(V::cvt(sum[r]), V::mul(d, V::fset1(xs[(t0 + r) * nb + b])), acc[r]);
        } else if (VAR == MINS_FIRST || VAR == PRE_PASS) {
            const F d = V::load8f(r0 + 1152, r1 + 1152), dmin = V::load8f(r0 + 1184, r1 + 1184);
            for (int r = 0; r < NT; ++r) {
                const F x = V::fset1(xs[(t0 + r) * nb + b]);
                acc[r] = V::fmadd(V::cvt(sum[r]), V::mul(d, x), acc[r]);
                acc[r] = V::fnmadd(V::fload(mf[VAR == PRE_PASS ? b * NT + r : r]), V::mul(dmin, x), acc[r]);
            }
        } else {
            const Q4kClose<V> close(r0, r1);
            for (int r = 0; r < NT; ++r) {
                const int32_t* ms = msum + ((t0 + r) * nb + b) * 4;
                const float x = xs[(t0 + r) * nb + b];
                if (VAR == ACC_L1) V::fstore(accm[r], close(V::fload(accm[r]), sum[r], ms, x));
                else acc[r] = close(acc[r], sum[r], ms, x);
            }
        }
    }
    for (int r = 0; r < NT; ++r) V::store(out + (t0 + r) * ldy, valid, VAR == ACC_L1 ? V::fload(accm[r]) : acc[r]);
}
}}  // namespace gguf::avx512

using namespace gguf::avx512;
using Fn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, int64_t, int64_t, const float*, const int32_t*, int64_t,
                    int64_t, float*, int64_t, int);
constexpr int NV = 8;
#define ROW(N)                                                                                          \
    {N, {q4k_rows<Zmm, N>, q4k_var<Zmm, N, D_ONLY>, q4k_var<Zmm, N, NO_CLOSE>, q4k_var<Zmm, N, ACC_L1>,  \
         q4k_var<Zmm, N, MINS_FIRST>, q4k_var<Zmm, N, PRE_PASS>, q4k_var<Zmm, N, EMBEDDED>, q4k_var<Zmm, N, X_REGS>}}

int main(int argc, char** argv) {
    if (!__builtin_cpu_supports("avx512vnni")) return std::puts("this CPU has no AVX-512 VNNI"), 0;
    const int pairs = argc > 1 ? atoi(argv[1]) : 40, reps = argc > 2 ? atoi(argv[2]) : 200;
    const int64_t nb = 6, in = 1536;
    std::vector<uint8_t> w((size_t)pairs * 2 * nb * gguf::Q4K_REC);
    for (auto& c : w) c = rand();
    for (size_t g = 0; g < (size_t)pairs * 2 * nb; ++g) {  // finite scales
        const float d = 0.01f;
        std::memcpy(&w[g * gguf::Q4K_REC + 1152], &d, 4), std::memcpy(&w[g * gguf::Q4K_REC + 1184], &d, 4);
    }
    std::vector<int8_t> x(8 * in);
    for (auto& c : x) c = rand();
    std::vector<float> xs(8 * nb, 1.0f), out(8 * 16 * pairs);
    std::vector<int32_t> ms(8 * nb * 4);
    for (auto& v : xs) v = 0.5f + (float)(rand() % 1000) / 1000.0f;
    for (auto& v : ms) v = rand() & 0x0FFF0FFF;  // two i16 sub-block sums of x
    const char* names[NV] = {"shipped", "d only", "no close", "acc in L1", "mins first", "pre-pass", "embedded", "x in regs"};
    struct Cfg { int nt; Fn f[NV]; } cfg[] = {ROW(1), ROW(2), ROW(4), ROW(5), ROW(6), ROW(8)};
    const int R = 11;
    printf("rows");
    for (auto* n : names) printf("  %10s", n);
    printf("   (G zmm vpdpbusd/s, median of %d rounds)\n", R);
    for (auto& c : cfg) {
        std::vector<double> t[NV];
        for (int round = 0; round < R; ++round)
            for (int i = 0; i < NV; ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                for (int k = 0; k < reps; ++k)
                    for (int p = 0; p < pairs; ++p) {
                        const uint8_t* w0 = w.data() + (size_t)p * 2 * nb * gguf::Q4K_REC;
                        c.f[i](w0, w0 + nb * gguf::Q4K_REC, x.data(), in, 256, xs.data(), ms.data(), nb, 0,
                               out.data() + p * 16, 16 * pairs, 16);
                    }
                t[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
        const double dp = (double)reps * pairs * nb * 8 * 4 * 2 * c.nt;  // vpdpbusd a call: 8 sub-blocks x 4 chunks x 2 a row
        // the variants that keep the shipped kernel's bits: checked on the first pair, all lanes
        std::vector<float> ref(8 * 16), got(8 * 16);
        c.f[0](w.data(), w.data() + nb * gguf::Q4K_REC, x.data(), in, 256, xs.data(), ms.data(), nb, 0, ref.data(), 16, 16);
        bool same = true;
        for (int i = ACC_L1; i <= EMBEDDED; ++i) {
            c.f[i](w.data(), w.data() + nb * gguf::Q4K_REC, x.data(), in, 256, xs.data(), ms.data(), nb, 0, got.data(), 16, 16);
            same = same && std::memcmp(ref.data(), got.data(), c.nt * 16 * sizeof(float)) == 0;
        }
        printf("%4d", c.nt);
        for (int i = 0; i < NV; ++i) {
            std::sort(t[i].begin(), t[i].end());
            printf("  %10.2f", dp / t[i][R / 2] / 1e9);
        }
        printf("   %s\n", same ? "bits of 3-6 = shipped" : "BITS DIFFER");
    }
}
