// Matrix products over GGUF's Q4_K and Q6_K weights with 8-bit activations, for AVX2 CPUs.
//
// y[t, o] = sum_i W[o, i] * x[t, i] where W stays in its GGUF quantization:
//   Q4_K: super-blocks of 256 inputs, 8 sub-blocks of 32:  W = d * sc[s] * q - dmin * m[s],  q in 0..15
//   Q6_K: super-blocks of 256 inputs, 16 sub-blocks of 16: W = d * sc[s] * (q - 32),         q in 0..63
// and x is quantized per row and per super-block to int8 (Q8_K: x ~= xs * qx, |qx| <= 127), as
// llama.cpp does. Within a super-block everything is integer arithmetic (exact); each
// super-block adds one float product per (t, o). Every (t, o) is computed by the same sequence of
// operations whatever the number of rows T and wherever row t sits in the block, so a row's
// result is bitwise independent of the block it is verified in: speculative decoding stays exact.
//
// Layouts (prepared once in Python, see specdraft/models/gguf_weights.py), nb = in / 256. Each
// record is one super-block of 8 interleaved output rows o = 0..7 (the last group of a matrix may
// be partly padding, d = 0), so a group of 8 rows is one sequential stream and one 8-bit product
// instruction serves all 8 rows:
//   Q4_K  [ceil(O / 8), nb, 1216] u8: qs[8 sub-blocks s][4 chunks c][8 rows o][4 bytes i]: the low
//         nibble of byte i holds the quant of input 32s + 8c + i, the high nibble that of input
//         32s + 8c + 4 + i; sc[s][o] (6-bit scales), mn[s / 2][o][s % 2] (6-bit mins), d[o],
//         dmin[o] (f32)
//   Q6_K  [ceil(O / 8), nb, 1728] u8: ql[32 chunks c][8 rows o][4 bytes i]: the low 4 bits of
//         input 8c + i (low nibble) and 8c + 4 + i (high nibble); qh[16 sub-blocks s][o][i]: bits
//         2k, 2k + 1 of byte i are the top 2 bits of input 16s + 4k + i; sc[s][o] (i8), d[o] (f32),
//         off[o] (i32: 128 * sum_s sc[s] * sum (q - 32) over s, read by the VNNI kernels only).
//         6.75 bits a weight: decoding is memory-bound and reads fewer bytes than one byte a weight
//   x     qx [T, in] i8, xs [T, nb] f32, bsums [T, in / 16] i16 (sums of each 16 of qx)
//
// These AVX2 kernels are the reference for the other ISA paths (gguf_vnni.cpp: AVX-512 VNNI,
// gguf_avxvnni.cpp: AVX-VNNI, gguf_amx.cpp: AMX-INT8), which give their results bit for bit; gguf_matmul_into picks one.
#include "torch_lite.h"
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ops.h"
#include "simd.h"
#include "gguf_common.h"

namespace {

using gguf::Q4K_REC;
using gguf::Q6K_REC;
using gguf::GROUP;
using gguf::prefetch_ahead;

// y[t0 + r, 8g + o] = acc[r][o] for the group's valid (<= 8) output rows
template <int NT>
inline void store_rows(const float (*acc)[8], float* out, int64_t t0, int64_t O, int64_t valid) {
    for (int r = 0; r < NT; ++r) std::memcpy(out + (t0 + r) * O, acc[r], valid * sizeof(float));
}

// NT rows of x (t0 .. t0 + NT - 1) against one group of 8 output rows of a Q4_K matrix (w: the
// group's nb records, out: y[t0, 8g]). One vpmaddubsw multiplies 4 inputs of all 8 rows (the
// record interleaves them) by those 4 inputs of x broadcast; the 16-bit pair sums of a whole
// sub-block add up in 16 bits (8 x 2 x 15 x 127 < 2^15) before one vpmaddwd applies the 8 rows'
// sub-block scales: 9 multiplies per 256 products instead of 16 with one row per register. Each
// output is one lane: no horizontal sums, and every (t, o) takes the same steps for any NT.
// A sub-block's weights are unpacked once into 8 registers and serve all NT rows, each row's
// products summed in one chain; the per-row integer and float sums live in L1 (one load and
// store per sub-block), not in registers, so NT can reach 8 without spills (Zen 3, one core,
// `python scripts/kernel_ab.py --threads 1`: the default target's products over 8 rows 1.16x faster
// than with every sum in registers, 4 rows a pass, whose compiled form spilled them; 1.00-1.07x
// at 1, 2, 4 and 16 rows).
template <int NT>
inline void q4k_rows(const uint8_t* w, const int8_t* qx, const float* xs, const int32_t* pairs, int64_t nb,
                     int64_t in, int64_t t0, float* out, int64_t O, int64_t valid) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    alignas(32) float acc[NT][8];
    alignas(32) int32_t sum[NT][8];
    for (int r = 0; r < NT; ++r) _mm256_store_ps(acc[r], _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = w + b * Q4K_REC;
        const int8_t* xb = qx + t0 * in + b * 256;
        for (int r = 0; r < NT; ++r) _mm256_store_si256((__m256i*)sum[r], _mm256_setzero_si256());
        for (int s = 0; s < 8; ++s) {  // sub-block s: inputs 32s .. 32s + 31
            prefetch_ahead<Q4K_REC, 8>(rec, s);
            // its scales, one i16 pair per row: [sc(o0), sc(o0), sc(o1), sc(o1), ...]
            const __m128i sc8 = _mm_loadl_epi64((const __m128i*)(rec + 1024 + 8 * s));
            const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8));
            // chunk c: inputs 32s + 8c .. + 7, the low nibbles the first 4, the high the next 4
            __m256i q[8];
            for (int c = 0; c < 4; ++c) {
                const __m256i v = _mm256_loadu_si256((const __m256i*)(rec + 128 * s + 32 * c));
                q[2 * c] = _mm256_and_si256(v, low4);
                q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
            for (int r = 0; r < NT; ++r) {
                const int8_t* x = xb + r * in + 32 * s;  // q[k] pairs with x[4k .. 4k + 3]
                __m256i p = _mm256_maddubs_epi16(q[0], simd::bcast4(x));
                for (int k = 1; k < 8; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[k], simd::bcast4(x + 4 * k)));
                __m256i* sm = (__m256i*)sum[r];
                _mm256_store_si256(sm, _mm256_add_epi32(_mm256_load_si256(sm), _mm256_madd_epi16(p, sc)));
            }
        }
        // mins: sum over sub-blocks of mn(o, s) * (sum of sub-block s's 32 qx), exact in integers,
        // two sub-blocks per vpmaddwd (mn is stored as [pair][row][2]; q4k_pairs has the sums)
        __m256i mn[4];
        for (int q = 0; q < 4; ++q) mn[q] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(rec + 1088 + 16 * q)));
        const __m256 d = _mm256_loadu_ps((const float*)(rec + 1152)), dmin = _mm256_loadu_ps((const float*)(rec + 1184));
        for (int r = 0; r < NT; ++r) {
            const int32_t* pr = pairs + ((t0 + r) * nb + b) * 4;
            __m256i m = _mm256_setzero_si256();
            for (int q = 0; q < 4; ++q) m = _mm256_add_epi32(m, _mm256_madd_epi16(mn[q], _mm256_set1_epi32(pr[q])));
            const __m256 x = _mm256_set1_ps(xs[(t0 + r) * nb + b]);
            __m256 a = _mm256_load_ps(acc[r]);
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i*)sum[r])), _mm256_mul_ps(d, x), a);
            a = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, x), a);
            _mm256_store_ps(acc[r], a);
        }
    }
    store_rows<NT>(acc, out, t0, O, valid);
}

// NT rows of x against one group of 8 output rows of a Q6_K matrix (w: the group's nb records,
// out: y[t0, 8g]), as q4k_rows: one vpmaddubsw multiplies 4 inputs of the 8 rows by 4 inputs of x
// broadcast. The quants q are 0..63 (W ~ q - 32) and 2 * 63 * 127 products only fit twice in 16
// bits, but the 16-bit sums wrap modulo 2^16 and what a sub-block's 4 products add up to, after
// the -32 offset, is sum (q - 32) x over 8 inputs a lane, |.| <= 8 * 32 * 127 < 2^15: so each lane
// starts at -32 * (its inputs' sum of x) (corr, the same for every output row) and one vpmaddwd
// per sub-block of 16 inputs applies the scales. 10 multiplies per 256 products instead of 16.
// Sums in L1 as in q4k_rows.
template <int NT>
inline void q6k_rows(const uint8_t* w, const int8_t* qx, const float* xs, const int32_t* corr, int64_t nb,
                     int64_t in, int64_t t0, float* out, int64_t O, int64_t valid) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    alignas(32) float acc[NT][8];
    alignas(32) int32_t sum[NT][8];
    for (int r = 0; r < NT; ++r) _mm256_store_ps(acc[r], _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = w + b * Q6K_REC;
        const int8_t* xb = qx + t0 * in + b * 256;
        const int32_t* cb = corr + (t0 * nb + b) * 16;
        for (int r = 0; r < NT; ++r) _mm256_store_si256((__m256i*)sum[r], _mm256_setzero_si256());
        for (int s = 0; s < 16; ++s) {  // sub-block s: inputs 16s .. 16s + 15, quads k of 4 inputs
            prefetch_ahead<Q6K_REC, 16>(rec, s);
            const __m128i sc8 = _mm_loadl_epi64((const __m128i*)(rec + 1536 + 8 * s));
            const __m256i sc = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc8, sc8));  // [sc(o0), sc(o0), sc(o1), ...]
            const __m256i v0 = _mm256_loadu_si256((const __m256i*)(rec + 64 * s));
            const __m256i v1 = _mm256_loadu_si256((const __m256i*)(rec + 64 * s + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i*)(rec + 1024 + 32 * s));
            // quad k's top 2 bits are bits 2k, 2k + 1 of h's bytes, moved to bits 4, 5 (16-bit
            // shifts: the mask drops what crossed from the neighbouring byte)
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(v0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), top2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), top2)),
                _mm256_or_si256(_mm256_and_si256(v1, low4), _mm256_and_si256(h, top2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low4), _mm256_and_si256(_mm256_srli_epi16(h, 2), top2))};
            for (int r = 0; r < NT; ++r) {
                const int8_t* x = xb + r * in + 16 * s;
                __m256i p = _mm256_set1_epi32(cb[r * nb * 16 + s]);
                for (int k = 0; k < 4; ++k) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[k], simd::bcast4(x + 4 * k)));
                __m256i* sm = (__m256i*)sum[r];
                _mm256_store_si256(sm, _mm256_add_epi32(_mm256_load_si256(sm), _mm256_madd_epi16(p, sc)));
            }
        }
        const __m256 d = _mm256_loadu_ps((const float*)(rec + 1664));
        for (int r = 0; r < NT; ++r) {
            const __m256 x = _mm256_set1_ps(xs[(t0 + r) * nb + b]);
            const __m256 a = _mm256_load_ps(acc[r]);
            _mm256_store_ps(acc[r], _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i*)sum[r])), _mm256_mul_ps(d, x), a));
        }
    }
    store_rows<NT>(acc, out, t0, O, valid);
}

constexpr int TILE = 8;  // rows of x per pass over a weight row (more rows share each unpacked sub-block)

void check_x(const at::Tensor& qx, const at::Tensor& xs, const at::Tensor& bsums) {
    TORCH_CHECK(qx.dtype() == at::kChar && qx.dim() == 2 && qx.is_contiguous(), "qx: contiguous int8 [T, in]");
    TORCH_CHECK(qx.size(1) % 256 == 0, "input width must be a multiple of 256");
    const int64_t T = qx.size(0), nb = qx.size(1) / 256;
    TORCH_CHECK(xs.dtype() == at::kFloat && xs.is_contiguous() && xs.numel() == T * nb, "xs: float [T, in/256]");
    TORCH_CHECK(bsums.dtype() == at::kShort && bsums.is_contiguous() && bsums.numel() == T * nb * 16, "bsums: int16 [T, in/16]");
}

// y[t, 0 .. O) (row stride ldy) for T rows of x (quantized: qx [T, in], xs [T, nb], bsums
// [T, in / 16]) times the weight records w [ceil(O / 8), nb * REC] (a record holds 8 output rows;
// the last group may be partly padding)
template <int REC, typename Rows>
void matmul_rows(const uint8_t* pw, int64_t groups, int64_t T, int64_t in, int64_t O, float* py, int64_t ldy, Rows rows) {
    const int64_t nb = in / 256;
    auto body = [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g)
            gguf::over_tiles<TILE>(T, [&](auto nt, int64_t t0) {
                rows(nt, pw + g * nb * REC, nb, in, t0, py + g * GROUP, ldy, std::min<int64_t>(GROUP, O - g * GROUP));
            });
    };
    // one row is bound by memory, and the shared tail's chunks restart the prefetchers' streams
    // (AVX2 EPYC, `python scripts/kernel_ab.py --rounds 21`: 0.98x at one row, 1.02-1.21x at 2-32)
    if (T == 1)
        at::parallel_for(0, groups, 2, body);
    else
        gguf::balanced_for(groups, 2, body);
}

// Q4_K's sub-block sums of x for the mins, two sub-blocks a word as q4k_rows's vpmaddwd reads them:
// word u holds the sums of qx over inputs 64u .. 64u + 31 (low 16 bits) and 64u + 32 .. + 63 (high),
// i.e. word q of row t's super-block b is sub-blocks 2q and 2q + 1 (bsums: [4 * n64] sums of 16).
// Made once a matmul instead of once per group of 8 output rows (measured, AVX2 EPYC, one core,
// 8 rows of x: the Q4_K products 1.10-1.13x faster).
std::vector<int32_t> q4k_pairs(const int16_t* bsums, int64_t n64) {
    std::vector<int32_t> pairs(n64);
    for (int64_t u = 0; u < n64; ++u) {
        const int16_t* bs = bsums + 4 * u;
        pairs[u] = (int32_t)((uint32_t)(uint16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(bs[2] + bs[3]) << 16);
    }
    return pairs;
}

// Q6_K's per-lane start values: word j of corr[t, s] is -32 * the sum of x over inputs 4k + 2j,
// 4k + 2j + 1 (k = 0..3) of sub-block s (see q6k_rows)
std::vector<int32_t> q6k_corr(const int8_t* px, int64_t n16) {
    std::vector<int32_t> corr(n16);
    for (int64_t u = 0; u < n16; ++u) {
        const int8_t* x = px + 16 * u;
        int32_t c[2] = {0, 0};
        for (int i = 0; i < 16; ++i) c[(i / 2) % 2] += x[i];
        corr[u] = (int32_t)((uint32_t)(uint16_t)(int16_t)(-32 * c[0]) | (uint32_t)(uint16_t)(int16_t)(-32 * c[1]) << 16);
    }
    return corr;
}

}  // namespace

// x [T, in] float32 -> (qx int8 [T, in'], xs float32 [T, in'/256], bsums int16 [T, in'/16]) where
// in' is in rounded up to whole super-blocks of 256: the padding is zeros (weights re-quantized for
// these kernels pad their inputs the same way, e.g. a hidden size of 896)
std::vector<at::Tensor> quantize_q8k(at::Tensor x) {
    TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2, "x: float32 [T, in]");
    x = x.contiguous();
    if (x.size(1) % 256) x = at::constant_pad_nd(x, {0, 256 - x.size(1) % 256});
    const int64_t T = x.size(0), in = x.size(1);
    auto qx = at::empty({T, in}, at::kChar);
    auto xs = at::empty({T, in / 256}, at::kFloat);
    auto bsums = at::empty({T, in / 16}, at::kShort);
    quantize_q8k_rows(x.data_ptr<float>(), T, {qx.data_ptr<int8_t>(), xs.data_ptr<float>(), bsums.data_ptr<int16_t>(), in});
    return {qx, xs, bsums};
}

void quantize_q8k_block(const float* v, int8_t* q, float* scale, int16_t* bsums) {
    // 8 floats a step; the same values as the scalar definition (|x| max, 127 / amax, round to
    // nearest even, sums of 16 in int), only faster
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 256; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    const float amax = simd::hmax(mx);
    const float iscale = amax > 0.f ? 127.f / amax : 0.f;
    *scale = amax > 0.f ? 1.f / iscale : 0.f;
    const __m256 is = _mm256_set1_ps(iscale);
    for (int g = 0; g < 16; ++g) {  // 16 inputs: two vectors of 8 -> 16 int8 and their sum
        const __m256i a = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 16 * g), is),
                                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i b = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 16 * g + 8), is),
                                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i ab = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);  // 16 x i16 in order
        const __m128i q8 = _mm_packs_epi16(_mm256_castsi256_si128(ab), _mm256_extracti128_si256(ab, 1));
        _mm_storeu_si128((__m128i*)(q + 16 * g), q8);
        __m256i s = _mm256_add_epi32(a, b);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        bsums[g] = (int16_t)_mm_cvtsi128_si32(s4);
    }
}

void quantize_q8k_rows(const float* px, int64_t T, const Q8Rows& out) {
    // blocks are independent: split across threads from 64 blocks on (a row of 16384 inputs)
    at::parallel_for(0, T * (out.in / 256), 64, [&](int64_t first, int64_t last) {
        for (int64_t blk = first; blk < last; ++blk) out.quantize_block(px + blk * 256, blk);
    });
}

// Rows per pass over the weights: the kernels read every row of x for each weight record, so a
// prefill block is cut into pieces whose x stays in L2 cache (measured, 664-token prompt: 21.8 s
// in one pass). Rows are computed independently: the cut changes no bit.
constexpr int64_t ROWS = 32;
// The AMX kernels unpack each super-block's weight tiles once for all of a pass's 16-row tiles
// (AmxRows::span), so their passes run as long as x keeps in a core's L2 (2 MB on Sapphire Rapids):
// up to 1 MB of x, at most 512 rows (256 rows of a 1536-wide input in one pass, 112 of an
// 8960-wide one). Measured on an AMX Xeon, the default target's products (Q4_K on tiles, Q6_K then
// on VNNI), against passes of 32: 1.17 / 1.08 / 1.10x at 64 / 128 / 300 rows (BENCHMARKS.md, 2026-11-28).
static int64_t amx_pass_rows(int64_t in) { return std::clamp<int64_t>((int64_t(1) << 20) / in / 16 * 16, ROWS, 512); }

// The kernels' ISA path: chosen once, the best this CPU has, unless SPECDRAFT_KERNEL_PATH names
// one (read at first use) or set_kernel_path changes it (tests compare the paths on one machine).
namespace {
enum Path { AVX2 = 0, AVX_VNNI = 1, AVX512_VNNI = 2, AMX_INT8 = 3, PATHS };  // in order of preference
const char* const PATH_NAMES[] = {"avx2", "avx-vnni", "avx512-vnni", "amx-int8"};
const char* const PATH_NEEDS[] = {"", " (needs avx_vnni)", " (needs avx512f/bw/vl and avx512_vnni)",
                                  " (needs amx_tile, amx_int8, AVX-512 VNNI and a Linux kernel that grants the tiles)"};

bool path_supported(int p) {
    return p == AVX2 || (p == AVX_VNNI && gguf::cpu_has_avx_vnni()) || (p == AVX512_VNNI && gguf::cpu_has_avx512_vnni()) ||
           (p == AMX_INT8 && (gguf::cpu_has_amx_int8() || (gguf::amx_emulated() && gguf::cpu_has_avx512_vnni())));
}

int path_by_name(const std::string& name) {
    if (name.empty() || name == "auto") {
        int best = AVX2;
        for (int p = 0; p < PATHS; ++p)
            if (path_supported(p)) best = p;
        return best;
    }
    for (int p = 0; p < PATHS; ++p)
        if (name == PATH_NAMES[p]) {
            TORCH_CHECK(path_supported(p), "this CPU cannot run kernel path ", name, PATH_NEEDS[p]);
            return p;
        }
    TORCH_CHECK(false, "unknown kernel path ", name, " (auto, avx2, avx-vnni, avx512-vnni or amx-int8)");
    return AVX2;
}

std::atomic<int>& active_path() {
    static std::atomic<int> path{[] {
        const char* env = std::getenv("SPECDRAFT_KERNEL_PATH");
        return path_by_name(env ? env : "");
    }()};
    return path;
}
}  // namespace

std::string kernel_path() { return PATH_NAMES[active_path().load()]; }

bool kernel_path_avx512() { return active_path().load() >= AVX512_VNNI; }

void set_kernel_path(const std::string& name) { active_path() = path_by_name(name); }

void set_amx_emulated(bool on) {
    TORCH_CHECK(!on || gguf::cpu_has_avx512_vnni(), "the emulated AMX kernel needs AVX-512 VNNI");
    if (!on && active_path().load() == AMX_INT8 && !gguf::cpu_has_amx_int8()) active_path() = AVX512_VNNI;
    gguf::set_amx_emulated(on);
}

std::vector<std::string> kernel_paths() {
    std::vector<std::string> out;
    for (int p = 0; p < PATHS; ++p)
        if (path_supported(p)) out.push_back(PATH_NAMES[p]);
    return out;
}

std::vector<int64_t> vnni_forms() {
    return {gguf::vnni_zmm_rows(4, false), gguf::vnni_zmm_rows(4, true), gguf::vnni_zmm_rows(6, false),
            gguf::vnni_zmm_rows(6, true)};
}

void set_vnni_forms(const std::vector<int64_t>& masks) {
    TORCH_CHECK(masks.size() == 4, "vnni forms: 4 masks (Q4_K short, Q4_K long, Q6_K short, Q6_K long rows)");
    for (int64_t m : masks)
        TORCH_CHECK(m >= 0 && m < 512, "vnni forms: bit masks over rows 1..8 (bit n set: n rows a pass take the zmm form)");
    gguf::set_vnni_zmm_rows(4, (uint32_t)masks[0], (uint32_t)masks[1]);
    gguf::set_vnni_zmm_rows(6, (uint32_t)masks[2], (uint32_t)masks[3]);
}

void gguf_matmul_into(int64_t kind, const int8_t* qx, const float* xs, const int16_t* bsums, int64_t T, int64_t in,
                      const at::Tensor& w, int64_t O, float* y, int64_t ldy) {
    TORCH_CHECK(kind == 4 || kind == 6, "weight kind must be 4 (Q4_K) or 6 (Q6_K)");
    const int64_t rec = kind == 4 ? Q4K_REC : Q6K_REC, nb = in / 256;
    TORCH_CHECK(in % 256 == 0, "input width must be a multiple of 256");
    // The messages take numbers as strings (std::to_string): on a Sapphire Rapids host (Ubuntu
    // 24.04, g++ 13.3, glibc 2.39, Python 3.12, torch 2.11) inserting an int64 into TORCH_CHECK's
    // message stream segfaulted inside the extension (basic_ostream::_M_insert<long>), so bad
    // weights crashed the process instead of raising; string arguments format fine there
    TORCH_CHECK(w.dtype() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(1) == nb * rec,
                "weights: uint8 [O / " + std::to_string(GROUP) + ", in/256 * " + std::to_string(rec) +
                    "] records for this input width");
    TORCH_CHECK(O > (w.size(0) - 1) * GROUP && O <= w.size(0) * GROUP,
                "weights: " + std::to_string(w.size(0)) + " records of " + std::to_string(GROUP) + " rows cannot hold " +
                    std::to_string(O) + " outputs");
    const uint8_t* pw = w.data_ptr<uint8_t>();
    const int64_t pass = active_path().load() == AMX_INT8 ? amx_pass_rows(in) : ROWS;
    for (int64_t c0 = 0; c0 < T; c0 += pass) {
        const int64_t n = std::min(pass, T - c0);
        const int8_t* px = qx + c0 * in;
        const float* pxs = xs + c0 * nb;
        float* py = y + c0 * ldy;
        const int path = active_path().load();
        if (path == AMX_INT8) {
            gguf::amx_matmul(kind, pw, w.size(0), px, pxs, bsums + c0 * (in / 16), n, in, O, py, ldy);
        } else if (path == AVX512_VNNI) {
            gguf::vnni_matmul(kind, pw, w.size(0), px, pxs, bsums + c0 * (in / 16), n, in, O, py, ldy);
        } else if (path == AVX_VNNI) {
            gguf::avxvnni_matmul(kind, pw, w.size(0), px, pxs, bsums + c0 * (in / 16), n, in, O, py, ldy);
        } else if (kind == 4) {
            const std::vector<int32_t> pairs = q4k_pairs(bsums + c0 * (in / 16), n * in / 64);
            const int32_t* pp = pairs.data();
            matmul_rows<Q4K_REC>(pw, w.size(0), n, in, O, py, ldy,
                                 [&](auto nt, const uint8_t* wr, int64_t nb, int64_t in, int64_t t0, float* out, int64_t ld, int64_t valid) {
                q4k_rows<decltype(nt)::value>(wr, px, pxs, pp, nb, in, t0, out, ld, valid);
            });
        } else {
            const std::vector<int32_t> corr = q6k_corr(px, n * in / 16);
            const int32_t* pc = corr.data();
            matmul_rows<Q6K_REC>(pw, w.size(0), n, in, O, py, ldy,
                                 [&](auto nt, const uint8_t* wr, int64_t nb, int64_t in, int64_t t0, float* out, int64_t ld, int64_t valid) {
                q6k_rows<decltype(nt)::value>(wr, px, pxs, pc, nb, in, t0, out, ld, valid);
            });
        }
    }
}

namespace {
at::Tensor matmul(int64_t kind, const at::Tensor& qx, const at::Tensor& xs, const at::Tensor& bsums,
                  const at::Tensor& w, int64_t O) {
    check_x(qx, xs, bsums);
    const int64_t T = qx.size(0), in = qx.size(1);
    auto y = at::empty({T, O}, at::kFloat);
    gguf_matmul_into(kind, qx.data_ptr<int8_t>(), xs.data_ptr<float>(), bsums.data_ptr<int16_t>(), T, in, w, O,
                     y.data_ptr<float>(), O);
    return y;
}
}  // namespace

at::Tensor q4k_matmul(at::Tensor qx, at::Tensor xs, at::Tensor bsums, at::Tensor w, int64_t out_features) {
    return matmul(4, qx, xs, bsums, w, out_features);
}

at::Tensor q6k_matmul(at::Tensor qx, at::Tensor xs, at::Tensor bsums, at::Tensor w, int64_t out_features) {
    return matmul(6, qx, xs, bsums, w, out_features);
}
