// The VNNI kernels over GGUF Q4_K / Q6_K records, written once for any vector width. Included
// inside a namespace by each ISA's source (gguf_vnni.cpp: AVX-512, gguf_avxvnni.cpp: AVX-VNNI),
// after it defines KERNEL_TARGET (its target attribute) and traits V (one or two 8-row groups a
// vector, the intrinsics); everything this uses is included there.
//
// Bitwise the AVX2 results (gguf_matmul.cpp): per super-block both form the same exact int32 sums
// (sum_s sc * sum q x; the mins' sum_s mn * sum x), then take the same float steps per (t, o)
// (cvt, d * xs, fma; dmin * xs, fnmadd), lane for lane. How the integers are got differs:
// vpdpbusd multiplies 4 unsigned quants by 4 signed x and adds them into an int32 lane. A lane
// is one output row of one group and a chunk of the record (8 rows x 4 bytes) wants the same 4
// inputs in every lane, so x is one broadcast dword a vpdpbusd, also with two groups a vector.

// The traits' lane-wise operations, the same for ymm (P _mm256, SI si256) and zmm (_mm512, si512)
#define VNNI_LANE_OPS(P, SI)                                                                        \
    KERNEL_TARGET static I bcast4(const void* x) { int32_t v; std::memcpy(&v, x, 4); return P##_set1_epi32(v); } \
    KERNEL_TARGET static I set1(int32_t v) { return P##_set1_epi32(v); }                            \
    KERNEL_TARGET static I bytes(char v) { return P##_set1_epi8(v); }                               \
    KERNEL_TARGET static I zero() { return P##_setzero_##SI(); }                                    \
    KERNEL_TARGET static I and_(I a, I b) { return P##_and_##SI(a, b); }                            \
    KERNEL_TARGET static I or_(I a, I b) { return P##_or_##SI(a, b); }                              \
    KERNEL_TARGET static I srli16(I a, int n) { return P##_srli_epi16(a, n); }                      \
    KERNEL_TARGET static I slli16(I a, int n) { return P##_slli_epi16(a, n); }                      \
    KERNEL_TARGET static I add(I a, I b) { return P##_add_epi32(a, b); }                            \
    KERNEL_TARGET static I sub(I a, I b) { return P##_sub_epi32(a, b); }                            \
    KERNEL_TARGET static I subb(I a, I b) { return P##_sub_epi8(a, b); }                            \
    KERNEL_TARGET static I slli32(I a, int n) { return P##_slli_epi32(a, n); }                      \
    KERNEL_TARGET static I mullo(I a, I b) { return P##_mullo_epi32(a, b); }                        \
    KERNEL_TARGET static F fzero() { return P##_setzero_ps(); }                                     \
    KERNEL_TARGET static F fload(const float* p) { return P##_load_ps(p); }                         \
    KERNEL_TARGET static void fstore(float* p, F v) { P##_store_ps(p, v); }                         \
    KERNEL_TARGET static F fset1(float v) { return P##_set1_ps(v); }                                \
    KERNEL_TARGET static F cvt(I a) { return P##_cvtepi32_ps(a); }                                  \
    KERNEL_TARGET static F mul(F a, F b) { return P##_mul_ps(a, b); }                               \
    KERNEL_TARGET static F fmadd(F a, F b, F c) { return P##_fmadd_ps(a, b, c); }                   \
    KERNEL_TARGET static F fnmadd(F a, F b, F c) { return P##_fnmadd_ps(a, b, c); }

// One group of 8 rows a 256-bit vector: the including source defines YMM_DPBUSD and YMM_DPWSSD
// (the EVEX or the VEX form of vpdpbusd / vpdpwssd on ymm)
struct Ymm {
    static constexpr int GROUPS = 1;
    using I = __m256i;
    using F = __m256;
    KERNEL_TARGET static I load32(const uint8_t* a, const uint8_t*) { return _mm256_loadu_si256((const __m256i*)a); }
    KERNEL_TARGET static I u8to32(const uint8_t* a, const uint8_t*) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)a)); }
    KERNEL_TARGET static I i8to32(const uint8_t* a, const uint8_t*) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)a)); }
    KERNEL_TARGET static I u8to16(const uint8_t* a, const uint8_t*) { return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)a)); }
    KERNEL_TARGET static F load8f(const uint8_t* a, const uint8_t*) { return _mm256_loadu_ps((const float*)a); }
    VNNI_LANE_OPS(_mm256, si256)
    KERNEL_TARGET static I dpbusd(I acc, I u8, I s8) { return YMM_DPBUSD(acc, u8, s8); }
    KERNEL_TARGET static I dpwssd(I acc, I a, I b) { return YMM_DPWSSD(acc, a, b); }
    KERNEL_TARGET static void store(float* p, int valid, F v) {
        if (valid == 8) return _mm256_storeu_ps(p, v);
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, v);
        std::memcpy(p, tmp, valid * sizeof(float));
    }
};

// A Q4_K super-block's closing steps for V::GROUPS groups (records r0, r1): given a row of x's
// int32 sums sum_s sc sum q x, acc + sum * d x - (sum_s mn * sum x) * dmin x, lane for lane the
// AVX2 kernel's float steps. The mins come as i16 pairs per row ([pair k][row][2]), one vpdpwssd
// per pair k against the row's sub-block pair sums ms[k].
template <class V>
struct Q4kClose {
    typename V::I mn[4];
    typename V::F d, dmin;
    KERNEL_TARGET Q4kClose(const uint8_t* r0, const uint8_t* r1) {
        for (int k = 0; k < 4; ++k) mn[k] = V::u8to16(r0 + 1088 + 16 * k, r1 + 1088 + 16 * k);
        d = V::load8f(r0 + 1152, r1 + 1152), dmin = V::load8f(r0 + 1184, r1 + 1184);
    }
    KERNEL_TARGET typename V::F operator()(typename V::F acc, typename V::I sum, const int32_t* ms, float xs) const {
        typename V::I m = V::zero();
        for (int k = 0; k < 4; ++k) m = V::dpwssd(m, mn[k], V::set1(ms[k]));
        const typename V::F x = V::fset1(xs);
        acc = V::fmadd(V::cvt(sum), V::mul(d, x), acc);
        return V::fnmadd(V::cvt(m), V::mul(dmin, x), acc);
    }
};

// NT rows of x against V::GROUPS groups of a Q4_K matrix (w0, w1: their nb records, lanes 8k..8k+7
// are group k's rows), out: y[t0, 8 g0]. Per sub-block of 32 inputs: 8 vpdpbusd a row give each
// lane its sum q x (|.| <= 32 * 15 * 127, no 16-bit step), one vpmulld applies the row's scale.
// msum[t, b, k]: sub-blocks 2k, 2k + 1's sums of x as two i16 (the mins' vpdpwssd operand).
// x0: the tile's first row; row r's super-block b at x0 + r * xrow + b * xblk (row-major: in and
// 256; tile-major: 256 and NT * 256, see matmul). TILED: tile-major with those strides known when
// compiled, so every row's bytes are one base register's fixed offsets: with a stride known only
// at run time gcc keeps a pointer a row, and 16 rows' pointers spill (95 GPR moves a sub-block
// against 33; the same bits).
template <class V, int NT, bool TILED = false>
KERNEL_TARGET void q4k_rows(const uint8_t* w0, const uint8_t* w1, const int8_t* x0, int64_t xrow_, int64_t xblk_,
                            const float* xs, const int32_t* msum, int64_t nb, int64_t t0, float* out, int64_t ldy,
                            int valid) {
    const int64_t xrow = TILED ? 256 : xrow_, xblk = TILED ? NT * 256 : xblk_;
    using I = typename V::I;
    using F = typename V::F;
    const I low4 = V::bytes(0x0F);
    F acc[NT];
    for (int r = 0; r < NT; ++r) acc[r] = V::fzero();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *r0 = w0 + b * Q4K_REC, *r1 = w1 + b * Q4K_REC;
        const int64_t skip = stream_skip<NT, Q4K_REC>(b, nb, V::GROUPS - 1);
        const int8_t* xb = x0 + b * xblk;
        I sum[NT];
        for (int r = 0; r < NT; ++r) sum[r] = V::zero();
        for (int s = 0; s < 8; ++s) {  // sub-block s: inputs 32s .. 32s + 31
            prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r0, s, skip);
            if (V::GROUPS == 2) prefetch_ahead<Q4K_REC, 8, VNNI_PREFETCH<NT>>(r1, s, skip);
            const I sc = V::u8to32(r0 + 1024 + 8 * s, r1 + 1024 + 8 * s);
            I dot[NT];
            for (int r = 0; r < NT; ++r) dot[r] = V::zero();
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {  // inputs 32s + 8c .. + 3 (low nibbles), + 4 .. + 7 (high)
                const I v = V::load32(r0 + 128 * s + 32 * c, r1 + 128 * s + 32 * c);
                const I lo = V::and_(v, low4), hi = V::and_(V::srli16(v, 4), low4);
                for (int r = 0; r < NT; ++r) {
                    const int8_t* x = xb + r * xrow + 32 * s + 8 * c;
                    dot[r] = V::dpbusd(dot[r], lo, V::bcast4(x));
                    dot[r] = V::dpbusd(dot[r], hi, V::bcast4(x + 4));
                }
            }
            for (int r = 0; r < NT; ++r) sum[r] = V::add(sum[r], V::mullo(dot[r], sc));
        }
        const Q4kClose<V> close(r0, r1);
        for (int r = 0; r < NT; ++r)
            acc[r] = close(acc[r], sum[r], msum + ((t0 + r) * nb + b) * 4, xs[(t0 + r) * nb + b]);
    }
    for (int r = 0; r < NT; ++r) V::store(out + (t0 + r) * ldy, valid, acc[r]);
}

// Sub-block s of Q6_K records r0, r1 (V::GROUPS groups): q[k] = quad k's quants - 32 (inputs 16s + 4k
// .. + 3, signed bytes), lane o output o's four; a quad's top 2 bits are bits 2k, 2k + 1 of h's
// bytes, moved to bits 4, 5
template <class V>
KERNEL_TARGET inline void q6k_quads(const uint8_t* r0, const uint8_t* r1, int s, typename V::I (&q)[4]) {
    using I = typename V::I;
    const I low4 = V::bytes(0x0F), top2 = V::bytes(0x30), m32 = V::bytes(32);
    const I v0 = V::load32(r0 + 64 * s, r1 + 64 * s), v1 = V::load32(r0 + 64 * s + 32, r1 + 64 * s + 32);
    const I h = V::load32(r0 + 1024 + 32 * s, r1 + 1024 + 32 * s);
    q[0] = V::subb(V::or_(V::and_(v0, low4), V::and_(V::slli16(h, 4), top2)), m32);
    q[1] = V::subb(V::or_(V::and_(V::srli16(v0, 4), low4), V::and_(V::slli16(h, 2), top2)), m32);
    q[2] = V::subb(V::or_(V::and_(v1, low4), V::and_(h, top2)), m32);
    q[3] = V::subb(V::or_(V::and_(V::srli16(v1, 4), low4), V::and_(V::srli16(h, 2), top2)), m32);
}

// NT rows of x against V::GROUPS groups of a Q6_K matrix, as q4k_rows, x taken as u = x + 128
// (u8) and each quant as q - 32 (s8): per sub-block of 16 inputs 4 vpdpbusd give each lane its
// sum (q - 32) u (|.| <= 16 * 32 * 255) and one vpmulld its scale. Of the total, sum_s sc[s] *
// sum (q - 32) (x + 128), the part 128 * sum_s sc[s] * sum (q - 32) is the weights' own: the
// record keeps it per row (off, made when the records are), and one vpsubd a super-block leaves
// sum_s sc[s] * sum (q - 32) x, the int32 the AVX2 kernel's 16-bit lanes add up to (all int32
// steps wrap alike, and the result fits). Before, the -32 took 8 vpdpwssd a row and super-block
// against x's sums: 8 multiplies more per 64 products on the two ports vpdpbusd and vpmulld share.
// x comes tile-major (xt [nb][NT][256] u8, xst [nb][NT], see matmul): one base register addresses
// every row's bytes, where NT row pointers spilled (measured, Zen 5, one thread, weights in cache,
// 16 rows: 3.7 G vpdpbusd/s before, 4.6 with the folded -32, 5.1 with x tile-major too).
template <class V, int NT>
KERNEL_TARGET void q6k_rows(const uint8_t* w0, const uint8_t* w1, const uint8_t* xt, const float* xst, int64_t nb,
                            float* out, int64_t ldy, int valid) {
    using I = typename V::I;
    using F = typename V::F;
    alignas(64) float acc[NT][sizeof(F) / sizeof(float)];  // in L1: touched once a super-block
    for (int r = 0; r < NT; ++r) V::fstore(acc[r], V::fzero());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *r0 = w0 + b * Q6K_REC, *r1 = w1 + b * Q6K_REC;
        const int64_t skip = stream_skip<NT, Q6K_REC>(b, nb, V::GROUPS - 1);
        const uint8_t* xb = xt + b * NT * 256;
        I sum[NT];
        for (int r = 0; r < NT; ++r) sum[r] = V::zero();
        for (int s = 0; s < 16; ++s) {  // sub-block s: inputs 16s .. 16s + 15, quads k of 4 inputs
            prefetch_ahead<Q6K_REC, 16, VNNI_PREFETCH<NT>>(r0, s, skip);
            if (V::GROUPS == 2) prefetch_ahead<Q6K_REC, 16, VNNI_PREFETCH<NT>>(r1, s, skip);
            const I sc = V::i8to32(r0 + 1536 + 8 * s, r1 + 1536 + 8 * s);
            I q[4];
            q6k_quads<V>(r0, r1, s, q);
#pragma GCC unroll 16
            for (int r = 0; r < NT; ++r) {
                const uint8_t* x = xb + r * 256 + 16 * s;
                I p = V::dpbusd(V::zero(), V::bcast4(x), q[0]);
                for (int k = 1; k < 4; ++k) p = V::dpbusd(p, V::bcast4(x + 4 * k), q[k]);
                sum[r] = V::add(sum[r], V::mullo(p, sc));
            }
        }
        const I off = V::load32(r0 + 1696, r1 + 1696);
        const F d = V::load8f(r0 + 1664, r1 + 1664);
        for (int r = 0; r < NT; ++r)
            V::fstore(acc[r], V::fmadd(V::cvt(V::sub(sum[r], off)), V::mul(d, V::fset1(xst[b * NT + r])), V::fload(acc[r])));
    }
    for (int r = 0; r < NT; ++r) V::store(out + r * ldy, valid, V::fload(acc[r]));
}

// The VNNI row kernels as the driver below takes them (another ISA's file brings its own: gguf_amx.cpp)
template <class V>
struct VnniRows {
    static constexpr bool TAKES_X_TILES = true;  // q4k reads x row-major or tile-major (q4k_rows)
    static constexpr bool HAS_SPAN = false;  // no q4k_span (see gguf_amx.cpp)
    static constexpr bool Q6K_ROW_MAJOR = false;  // q6k reads x + 128 tile-major (q6k_rows)
    template <int NT>
    KERNEL_TARGET static void q4k(const uint8_t* w0, const uint8_t* w1, const int8_t* x0, int64_t xrow, int64_t xblk,
                                  const float* xs, const int32_t* msum, int64_t nb, int64_t t0, float* out, int64_t ldy,
                                  int valid) {
        if (NT > 1 && xrow == 256 && xblk == NT * 256)
            q4k_rows<V, NT, true>(w0, w1, x0, xrow, xblk, xs, msum, nb, t0, out, ldy, valid);
        else
            q4k_rows<V, NT, false>(w0, w1, x0, xrow, xblk, xs, msum, nb, t0, out, ldy, valid);
    }
    template <int NT>
    KERNEL_TARGET static void q6k(const uint8_t* w0, const uint8_t* w1, const uint8_t* xt, const float* xst, int64_t nb,
                                  float* out, int64_t ldy, int valid) {
        q6k_rows<V, NT>(w0, w1, xt, xst, nb, out, ldy, valid);
    }
};

// y[t, 0 .. O) (row stride ldy) for T rows of quantized x against kind 4 / 6 records pw [groups,
// nb * REC]: tasks of V::GROUPS groups (an odd last group paired with itself, its copy's lanes
// not stored) split across threads, each over tiles of up to TILE rows of Rows' kernels.
template <class V, int TILE, class Rows = VnniRows<V>>
void matmul(int64_t kind, const uint8_t* pw, int64_t groups, const int8_t* qx, const float* xs, const int16_t* bsums,
            int64_t T, int64_t in, int64_t O, float* y, int64_t ldy) {
    const int64_t nb = in / 256, n16 = T * in / 16, rec = kind == 4 ? Q4K_REC : Q6K_REC;
    // Q4_K: sub-block pairs' sums of x (two i16 in an int32, as the AVX2 kernel forms them)
    std::vector<int32_t> aux(kind == 4 ? n16 / 4 : 0);
    for (int64_t u = 0; u < (int64_t)aux.size(); ++u) {
        const int16_t* bs = bsums + 4 * u;
        aux[u] = (int32_t)((uint32_t)(uint16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(bs[2] + bs[3]) << 16);
    }
    // Q6_K: x + 128 and xs tile-major, each tile of n rows (t0 .. t0 + n, as over_tiles cuts T)
    // at xu + t0 * in as [nb][n][256] and at xst + t0 * nb as [nb][n]. Q4_K: x tile-major too
    // (as it is) where its rows' stride is a multiple of 4 KB: row-major, a super-block's rows then
    // fall into one L1 set each and evict one another (a 2048 x 8192 product at 16 rows: 53% of
    // the vpdpbusd rate against 76-79% for other shapes); and for the 16-row pass (T > 8), whose
    // row pointers spill row-major (q4k_rows' TILED; scripts/kernel_ab.py, Zen 5, 2 threads: 16 /
    // 64 / 128 / 256 rows 1.03 / 1.03 / 1.04 / 1.11x; prefill of 128-700 tokens 1-4%). Fewer rows
    // read row-major as fast.
    const bool q4k_tiles = kind == 4 && Rows::TAKES_X_TILES && (T > 8 || (in % 4096 == 0 && T > 1));
    const bool q6k_tiles = kind == 6 && !Rows::Q6K_ROW_MAJOR;
    std::vector<uint8_t> xu(q6k_tiles || q4k_tiles ? T * in : 0);
    std::vector<float> xst(q6k_tiles ? T * nb : 0);
    if (q6k_tiles || q4k_tiles)
        over_tiles<TILE>(T, [&](auto nt, int64_t t0) {
            constexpr int n = decltype(nt)::value;
            const uint8_t flip = kind == 6 ? 0x80 : 0;
            for (int64_t b = 0; b < nb; ++b)
                for (int r = 0; r < n; ++r) {
                    const int8_t* src = qx + (t0 + r) * in + 256 * b;
                    uint8_t* dst = xu.data() + t0 * in + (b * n + r) * 256;
                    for (int i = 0; i < 256; ++i) dst[i] = (uint8_t)src[i] ^ flip;
                    if (kind == 6) xst[t0 * nb + b * n + r] = xs[(t0 + r) * nb + b];
                }
        });
    const int32_t* pa = aux.data();
    at::parallel_for(0, (groups + V::GROUPS - 1) / V::GROUPS, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const int64_t g0 = V::GROUPS * p, g1 = g0 + V::GROUPS - 1 < groups ? g0 + V::GROUPS - 1 : g0;
            const int valid = (int)std::min<int64_t>(O - g0 * GROUP, V::GROUPS * GROUP);
            const uint8_t *w0 = pw + g0 * nb * rec, *w1 = pw + g1 * nb * rec;
            // Rows with a q4k_span take T's full tiles of TILE rows in one call (from two tiles on),
            // the rows after them as below
            int64_t spanned = 0;
            if constexpr (Rows::HAS_SPAN) {
                static_assert(TILE == 16, "the spans take tiles of 16 rows");
                if (T >= 2 * TILE) {
                    spanned = T / TILE * TILE;
                    if (kind == 4)
                        Rows::q4k_span(w0, w1, qx, in, xs, pa, nb, 0, spanned / TILE, y + g0 * GROUP, ldy, valid);
                    else
                        Rows::q6k_span(w0, w1, qx, in, xs, nb, 0, spanned / TILE, y + g0 * GROUP, ldy, valid);
                }
            }
            over_tiles<TILE>(T - spanned, [&](auto nt, int64_t t) {
                constexpr int n = decltype(nt)::value;
                const int64_t t0 = t + spanned;
                if (kind == 4 && q4k_tiles)
                    Rows::template q4k<n>(w0, w1, (const int8_t*)xu.data() + t0 * in, 256, n * 256, xs, pa, nb, t0,
                                          y + g0 * GROUP, ldy, valid);
                else if (kind == 4)
                    Rows::template q4k<n>(w0, w1, qx + t0 * in, in, 256, xs, pa, nb, t0, y + g0 * GROUP, ldy, valid);
                else if constexpr (Rows::Q6K_ROW_MAJOR)
                    Rows::template q6k_x<n>(w0, w1, qx + t0 * in, in, xs, nb, t0, y + g0 * GROUP, ldy, valid);
                else
                    Rows::template q6k<n>(w0, w1, xu.data() + t0 * in, xst.data() + t0 * nb, nb, y + g0 * GROUP + t0 * ldy,
                                          ldy, valid);
            });
        }
    });
}
