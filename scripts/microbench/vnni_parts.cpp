// Where the AVX-512 VNNI Q4_K kernel's time goes (its zmm form, two 8-row groups a vector): the
// shipped q4k_rows<Zmm, 8 / 16> of specdraft/kernels/gguf_vnni_kernels.h against a copy with one
// part left out each (results wrong; only speed is read), and against "wide" forms that feed each
// broadcast of x to W weight vectors (2W groups), all over 16 rows of x and 6 super-blocks (the
// default target's 1536-wide products), records in L2, one core, variants interleaved, medians
// of 15 rounds. Bits of a variant: 1 no vpmulld (scale), 2 no closing float step, 4 no unpack,
// 8 x from registers (no broadcast loads), 16 no prefetch, 32 the broadcast embedded in vpdpbusd.
// Build and run (torch's headers for gguf_common.h):
//   g++ -O3 -std=c++17 -mavx2 -mfma $(python -c "import torch.utils.cpp_extension as c; print(' '.join('-I'+p for p in c.include_paths()))") \
//       -Ispecdraft/kernels scripts/microbench/vnni_parts.cpp -o vnni_parts && taskset -c 1 ./vnni_parts 40 60
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include "gguf_common.h"
#define KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define YMM_DPBUSD _mm256_dpbusd_epi32
#define YMM_DPWSSD _mm256_dpwssd_epi32
namespace gguf { namespace avx512 {
#include "gguf_vnni_kernels.h"
#include "gguf_zmm.h"

// variant copy of q4k_rows: bits: 1 no mullo, 2 no close, 4 no unpack, 8 x from registers (no bcast loads), 16 no prefetch
template <class V, int NT, int BITS>
__attribute__((noinline)) KERNEL_TARGET void q4k_var(const uint8_t* w0, const uint8_t* w1, const int8_t* x0, int64_t xrow, int64_t xblk,
                            const float* xs, const int32_t* msum, int64_t nb, int64_t t0, float* out, int64_t ldy, int valid) {
    using I = typename V::I; using F = typename V::F;
    const I low4 = V::bytes(0x0F);
    F acc[NT];
    for (int r = 0; r < NT; ++r) acc[r] = V::fzero();
    I xr[4]; for (int k = 0; k < 4; ++k) xr[k] = V::bcast4(x0 + 4 * k);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *r0 = w0 + b * Q4K_REC, *r1 = w1 + b * Q4K_REC;
        const int64_t skip = stream_skip<NT, Q4K_REC>(b, nb, V::GROUPS - 1);
        const int8_t* xb = x0 + b * xblk;
        I sum[NT];
        for (int r = 0; r < NT; ++r) sum[r] = V::zero();
        for (int s = 0; s < 8; ++s) {
            if (!(BITS & 16)) { prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r0, s, skip);
            if (V::GROUPS == 2) prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r1, s, skip); }
            const I sc = V::u8to32(r0 + 1024 + 8 * s, r1 + 1024 + 8 * s);
            I dot[NT];
            for (int r = 0; r < NT; ++r) dot[r] = V::zero();
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                const I v = V::load32(r0 + 128 * s + 32 * c, r1 + 128 * s + 32 * c);
                I lo, hi;
                if (BITS & 4) { lo = v; hi = v; } else { lo = V::and_(v, low4); hi = V::and_(V::srli16(v, 4), low4); }
                for (int r = 0; r < NT; ++r) {
                    const int8_t* x = xb + r * xrow + 32 * s + 8 * c;
                    if (BITS & 8) { dot[r] = V::dpbusd(dot[r], lo, xr[(r + c) & 3]); __asm__("" : "+v"(dot[r])); dot[r] = V::dpbusd(dot[r], hi, xr[(r + c + 1) & 3]); __asm__("" : "+v"(dot[r])); }
                    else if (BITS & 32) {
                        __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(dot[r]) : "m"(*(const int32_t*)x), "v"(lo));
                        __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(dot[r]) : "m"(*(const int32_t*)(x + 4)), "v"(hi));
                    }
                    else { dot[r] = V::dpbusd(dot[r], lo, V::bcast4(x)); dot[r] = V::dpbusd(dot[r], hi, V::bcast4(x + 4)); }
                }
            }
            for (int r = 0; r < NT; ++r) sum[r] = (BITS & 1) ? V::add(sum[r], dot[r]) : V::add(sum[r], V::mullo(dot[r], sc));
        }
        if (BITS & 2) { for (int r = 0; r < NT; ++r) acc[r] = V::fmadd(V::cvt(sum[r]), V::fset1(xs[r]), acc[r]); }
        else { const Q4kClose<V> close(r0, r1);
        for (int r = 0; r < NT; ++r) acc[r] = close(acc[r], sum[r], msum + ((t0 + r) * nb + b) * 4, xs[(t0 + r) * nb + b]); }
    }
    for (int r = 0; r < NT; ++r) V::store(out + (t0 + r) * ldy, valid, acc[r]);
}

// W zmm weight vectors a broadcast (2W groups, 16W output rows), NT rows of x; acc in L1
template <int NT, int W>
__attribute__((noinline)) KERNEL_TARGET void q4k_wide(const uint8_t* const* wp, const int8_t* x0, int64_t xrow,
                            const float* xs, const int32_t* msum, int64_t nb, float* out, int64_t ldy) {
    using V = Zmm; using I = V::I; using F = V::F;
    const I low4 = V::bytes(0x0F);
    alignas(64) float acc[NT][W][16];
    for (int r = 0; r < NT; ++r) for (int w = 0; w < W; ++w) V::fstore(acc[r][w], V::fzero());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rr[2 * W];
        for (int k = 0; k < 2 * W; ++k) rr[k] = wp[k] + b * Q4K_REC;
        const int8_t* xb = x0 + b * 256;
        I sum[NT][W];
        for (int r = 0; r < NT; ++r) for (int w = 0; w < W; ++w) sum[r][w] = V::zero();
        for (int s = 0; s < 8; ++s) {
            for (int k = 0; k < 2 * W; ++k) prefetch_ahead<Q4K_REC, 8, 4>(rr[k], s, 0);
            I sc[W];
            for (int w = 0; w < W; ++w) sc[w] = V::u8to32(rr[2 * w] + 1024 + 8 * s, rr[2 * w + 1] + 1024 + 8 * s);
            I dot[NT][W];
            for (int r = 0; r < NT; ++r) for (int w = 0; w < W; ++w) dot[r][w] = V::zero();
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                I lo[W], hi[W];
                for (int w = 0; w < W; ++w) {
                    const I v = V::load32(rr[2 * w] + 128 * s + 32 * c, rr[2 * w + 1] + 128 * s + 32 * c);
                    lo[w] = V::and_(v, low4); hi[w] = V::and_(V::srli16(v, 4), low4);
                }
                for (int r = 0; r < NT; ++r) {
                    const int8_t* x = xb + r * xrow + 32 * s + 8 * c;
                    const I xa = V::bcast4(x), xb4 = V::bcast4(x + 4);
                    for (int w = 0; w < W; ++w) { dot[r][w] = V::dpbusd(dot[r][w], lo[w], xa); dot[r][w] = V::dpbusd(dot[r][w], hi[w], xb4); }
                }
            }
            for (int r = 0; r < NT; ++r) for (int w = 0; w < W; ++w) sum[r][w] = V::add(sum[r][w], V::mullo(dot[r][w], sc[w]));
        }
        for (int w = 0; w < W; ++w) {
            const Q4kClose<V> close(rr[2 * w], rr[2 * w + 1]);
            for (int r = 0; r < NT; ++r)
                V::fstore(acc[r][w], close(V::fload(acc[r][w]), sum[r][w], msum + (r * nb + b) * 4, xs[r * nb + b]));
        }
    }
    for (int r = 0; r < NT; ++r) for (int w = 0; w < W; ++w) V::store(out + r * ldy + 16 * w, 16, V::fload(acc[r][w]));
}
}}
using namespace gguf::avx512;
using Fn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, int64_t, int64_t, const float*, const int32_t*, int64_t, int64_t, float*, int64_t, int);

int main(int argc, char** argv) {
    const int pairs = argc > 1 ? atoi(argv[1]) : 40, reps = argc > 2 ? atoi(argv[2]) : 200;
    const int64_t nb = 6, in = 1536;
    std::vector<uint8_t> w((size_t)pairs * 2 * nb * gguf::Q4K_REC);
    for (auto& c : w) c = rand();
    for (size_t g = 0; g < (size_t)pairs * 2 * nb; ++g) { float d = 0.01f; std::memcpy(&w[g * gguf::Q4K_REC + 1152], &d, 4); }
    std::vector<int8_t> x(16 * in); for (auto& c : x) c = rand();
    std::vector<float> xs(16 * nb, 1.0f); std::vector<int32_t> ms(16 * nb * 4, 1);
    std::vector<float> out(16 * 16 * pairs);
    struct V { const char* name; Fn f8, f16; } vs[] = {
        {"shipped", q4k_rows<Zmm, 8>, q4k_rows<Zmm, 16>},
        {"copy", q4k_var<Zmm, 8, 0>, q4k_var<Zmm, 16, 0>},
        {"no mullo", q4k_var<Zmm, 8, 1>, q4k_var<Zmm, 16, 1>},
        {"no close", q4k_var<Zmm, 8, 2>, q4k_var<Zmm, 16, 2>},
        {"no unpack", q4k_var<Zmm, 8, 4>, q4k_var<Zmm, 16, 4>},
        {"x in regs", q4k_var<Zmm, 8, 8>, q4k_var<Zmm, 16, 8>},
        {"no prefetch", q4k_var<Zmm, 8, 16>, q4k_var<Zmm, 16, 16>},
        {"embedded bcast", q4k_var<Zmm, 8, 32>, q4k_var<Zmm, 16, 32>},
        {"emb+no close", q4k_var<Zmm, 8, 34>, q4k_var<Zmm, 16, 34>},
        {"emb+no mullo", q4k_var<Zmm, 8, 33>, q4k_var<Zmm, 16, 33>},
    };
    const int R = 15, NV = sizeof(vs) / sizeof(vs[0]);
    std::vector<double> t[2][32];
    for (int round = 0; round < R; ++round)
    for (int i = 0; i < NV; ++i) for (int k = 0; k < 2; ++k) {
        const int nt = k ? 16 : 8;
        Fn f = nt == 8 ? vs[i].f8 : vs[i].f16;
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r)
            for (int p = 0; p < pairs; ++p) {
                const uint8_t* w0 = w.data() + (size_t)p * 2 * nb * gguf::Q4K_REC;
                for (int tt = 0; tt < 16; tt += nt) f(w0, w0 + nb * gguf::Q4K_REC, x.data() + tt * in, in, 256, xs.data(), ms.data(), nb, 0, out.data() + p * 16, 16 * pairs, 16);
            }
        t[k][i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double dp = (double)reps * pairs * nb * 8 * 4 * 2 * 16;
    for (int i = 0; i < NV; ++i) {
        printf("%-16s", vs[i].name);
        for (int k = 0; k < 2; ++k) { auto v = t[k][i]; std::sort(v.begin(), v.end()); printf("  NT=%2d %.2f", k ? 16 : 8, dp / v[R / 2] / 1e9); }
        printf("  G vpdpbusd/s (median of %d)\n", R);
    }

    // wide: groups of 2W pairs per call, 16 rows of x in tiles of NT
    auto wide = [&](const char* name, auto fn, int W, int NT) {
        std::vector<double> ts;
        for (int round = 0; round < R; ++round) {
            auto t0 = std::chrono::steady_clock::now();
            for (int r = 0; r < reps; ++r)
                for (int p = 0; p + W <= pairs; p += W) {
                    const uint8_t* wp[8];
                    for (int k = 0; k < 2 * W; ++k) wp[k] = w.data() + ((size_t)p * 2 + k) * nb * gguf::Q4K_REC;
                    for (int tt = 0; tt + NT <= 16; tt += NT) fn(wp, x.data() + tt * in, in, xs.data(), ms.data(), nb, out.data() + p * 16, 16 * pairs);
                }
            ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ts.begin(), ts.end());
        const double dpw = (double)reps * (pairs / W * W) * nb * 8 * 4 * 2 * (16 / NT * NT);
        printf("%-16s  W=%d NT=%2d %.2f G vpdpbusd/s\n", name, W, NT, dpw / ts[R / 2] / 1e9);
    };
    for (int rep2 = 0; rep2 < 2; ++rep2) {
    wide("wide", q4k_wide<8, 1>, 1, 8);
    wide("wide", q4k_wide<16, 1>, 1, 16);
    wide("wide", q4k_wide<4, 2>, 2, 4);
    wide("wide", q4k_wide<6, 2>, 2, 6);
    wide("wide", q4k_wide<8, 2>, 2, 8);
    wide("wide", q4k_wide<4, 3>, 3, 4);
    wide("wide", q4k_wide<2, 4>, 4, 2);
    wide("wide", q4k_wide<4, 4>, 4, 4);
    }
}
