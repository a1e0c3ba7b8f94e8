// The Q4_K and Q6_K kernels for CPUs with AMX-INT8 (Sapphire Rapids and later): tile multiplies
// (tdpbsud, tdpbssd) form the exact sums of up to 16 rows of x against 16 output rows (two 8-row
// groups, the records' own interleaving: a record chunk of 8 rows x 4 bytes is a quarter of a
// weight tile row pair), with each super-block's scales folded into its weight tiles (AmxRows
// below). Those are the int32 sums the VNNI kernels form, so from there on the steps are theirs,
// lane for lane: the floats are bit for bit the AVX2 kernels'. Below AMX_MIN_ROWS rows of x the
// AVX-512 VNNI kernels run instead. Built in every build with target attributes, called only where cpu_has_amx_int8 says
// so, or with the tiles emulated (set_amx_emulated: the kernel's logic tested on any AVX-512 VNNI CPU).
#include <ATen/Parallel.h>
#include <cpuid.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "gguf_common.h"

#define KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))
#define YMM_DPBUSD _mm256_dpbusd_epi32
#define YMM_DPWSSD _mm256_dpwssd_epi32

namespace gguf {
namespace amx {

#include "gguf_vnni_kernels.h"

#include "gguf_zmm.h"

// The tile registers as AmxRows uses them: 0, 1 the int32 sums (rows of x x 16 output rows) of
// the weights' high and low scale parts; 4 the rows of x (64 inputs each); 6, 7 the high and low
// weight tiles (16 rows of 16 outputs x 4 bytes: 64 inputs); 2, 3, 5 unused (the numbers checked
// bit for bit on an AMX Xeon). Tile numbers are literals (the intrinsics paste them into the asm),
// so each use is a function of this policy. EmuTiles below does the same in plain code, so the
// kernel's logic is tested on every AVX-512 VNNI CPU, not only where AMX runs.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

struct HwTiles {
    // Loads the configuration unless this thread's tiles have it already (read back with
    // sttilecfg: other code of the process, oneDNN's, may configure tiles too), so a thread's tiles
    // stay configured from one task of 16 output rows to the next instead of a release and reload each.
    KERNEL_TARGET static void configure(int n) {
        TileConfig want, have;
        const int rows[8] = {n, n, 0, 0, n, 0, 16, 16};
        for (int t = 0; t < 8; ++t) want.rows[t] = rows[t], want.colsb[t] = rows[t] ? 64 : 0;
        _tile_storeconfig(&have);
        // the config intrinsics' asm declares pointer-sized operands: these barriers keep the whole
        // structs written (want) and read (have)
        __asm__ volatile("" ::"r"(&want), "r"(&have) : "memory");
        if (std::memcmp(&want, &have, sizeof want) != 0) _tile_loadconfig(&want);
    }
    KERNEL_TARGET static void zero() {
        _tile_zero(0);
        _tile_zero(1);
    }
    // the sums += x [n rows x 64 inputs, row stride in] . bhi, blo [16 rows x 64 bytes], the weight
    // bytes unsigned (tdpbsud: Q4_K's parts) or SIGNED (tdpbssd: Q6_K's)
    template <bool SIGNED>
    KERNEL_TARGET static void product(const int8_t* x, int64_t in, const uint8_t* bhi, const uint8_t* blo) {
        _tile_loadd(6, bhi, 64);
        _tile_loadd(4, x, in);
        if constexpr (SIGNED) _tile_dpbssd(0, 4, 6); else _tile_dpbsud(0, 4, 6);
        _tile_loadd(7, blo, 64);
        if constexpr (SIGNED) _tile_dpbssd(1, 4, 7); else _tile_dpbsud(1, 4, 7);
    }
    // c[k][row][16]: the high parts' sums (k = 0), the low parts' (k = 1)
    KERNEL_TARGET static void store(int32_t* c) {
        _tile_stored(0, c, 64);
        _tile_stored(1, c + 256, 64);
    }
};

struct EmuTiles {
    struct State {
        int rows = 0;
        int32_t c[2][16][16];
    };
    static State& state() {
        thread_local State s;
        return s;
    }
    static void configure(int n) { state().rows = n; }
    static void zero() { std::memset(state().c, 0, sizeof state().c); }
    // tdpbsud: c[m][o] += sum_k x[m][k] (signed) * b[k / 4][4 o + k % 4] (unsigned), k < 64: a row
    // of b against a broadcast dword of x is one vpdpbusd (the same exact int32 sums)
    KERNEL_TARGET static void dp(int32_t (*c)[16], const int8_t* x, int64_t in, int rows, const uint8_t* b) {
        for (int m = 0; m < rows; ++m) {
            __m512i s = _mm512_loadu_si512(c[m]);
            for (int k = 0; k < 16; ++k) s = Zmm::dpbusd(s, _mm512_loadu_si512(b + 64 * k), Zmm::bcast4(x + m * in + 4 * k));
            _mm512_storeu_si512(c[m], s);
        }
    }
    // tdpbssd: as dp with signed b, in plain code (tests only)
    static void dp_signed(int32_t (*c)[16], const int8_t* x, int64_t in, int rows, const uint8_t* b) {
        for (int m = 0; m < rows; ++m)
            for (int o = 0; o < 16; ++o)
                for (int k = 0; k < 64; ++k) c[m][o] += int32_t(x[m * in + k]) * int32_t(int8_t(b[64 * (k / 4) + 4 * o + k % 4]));
    }
    template <bool SIGNED>
    KERNEL_TARGET static void product(const int8_t* x, int64_t in, const uint8_t* bhi, const uint8_t* blo) {
        State& s = state();
        for (int k = 0; k < 2; ++k) {
            if constexpr (SIGNED) dp_signed(s.c[k], x, in, s.rows, k ? blo : bhi);
            else dp(s.c[k], x, in, s.rows, k ? blo : bhi);
        }
    }
    static void store(int32_t* c) {
        const State& s = state();
        for (int k = 0; k < 2; ++k) std::memcpy(c + 256 * k, s.c[k], sizeof(int32_t) * 16 * s.rows);
    }
};

// NT rows of x against two groups of a Q4_K matrix (as q4k_rows of gguf_vnni_kernels.h, whose mins
// and float steps these are). A super-block's scales split as sc = 16 hi + lo (lo <= 15, hi <= 15
// for any byte), and its weight tiles carry q * hi and q * lo (q <= 15: both <= 225, unsigned
// bytes): four full-depth products per part span its 256 inputs, and 16 sum_hi + sum_lo =
// sum_s sc sum q x, the exact int32 the VNNI kernel forms; one tile store per part a super-block,
// no per-sub-block scale step. q * s for a byte pair (one output's) is one vpmullw:
// (q1 << 8 | q0) * s = q1 s << 8 | q0 s, no carry since q0 s < 256. Weight tile row 2c of
// sub-block s holds the low nibbles of record chunk c (inputs 8c .. 8c + 3 of the sub-block), row
// 2c + 1 the high ones (+ 4 .. 7); a tile holds two sub-blocks (rows 0-7, 8-15). Weight tiles go
// through two buffers of one tile each in rows (one of a super-block's tiles in spans), sums
// through two, so unpacking and the previous super-block's float steps can overlap the tile
// products. (Measured on an AMX Xeon, kernels alone, two runs: as fast as the kernel before it, one tile product a sub-block and one vpmulld a row of x to scale it, 0.96-1.01x
// at 12 and 16 rows: the scale steps were not what bounds it. Two token tiles of up to 16 rows
// sharing the weight tiles, for passes of 17-32 rows, measured 0.91-1.03x against two passes; full
// tiles of 16 rows sharing them from 32 rows on (q4k_span) measured 1.07 / 1.05 / 1.09 / 1.15x at
// 32 / 64 / 128 / 300 rows on a Sapphire Rapids kind, the same bits. Emerald
// Rapids, parts switched off, a forward's Q4_K products at 16 rows: whole 33.7 ms, the tile
// products alone 38.8, unpacking and closing alone 25.4; unpacking a super-block ahead of its
// products 1.00x. On a Sapphire Rapids kind (scripts/amx_parts.py, weights from memory): whole 37.0
// against one VNNI row's 33.0, the tile products alone 13.0: near the weights' read bound, the tile
// unit not what bounds it. Unpacking one tile at a time in rows, 2 KB of weight tiles in L1 instead
// of 16: 1.04-1.07x at 12 / 16 rows; a third 8 KB buffer instead: 0.83x. BENCHMARKS.md, 2026-11-28/29.)
// Q6_K's float step of a super-block, called as Q4kClose is: acc += sum d xs (q6k_rows's)
struct Q6kClose {
    __m512 d;
    KERNEL_TARGET Q6kClose(const uint8_t* r0, const uint8_t* r1) : d(Zmm::load8f(r0 + 1664, r1 + 1664)) {}
    KERNEL_TARGET __m512 operator()(__m512 acc, __m512i sum, const int32_t*, float xs) const {
        return Zmm::fmadd(Zmm::cvt(sum), Zmm::mul(d, Zmm::fset1(xs)), acc);
    }
};

template <class Tiles>
struct AmxRows {
    static constexpr bool Q6K_ROW_MAJOR = true;  // Q6_K as Q4_K: x row-major, q6k_x and spans (Q6kTiles)
    static constexpr bool TAKES_X_TILES = false;  // x row-major: a tile load reads rows at any stride
    static constexpr bool HAS_SPAN = true;  // spans: 16-row tiles sharing each super-block's unpacking

    // the weight tiles of super-block records r0, r1, sub-blocks s0 .. s1 - 1: whi the high parts,
    // wlo the low ones (512 bytes a sub-block from sub-block s0's: tile i = sub-blocks 2i, 2i + 1)
    KERNEL_TARGET static void unpack_q4k(const uint8_t* r0, const uint8_t* r1, int64_t skip, int s0, int s1, uint8_t* whi,
                                         uint8_t* wlo) {
        using V = Zmm;
        using I = __m512i;
        const I low4 = V::bytes(0x0F), m15 = V::set1(15);
        for (int s = s0; s < s1; ++s) {
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<16>>(r0, s, skip);
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<16>>(r1, s, skip);
            const I sc = V::u8to32(r0 + 1024 + 8 * s, r1 + 1024 + 8 * s);  // lane o: output o's scale
            const I lo = V::and_(sc, m15), hi = _mm512_srli_epi32(sc, 4);
            const I lo16 = V::or_(lo, V::slli32(lo, 16)), hi16 = V::or_(hi, V::slli32(hi, 16));
            for (int c = 0; c < 4; ++c) {
                const I v = V::load32(r0 + 128 * s + 32 * c, r1 + 128 * s + 32 * c);
                const I q0 = V::and_(v, low4), q1 = V::and_(V::srli16(v, 4), low4);
                uint8_t *h = whi + 512 * (s - s0) + 128 * c, *l = wlo + 512 * (s - s0) + 128 * c;
                _mm512_store_si512(h, _mm512_mullo_epi16(q0, hi16));
                _mm512_store_si512(h + 64, _mm512_mullo_epi16(q1, hi16));
                _mm512_store_si512(l, _mm512_mullo_epi16(q0, lo16));
                _mm512_store_si512(l + 64, _mm512_mullo_epi16(q1, lo16));
            }
        }
    }

    // Q6_K: each quant times its sub-block's signed scale, w = sc (q - 32) (|w| <= 4096), split as
    // w = 128 hi + lo (lo = w & 127, hi = w >> 7 in -32 .. 32: both signed bytes), whi the high
    // parts, wlo the low ones (sub-blocks s0 .. s1 - 1, 256 bytes each from s0's: tile i = sub-blocks
    // 4i .. 4i + 3); weight tile row 4 (s mod 4) + k holds quad k (inputs 4k .. 4k + 3) of sub-block
    // s. A quad's bytes of 16 outputs are the VNNI kernel's vector q[k] (q6k_rows), scaled in 16-bit
    // lanes: even bytes, then odd ones.
    KERNEL_TARGET static void unpack_q6k(const uint8_t* r0, const uint8_t* r1, int64_t skip, int s0, int s1, uint8_t* whi,
                                         uint8_t* wlo) {
        using V = Zmm;
        using I = __m512i;
        const I lo7 = _mm512_set1_epi16(0x7F), byte = _mm512_set1_epi16(0xFF), half = V::set1(0xFFFF);
        for (int s = s0; s < s1; ++s) {
            prefetch_ahead<Q6K_REC, 16, VNNI_PREFETCH<16>>(r0, s, skip);
            prefetch_ahead<Q6K_REC, 16, VNNI_PREFETCH<16>>(r1, s, skip);
            const I sc = V::i8to32(r0 + 1536 + 8 * s, r1 + 1536 + 8 * s);  // lane o: output o's scale
            const I sc16 = V::or_(V::and_(sc, half), V::slli32(sc, 16));
            I q[4];
            q6k_quads<V>(r0, r1, s, q);
            for (int k = 0; k < 4; ++k) {
                const I we = _mm512_mullo_epi16(_mm512_srai_epi16(V::slli16(q[k], 8), 8), sc16);
                const I wo = _mm512_mullo_epi16(_mm512_srai_epi16(q[k], 8), sc16);
                const I lo = V::or_(V::and_(we, lo7), V::slli16(V::and_(wo, lo7), 8));
                const I hi = V::or_(V::and_(_mm512_srai_epi16(we, 7), byte), V::slli16(_mm512_srai_epi16(wo, 7), 8));
                _mm512_store_si512(whi + 256 * (s - s0) + 64 * k, hi);
                _mm512_store_si512(wlo + 256 * (s - s0) + 64 * k, lo);
            }
        }
    }

    // super-block b's float steps for NT rows from their sums c: acc[r] lane o += the row's int32
    // sum (Q4_K: 16 sum_hi + sum_lo, and the mins, as Q4kClose does; Q6_K: 128 sum_hi + sum_lo,
    // times d xs as q6k_rows does). The super-block's scales are read once for the NT rows: the
    // compiler cannot keep them across the stores to acc (a byte pointer may alias the floats),
    // and reloading them a row took a third of these steps' instructions.
    template <int KIND>
    using Step = std::conditional_t<KIND == 4, Q4kClose<Zmm>, Q6kClose>;

    template <int KIND>
    KERNEL_TARGET static Step<KIND> step_of(const uint8_t* w0, const uint8_t* w1, int64_t b) {
        constexpr int64_t REC = KIND == 4 ? Q4K_REC : Q6K_REC;
        return Step<KIND>(w0 + b * REC, w1 + b * REC);
    }

    // rows r0 .. r1 of close
    template <int KIND>
    KERNEL_TARGET static void close_rows(const Step<KIND>& step, int r0, int r1, const int32_t* c, const int32_t* msum,
                                         const float* xs, int64_t nb, int64_t b, int64_t t0, float* acc) {
        using V = Zmm;
        constexpr int shift = KIND == 4 ? 4 : 7;
        for (int r = r0; r < r1; ++r) {
            const __m512i sum = V::add(V::slli32(_mm512_load_si512(c + 16 * r), shift), _mm512_load_si512(c + 256 + 16 * r));
            const int64_t t = t0 + r;
            const int32_t* ms = KIND == 4 ? msum + (t * nb + b) * 4 : nullptr;
            _mm512_store_ps(acc + 16 * r, step(_mm512_load_ps(acc + 16 * r), sum, ms, xs[t * nb + b]));
        }
    }

    template <int KIND, int NT>
    KERNEL_TARGET static void close(const uint8_t* w0, const uint8_t* w1, const int32_t* c, const int32_t* msum,
                                    const float* xs, int64_t nb, int64_t b, int64_t t0, float* acc) {
        close_rows<KIND>(step_of<KIND>(w0, w1, b), 0, NT, c, msum, xs, nb, b, t0, acc);
    }

    // c = the tile sums (see Tiles::store) of a tile of NT rows of x (row stride xrow; x at a
    // super-block's first input) against that super-block's weight tiles w: four full-depth
    // products a part. With step, the NT float steps of the tile before it (its sums prev, rows t0p
    // at accp) run in four parts between the product pairs: the core overlaps the two better so.
    // Measured on an AMX Xeon (scripts/amx_parts.py --hot, 256 rows, 2 threads), tile products 59.6
    // ms alone, float steps 43.6, both 79.3 (products then all float steps: ~sum of the two); one
    // thread, spans 1.07-1.08x (kernel_ab.py), 12-16 rows 1.00-1.02x. The same steps in the same
    // order for every row: the same bits.
    template <int KIND, int NT>
    KERNEL_TARGET static void tile_sums(const int8_t* x, int64_t xrow, const uint8_t (*w)[8 * 512], int32_t* c,
                                        const Step<KIND>* step = nullptr, const int32_t* prev = nullptr,
                                        const int32_t* msum = nullptr, const float* xs = nullptr, int64_t nb = 0,
                                        int64_t b = 0, int64_t t0p = 0, float* accp = nullptr) {
        // the tile loads and stores are asm that the compiler does not see touch memory
        __asm__ volatile("" ::: "memory");
        Tiles::zero();
        for (int i = 0; i < 4; ++i) {
            Tiles::template product<KIND == 6>(x + 64 * i, xrow, w[0] + 1024 * i, w[1] + 1024 * i);
            constexpr int R = (NT + 3) / 4;
            if (step) close_rows<KIND>(*step, std::min(NT, R * i), std::min(NT, R * i + R), prev, msum, xs, nb, b, t0p, accp);
        }
        Tiles::store(c);
        __asm__ volatile("" ::: "memory");
    }

    // NT rows of x (row stride xrow, super-blocks xblk apart) against two groups of a KIND matrix.
    // Each weight tile is unpacked just before its products, into one of two 2 KB buffers: a
    // super-block's whole 8 KB of tiles, double-buffered, and 16 rows of x (24 KB at 1536
    // inputs) overflowed the 48 KB L1 (measured on an AMX Xeon: a third buffer made the 16-row
    // products 0.83x). Each tile is unpacked one tile ahead of its products, so its stores have
    // left for L1 before the tile loads read them (1.02-1.04x at 12 / 16 rows, one and two
    // threads). The previous super-block's float steps run between the products.
    template <int KIND, int NT>
    KERNEL_TARGET static void rows(const uint8_t* w0, const uint8_t* w1, const int8_t* x, int64_t xrow, int64_t xblk,
                                   const float* xs, const int32_t* msum, int64_t nb, int64_t t0, float* out, int64_t ldy,
                                   int valid) {
        constexpr int64_t REC = KIND == 4 ? Q4K_REC : Q6K_REC;
        constexpr int R = (NT + 3) / 4;  // the previous super-block's rows closed after each tile
        alignas(64) uint8_t tb[2][2][1024];
        alignas(64) int32_t sums[2][2 * 256];
        alignas(64) float acc[NT * 16] = {};
        Tiles::configure(NT);
        unpack_tile<KIND>(w0, w1, stream_skip<16, REC>(0, nb, 1), 0, tb[0][0], tb[0][1]);
        for (int64_t b = 0; b < nb; ++b) {
            const Step<KIND> step = step_of<KIND>(w0, w1, b > 0 ? b - 1 : 0);
            Tiles::zero();
            for (int i = 0; i < 4; ++i) {
                const int64_t nk = 4 * b + i + 1, nbk = nk >> 2;  // the next tile, unpacked ahead of this one's products
                if (nbk < nb)
                    unpack_tile<KIND>(w0 + nbk * REC, w1 + nbk * REC, stream_skip<16, REC>(nbk, nb, 1), int(nk & 3),
                                      tb[nk & 1][0], tb[nk & 1][1]);
                // the tile loads are asm that the compiler does not see read the stores above
                __asm__ volatile("" ::: "memory");
                Tiles::template product<KIND == 6>(x + b * xblk + 64 * i, xrow, tb[i & 1][0], tb[i & 1][1]);
                __asm__ volatile("" ::: "memory");
                if (b > 0)
                    close_rows<KIND>(step, std::min(NT, R * i), std::min(NT, R * i + R), sums[(b - 1) & 1], msum, xs, nb,
                                     b - 1, t0, acc);
            }
            Tiles::store(sums[b & 1]);
            __asm__ volatile("" ::: "memory");
        }
        close<KIND, NT>(w0, w1, sums[(nb - 1) & 1], msum, xs, nb, nb - 1, t0, acc);
        for (int r = 0; r < NT; ++r) Zmm::store(out + (t0 + r) * ldy, valid, _mm512_load_ps(acc + 16 * r));
    }

    // a super-block's weight tiles (spans), or tile i's alone (rows: i >= 0, into hi, lo [1024] each)
    template <int KIND>
    KERNEL_TARGET static void unpack(const uint8_t* r0, const uint8_t* r1, int64_t skip, uint8_t (*wt)[8 * 512]) {
        if constexpr (KIND == 4)
            unpack_q4k(r0, r1, skip, 0, 8, wt[0], wt[1]);
        else
            unpack_q6k(r0, r1, skip, 0, 16, wt[0], wt[1]);
    }
    template <int KIND>
    KERNEL_TARGET static void unpack_tile(const uint8_t* r0, const uint8_t* r1, int64_t skip, int i, uint8_t* hi, uint8_t* lo) {
        if constexpr (KIND == 4)
            unpack_q4k(r0, r1, skip, 2 * i, 2 * i + 2, hi, lo);
        else
            unpack_q6k(r0, r1, skip, 4 * i, 4 * i + 4, hi, lo);
    }

    // tiles x 16 rows (t0 ..) against two groups, each super-block's weight tiles unpacked once
    // for all of them instead of once a tile (prefill, checks of 32 tokens and more). Without the
    // unpacking the Q4_K kernel's tile products and float steps take 3.5 of its 6.1 ms at 16 rows
    // (weights in the caches, an AMX Xeon: BENCHMARKS.md, 2026-11-28). Each row takes the same
    // steps in the same order as in rows<KIND, 16>: the same bits. A tile's float steps run
    // between the next tile's products (tile_sums). One buffer of weight tiles, not two: the
    // 8 KB less in L1 measured 1.03 / 1.04 / 1.11x at 32 / 64 / 256 rows (an AMX Xeon, the
    // default target's products; the next super-block's unpacking waits for the tile loads of
    // the last row tile, which its stores may not overtake anyway).
    template <int KIND>
    KERNEL_TARGET static void span(const uint8_t* w0, const uint8_t* w1, const int8_t* x, int64_t xrow,
                                   const float* xs, const int32_t* msum, int64_t nb, int64_t t0, int64_t tiles,
                                   float* out, int64_t ldy, int valid) {
        constexpr int64_t REC = KIND == 4 ? Q4K_REC : Q6K_REC;
        alignas(64) uint8_t wt[2][8 * 512];  // one super-block's weight tiles (its high, low parts)
        alignas(64) int32_t sums[2][2 * 256];
        thread_local std::vector<float> acc_buf;  // the rows' float sums [tiles * 16][16], 64-byte aligned
        acc_buf.assign(tiles * 256 + 16, 0.0f);
        float* acc = acc_buf.data() + ((64 - reinterpret_cast<uintptr_t>(acc_buf.data()) % 64) % 64) / sizeof(float);
        Tiles::configure(16);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t (*w)[8 * 512] = wt;
            unpack<KIND>(w0 + b * REC, w1 + b * REC, stream_skip<16, REC>(b, nb, 1), wt);
            const Step<KIND> step = step_of<KIND>(w0, w1, b);
            tile_sums<KIND, 16>(x + b * 256, xrow, w, sums[0]);
            for (int64_t j = 1; j < tiles; ++j)
                tile_sums<KIND, 16>(x + 16 * j * xrow + b * 256, xrow, w, sums[j & 1], &step, sums[(j - 1) & 1], msum, xs, nb, b,
                                    t0 + 16 * (j - 1), acc + 256 * (j - 1));
            close<KIND, 16>(w0, w1, sums[(tiles - 1) & 1], msum, xs, nb, b, t0 + 16 * (tiles - 1), acc + 256 * (tiles - 1));
        }
        for (int64_t r = 0; r < 16 * tiles; ++r) Zmm::store(out + (t0 + r) * ldy, valid, _mm512_load_ps(acc + 16 * r));
    }

    // the driver's entry points (gguf_vnni_kernels.h matmul): Q4_K as the VNNI kernels take it, Q6_K
    // on row-major x with its scales xs (no msum), and the spans of either
    template <int NT>
    KERNEL_TARGET static void q4k(const uint8_t* w0, const uint8_t* w1, const int8_t* x, int64_t xrow, int64_t xblk,
                                  const float* xs, const int32_t* msum, int64_t nb, int64_t t0, float* out, int64_t ldy,
                                  int valid) {
        rows<4, NT>(w0, w1, x, xrow, xblk, xs, msum, nb, t0, out, ldy, valid);
    }
    template <int NT>
    KERNEL_TARGET static void q6k_x(const uint8_t* w0, const uint8_t* w1, const int8_t* x, int64_t xrow, const float* xs,
                                    int64_t nb, int64_t t0, float* out, int64_t ldy, int valid) {
        rows<6, NT>(w0, w1, x, xrow, 256, xs, nullptr, nb, t0, out, ldy, valid);
    }
    KERNEL_TARGET static void q4k_span(const uint8_t* w0, const uint8_t* w1, const int8_t* x, int64_t xrow,
                                       const float* xs, const int32_t* msum, int64_t nb, int64_t t0, int64_t tiles,
                                       float* out, int64_t ldy, int valid) {
        span<4>(w0, w1, x, xrow, xs, msum, nb, t0, tiles, out, ldy, valid);
    }
    KERNEL_TARGET static void q6k_span(const uint8_t* w0, const uint8_t* w1, const int8_t* x, int64_t xrow,
                                       const float* xs, int64_t nb, int64_t t0, int64_t tiles, float* out, int64_t ldy,
                                       int valid) {
        span<6>(w0, w1, x, xrow, xs, nullptr, nb, t0, tiles, out, ldy, valid);
    }
};

}  // namespace amx

bool cpu_has_amx_int8() {
    static const bool ok = [] {
#if defined(__linux__) && defined(__x86_64__)
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
        if (!(d & (1u << 24)) || !(d & (1u << 25)) || !cpu_has_avx512_vnni()) return false;  // AMX-TILE, AMX-INT8
        // Linux hands a process the tile registers' state only when it asks (ARCH_REQ_XCOMP_PERM
        // for XFEATURE_XTILEDATA); without it the first tile instruction faults
        return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
        return false;
#endif
    }();
    return ok;
}

// Rows of x from which a block takes the tiles: SPECDRAFT_AMX_MIN_ROWS or AMX_MIN_ROWS, unless
// set_amx_min_rows says otherwise (measuring, tests)
namespace {
int64_t default_min_rows() {
    const char* env = std::getenv("SPECDRAFT_AMX_MIN_ROWS");
    return env ? std::max<int64_t>(1, std::atoll(env)) : int64_t(AMX_MIN_ROWS);
}
std::atomic<int64_t> min_rows{default_min_rows()};
std::atomic<bool> emulated{false};
}  // namespace

int64_t amx_min_rows() { return min_rows.load(); }

void set_amx_min_rows(int64_t n) { min_rows = n > 0 ? n : default_min_rows(); }

bool amx_emulated() { return emulated.load(); }

void set_amx_emulated(bool on) { emulated = on; }

// Q6_K takes the tiles from AMX_MIN_ROWS rows as Q4_K does, its scales folded in as signed high and
// low parts (unpack_q6k). Measured on an AMX Xeon, the default target's products (output matrix
// included) against Q6_K on AVX-512 VNNI: 1.01 / 1.10 / 1.18 / 1.22x at 16 / 32 / 128 / 256 rows,
// the same bits; tiles of one sub-block each had measured slower than VNNI (151936 x 1536: 26.2 /
// 77.9 ms at 16 / 32 rows against 24.5 / 62.0).
void amx_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    if (T < amx_min_rows())
        vnni_matmul(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    else if (emulated.load())
        amx::matmul<amx::Zmm, 16, amx::AmxRows<amx::EmuTiles>>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    else
        amx::matmul<amx::Zmm, 16, amx::AmxRows<amx::HwTiles>>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
}

}  // namespace gguf
