// The AVX-512 traits of the VNNI kernels: two 8-row groups a zmm. Included inside a namespace, after
// gguf_vnni_kernels.h, by each source whose target attribute (KERNEL_TARGET) has AVX-512 VNNI
// (gguf_vnni.cpp, gguf_amx.cpp).

// Two groups of 8 rows a 512-bit vector: lanes 0-7 group g0's rows, 8-15 g1's (records a, b)
struct Zmm {
    static constexpr int GROUPS = 2;
    using I = __m512i;
    using F = __m512;
    KERNEL_TARGET static I load32(const uint8_t* a, const uint8_t* b) {
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)a)),
                                  _mm256_loadu_si256((const __m256i*)b), 1);
    }
    KERNEL_TARGET static __m128i load8x2(const uint8_t* a, const uint8_t* b) {
        return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)a), _mm_loadl_epi64((const __m128i*)b));
    }
    KERNEL_TARGET static I u8to32(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepu8_epi32(load8x2(a, b)); }
    KERNEL_TARGET static I i8to32(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepi8_epi32(load8x2(a, b)); }
    KERNEL_TARGET static I u8to16(const uint8_t* a, const uint8_t* b) {
        return _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)a)),
                                                            _mm_loadu_si128((const __m128i*)b), 1));
    }
    KERNEL_TARGET static F load8f(const uint8_t* a, const uint8_t* b) { return _mm512_castsi512_ps(load32(a, b)); }
    VNNI_LANE_OPS(_mm512, si512)
    KERNEL_TARGET static I dpbusd(I acc, I u8, I s8) { return _mm512_dpbusd_epi32(acc, u8, s8); }
    KERNEL_TARGET static I dpwssd(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
    KERNEL_TARGET static void store(float* p, int valid, F v) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << valid) - 1), v); }
};
