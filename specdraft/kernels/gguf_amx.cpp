// The Q4_K kernel for CPUs with AMX-INT8 (Sapphire Rapids and later): one tile multiply (tdpbsud)
// a sub-block forms the exact sums q x of up to 16 rows of x against 16 output rows (two 8-row
// groups, the records' own interleaving: a record chunk of 8 rows x 4 bytes is half a row of the
// weight tile). Those are the int32 sums the VNNI kernel forms with 8 vpdpbusd a row of x, so
// from there on the steps are its own, lane for lane: the floats are bit for bit the AVX2
// kernels'. Below AMX_MIN_ROWS rows of x, and for Q6_K, the AVX-512 VNNI kernels run instead.
// Built in every build with target attributes, called only where cpu_has_amx_int8 says so.
#include <ATen/Parallel.h>
#include <cpuid.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
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

// Tiles 0-2 take even sub-blocks, 3-5 odd ones (two products in flight): A (0, 3) n rows of x,
// K bytes each; B (1, 4) the weights, K / 4 rows of 16 columns (output rows) x 4 bytes (inputs);
// C (2, 5) their product, n rows x 16 int32. K: a sub-block's inputs (32).
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Loads the configuration unless this thread's tiles have it already (read back with sttilecfg:
// other code of the process, oneDNN's, may configure tiles too), so a thread's tiles stay
// configured from one task of 16 output rows to the next instead of a release and reload each.
KERNEL_TARGET inline void configure(int n, int k) {
    TileConfig want, have;
    for (int set = 0; set < 6; set += 3) {
        want.rows[set] = n, want.colsb[set] = k;
        want.rows[set + 1] = k / 4, want.colsb[set + 1] = 64;
        want.rows[set + 2] = n, want.colsb[set + 2] = 64;
    }
    _tile_storeconfig(&have);
    // the config intrinsics' asm declares pointer-sized operands: these barriers keep the whole
    // structs written (want) and read (have)
    __asm__ volatile("" ::"r"(&want), "r"(&have) : "memory");
    if (std::memcmp(&want, &have, sizeof want) != 0) _tile_loadconfig(&want);
}

#define TILE_PRODUCT(A, B, C, wt, x, in, prod) \
    do {                                        \
        _tile_loadd(B, wt, 64);                 \
        _tile_loadd(A, x, in);                  \
        _tile_zero(C);                          \
        _tile_dpbsud(C, A, B);                  \
        _tile_stored(C, prod, 64);              \
    } while (0)

// prod[s][r][0 .. 16) = sum_k x[r][K s + k] * wt[s][k / 4][4 lane + k % 4] for the NT rows of x
// (row stride in) and the SUB sub-blocks of a super-block. The weight tiles were written by vector
// stores that the tile loads (asm the compiler cannot see reading memory) must come after. A
// whole super-block a phase: its unpacking, then its products, then their scales, so the round
// trips through memory (vector stores -> tile loads, tile stores -> vector loads) overlap.
template <int NT, int SUB, int K>
KERNEL_TARGET inline void sub_products(const uint8_t* wt, const int8_t* xb, int64_t in, int32_t* prod) {
    __asm__ volatile("" ::"r"(wt) : "memory");
    for (int s = 0; s < SUB; s += 2) {
        TILE_PRODUCT(0, 1, 2, wt + s * 16 * K, xb + K * s, in, prod + s * NT * 16);
        TILE_PRODUCT(3, 4, 5, wt + (s + 1) * 16 * K, xb + K * (s + 1), in, prod + (s + 1) * NT * 16);
    }
}

struct AmxRows {
    static constexpr bool HAS_Q6K = false;  // Q6_K stays on AVX-512 VNNI (see amx_matmul)
    // NT rows of x against two groups of a Q4_K matrix (as q4k_rows of gguf_vnni_kernels.h, whose
    // mins and float steps these are): sub-block s's weight tile row 2c holds the low nibbles of
    // record chunk c (inputs 8c .. 8c + 3 of the sub-block), row 2c + 1 the high ones (+ 4 .. 7)
    template <int NT>
    KERNEL_TARGET static void q4k(const uint8_t* w0, const uint8_t* w1, const int8_t* qx, const float* xs,
                                  const int32_t* msum, int64_t nb, int64_t in, int64_t t0, float* out, int64_t ldy,
                                  int valid) {
        using V = Zmm;
        using I = __m512i;
        using F = __m512;
        const I low4 = V::bytes(0x0F);
        alignas(64) uint8_t wt[8 * 512];
        alignas(64) int32_t prod[8 * NT * 16];
        alignas(64) float acc[NT * 16] = {};
        configure(NT, 32);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *r0 = w0 + b * Q4K_REC, *r1 = w1 + b * Q4K_REC;
            const int64_t skip = b + VNNI_PREFETCH<NT> < nb ? 0 : nb * Q4K_REC;
            for (int s = 0; s < 8; ++s) {  // sub-block s: inputs 32s .. 32s + 31
                prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r0, s, skip);
                prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r1, s, skip);
                for (int c = 0; c < 4; ++c) {
                    const I v = V::load32(r0 + 128 * s + 32 * c, r1 + 128 * s + 32 * c);
                    _mm512_store_si512(wt + 512 * s + 128 * c, V::and_(v, low4));
                    _mm512_store_si512(wt + 512 * s + 128 * c + 64, V::and_(V::srli16(v, 4), low4));
                }
            }
            sub_products<NT, 8, 32>(wt, qx + t0 * in + b * 256, in, prod);
            I sum[NT];
            for (int r = 0; r < NT; ++r) sum[r] = V::zero();
            for (int s = 0; s < 8; ++s) {
                const I sc = V::u8to32(r0 + 1024 + 8 * s, r1 + 1024 + 8 * s);
                const int32_t* p = prod + s * NT * 16;
                for (int r = 0; r < NT; ++r) sum[r] = V::add(sum[r], V::mullo(_mm512_load_si512(p + 16 * r), sc));
            }
            const Q4kClose<V> close(r0, r1);
            for (int r = 0; r < NT; ++r) {
                const F a = close(_mm512_load_ps(acc + 16 * r), sum[r], msum + ((t0 + r) * nb + b) * 4, xs[(t0 + r) * nb + b]);
                _mm512_store_ps(acc + 16 * r, a);
            }
        }
        for (int r = 0; r < NT; ++r) V::store(out + (t0 + r) * ldy, valid, _mm512_load_ps(acc + 16 * r));
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

// Rows of x from which a block takes the tiles (SPECDRAFT_AMX_MIN_ROWS overrides, for measuring)
int64_t amx_min_rows() {
    static const int64_t n = [] {
        const char* env = std::getenv("SPECDRAFT_AMX_MIN_ROWS");
        return env ? std::max<int64_t>(1, std::atoll(env)) : int64_t(AMX_MIN_ROWS);
    }();
    return n;
}

// Q6_K takes the AVX-512 VNNI kernels at every block size: its sub-blocks of 16 inputs make twice
// the tile round trips and scale steps of Q4_K's, and tiles measured slower there (Sapphire
// Rapids, 2 threads, the 151936 x 1536 output matrix: 21.5 / 26.2 / 77.9 ms at 8 / 16 / 32 rows
// against 14.1 / 24.5 / 62.0 with VNNI; Q4_K 17920 x 1536: 1.87 / 3.35 against 2.27 / 4.34 at 16 / 32)
void amx_matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs,
                const int16_t* bsums, int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    if (kind != 4 || T < amx_min_rows())
        vnni_matmul(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
    else
        amx::matmul<amx::Zmm, 16, amx::AmxRows>(kind, pw, groups, qx, xs, bsums, T, in, O, y, ldy);
}

}  // namespace gguf
