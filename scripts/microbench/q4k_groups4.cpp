// The AVX-512 VNNI Q4_K kernel over four 8-row groups of weights at once (two zmm weight vectors
// sharing each broadcast of x, half the broadcasts a vpdpbusd) against the shipped q4k_rows<Zmm, NT>
// (two groups a zmm, one broadcast a vpdpbusd) run on the same two pairs of groups; 1536-wide rows
// (6 super-blocks), one core, medians of 11 rounds, G zmm vpdpbusd a second; both forms' bits
// checked equal. "sumL1": the int32 sums kept in an L1 array instead of registers. Arguments:
// pairs of groups (40: records in L2; 4000: streamed from memory), repetitions, super-blocks.
// Build and run (torch's headers for gguf_common.h):
//   g++ -O3 -std=c++17 -mavx2 -mfma -mf16c $(python -c "import torch.utils.cpp_extension as c; print(' '.join('-I'+p for p in c.include_paths()))") \
//       -Ispecdraft/kernels scripts/microbench/q4k_groups4.cpp -o q4k_groups4 && taskset -c 1 ./q4k_groups4 40 200
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

// rows NT of x against two pairs of groups: (w0, w1) -> out lanes 0..15, (w2, w3) -> out + 16
template <int NT, bool SUM_L1>
__attribute__((noinline)) KERNEL_TARGET void q4k_g4(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const uint8_t* w3,
    const int8_t* x0, int64_t xrow, int64_t xblk, const float* xs, const int32_t* msum, int64_t nb, int64_t t0,
    float* out, int64_t ldy, int valid) {
    using V = Zmm;
    using I = typename V::I;
    using F = typename V::F;
    const I low4 = V::bytes(0x0F);
    alignas(64) float acc[NT][2][16];
    for (int r = 0; r < NT; ++r) V::fstore(acc[r][0], V::fzero()), V::fstore(acc[r][1], V::fzero());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *r0 = w0 + b * Q4K_REC, *r1 = w1 + b * Q4K_REC, *r2 = w2 + b * Q4K_REC, *r3 = w3 + b * Q4K_REC;
        const int64_t skip = stream_skip<NT, Q4K_REC>(b, nb, 3);
        const int8_t* xb = x0 + b * xblk;
        I sum[NT][2];
        alignas(64) int32_t suml[NT][2][16];
        for (int r = 0; r < NT; ++r) {
            if (SUM_L1) _mm512_store_si512(suml[r][0], V::zero()), _mm512_store_si512(suml[r][1], V::zero());
            else sum[r][0] = sum[r][1] = V::zero();
        }
        for (int s = 0; s < 8; ++s) {
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r0, s, skip);
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r1, s, skip);
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r2, s, skip);
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r3, s, skip);
            const I sc0 = V::u8to32(r0 + 1024 + 8 * s, r1 + 1024 + 8 * s), sc1 = V::u8to32(r2 + 1024 + 8 * s, r3 + 1024 + 8 * s);
            I dot[NT][2];
            for (int r = 0; r < NT; ++r) dot[r][0] = dot[r][1] = V::zero();
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                const I v0 = V::load32(r0 + 128 * s + 32 * c, r1 + 128 * s + 32 * c);
                const I v1 = V::load32(r2 + 128 * s + 32 * c, r3 + 128 * s + 32 * c);
                const I lo0 = V::and_(v0, low4), hi0 = V::and_(V::srli16(v0, 4), low4);
                const I lo1 = V::and_(v1, low4), hi1 = V::and_(V::srli16(v1, 4), low4);
                for (int r = 0; r < NT; ++r) {
                    const int8_t* x = xb + r * xrow + 32 * s + 8 * c;
                    const I bl = V::bcast4(x), bh = V::bcast4(x + 4);
                    dot[r][0] = V::dpbusd(dot[r][0], lo0, bl);
                    dot[r][1] = V::dpbusd(dot[r][1], lo1, bl);
                    dot[r][0] = V::dpbusd(dot[r][0], hi0, bh);
                    dot[r][1] = V::dpbusd(dot[r][1], hi1, bh);
                }
            }
            for (int r = 0; r < NT; ++r) {
                if (SUM_L1) {
                    _mm512_store_si512(suml[r][0], V::add(_mm512_load_si512(suml[r][0]), V::mullo(dot[r][0], sc0)));
                    _mm512_store_si512(suml[r][1], V::add(_mm512_load_si512(suml[r][1]), V::mullo(dot[r][1], sc1)));
                } else {
                    sum[r][0] = V::add(sum[r][0], V::mullo(dot[r][0], sc0));
                    sum[r][1] = V::add(sum[r][1], V::mullo(dot[r][1], sc1));
                }
            }
        }
        const Q4kClose<V> close0(r0, r1), close1(r2, r3);
        for (int r = 0; r < NT; ++r) {
            const int32_t* ms = msum + ((t0 + r) * nb + b) * 4;
            const float xv = xs[(t0 + r) * nb + b];
            const I s0 = SUM_L1 ? _mm512_load_si512(suml[r][0]) : sum[r][0];
            const I s1 = SUM_L1 ? _mm512_load_si512(suml[r][1]) : sum[r][1];
            V::fstore(acc[r][0], close0(V::fload(acc[r][0]), s0, ms, xv));
            V::fstore(acc[r][1], close1(V::fload(acc[r][1]), s1, ms, xv));
        }
    }
    for (int r = 0; r < NT; ++r) {
        V::store(out + (t0 + r) * ldy, 16, V::fload(acc[r][0]));
        V::store(out + (t0 + r) * ldy + 16, valid, V::fload(acc[r][1]));
    }
}
}}
using namespace gguf::avx512;

template <int NT>
void bench(const std::vector<uint8_t>& w, int pairs, int reps, int64_t nb, int64_t in, const std::vector<int8_t>& x,
           const std::vector<float>& xs, const std::vector<int32_t>& ms) {
    const size_t G = nb * gguf::Q4K_REC;
    std::vector<float> out(NT * 32 * pairs), ref(NT * 32), got(NT * 32);
    double tb[3][11];
    for (int round = 0; round < 11; ++round)
        for (int v = 0; v < 3; ++v) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int k = 0; k < reps; ++k)
                for (int p = 0; p < pairs; p += 2) {
                    const uint8_t* a = w.data() + (size_t)p * 2 * G;
                    if (v == 0) {
                        q4k_rows<Zmm, NT>(a, a + G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, out.data() + p * 16, 16 * pairs, 16);
                        q4k_rows<Zmm, NT>(a + 2 * G, a + 3 * G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, out.data() + p * 16 + 16, 16 * pairs, 16);
                    } else if (v == 1) {
                        q4k_g4<NT, false>(a, a + G, a + 2 * G, a + 3 * G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, out.data() + p * 16, 16 * pairs, 16);
                    } else {
                        q4k_g4<NT, true>(a, a + G, a + 2 * G, a + 3 * G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, out.data() + p * 16, 16 * pairs, 16);
                    }
                }
            tb[v][round] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
    const uint8_t* a = w.data();
    q4k_rows<Zmm, NT>(a, a + G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, ref.data(), 32, 16);
    q4k_rows<Zmm, NT>(a + 2 * G, a + 3 * G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, ref.data() + 16, 32, 16);
    bool same = true;
    for (int v = 1; v < 3; ++v) {
        if (v == 1) q4k_g4<NT, false>(a, a + G, a + 2 * G, a + 3 * G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, got.data(), 32, 16);
        else q4k_g4<NT, true>(a, a + G, a + 2 * G, a + 3 * G, x.data(), in, 256, xs.data(), ms.data(), nb, 0, got.data(), 32, 16);
        same = same && !memcmp(ref.data(), got.data(), sizeof(float) * NT * 32);
    }
    const double dp = (double)reps * pairs * nb * 8 * 4 * 2 * NT;
    printf("%3d", NT);
    for (int v = 0; v < 3; ++v) { std::sort(tb[v], tb[v] + 11); printf("  %8.2f", dp / tb[v][5] / 1e9); }
    printf("  %s\n", same ? "same bits" : "DIFFER");
}

int main(int argc, char** argv) {
    const int pairs = argc > 1 ? atoi(argv[1]) : 40, reps = argc > 2 ? atoi(argv[2]) : 200;
    const int64_t nb = argc > 3 ? atoi(argv[3]) : 6, in = nb * 256;
    std::vector<uint8_t> w((size_t)pairs * 2 * nb * gguf::Q4K_REC);
    for (auto& c : w) c = rand();
    for (size_t g = 0; g < (size_t)pairs * 2 * nb; ++g) {
        const float d = 0.01f;
        memcpy(&w[g * gguf::Q4K_REC + 1152], &d, 4), memcpy(&w[g * gguf::Q4K_REC + 1184], &d, 4);
    }
    std::vector<int8_t> x(16 * in);
    for (auto& c : x) c = rand();
    std::vector<float> xs(16 * nb);
    std::vector<int32_t> ms(16 * nb * 4);
    for (auto& v : xs) v = 0.5f + (float)(rand() % 1000) / 1000.0f;
    for (auto& v : ms) v = rand() & 0x0FFF0FFF;
    printf("rows   shipped  g4 regs  g4 sumL1  (G zmm vpdpbusd/s)\n");
    bench<1>(w, pairs, reps, nb, in, x, xs, ms);
    bench<2>(w, pairs, reps, nb, in, x, xs, ms);
    bench<4>(w, pairs, reps, nb, in, x, xs, ms);
    bench<6>(w, pairs, reps, nb, in, x, xs, ms);
    bench<8>(w, pairs, reps, nb, in, x, xs, ms);
    bench<12>(w, pairs, reps, nb, in, x, xs, ms);
    bench<16>(w, pairs, reps, nb, in, x, xs, ms);
}
