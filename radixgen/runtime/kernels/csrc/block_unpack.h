/* A panel block's weights and scales in AVX-512 registers, for block_gemm.c's GEMM and block_dequant.c's
 * dequantization (the same unpacking, so both read the formats alike). */
#ifndef RADIXGEN_BLOCK_UNPACK_H
#define RADIXGEN_BLOCK_UNPACK_H
#include "block_format.h"
#include "simd_math.h"

#if defined(RG_AVX512)
/* 16 scales or mins (fp16 or float32 by format) from element i of a panel's array. */
static inline __attribute__((always_inline)) __m512 load16(const int fmt, const void *p, int64_t i) {
    return FMT_F32(fmt) ? _mm512_loadu_ps((const float *)p + i)
                        : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}

/* Block b's scales d[h] and mins m[h] of a panel's 16 rows (K-quants: computed from their integers and
 * factors as gguf does, each product exact). */
static inline __attribute__((always_inline)) void scales16(const int fmt, const rg_panel *v, int64_t b, __m512 *d,
                                                            __m512 *m) {
    if (fmt == FMT_K4) {
        const uint16_t *f = (const uint16_t *)v->sup + (b / 8) * 32;
        const __m512 fd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)f));
        const __m512 fm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(f + 16)));
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(v->d + b * 16))));
        const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(v->m + b * 16))));
        d[0] = _mm512_mul_ps(fd, sc);
        m[0] = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(fm, mn));
        return;
    }
    if (fmt == FMT_K6) {
        const uint16_t *f = (const uint16_t *)v->sup + (b / 8) * 16;
        const __m512 fd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)f));
        for (int h = 0; h < 2; h++) {
            const __m128i sc = _mm_loadu_si128((const __m128i *)(v->d + (b * 2 + h) * 16));
            d[h] = _mm512_mul_ps(fd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
            m[h] = _mm512_mul_ps(_mm512_set1_ps(-32.0f), d[h]);
        }
        return;
    }
    for (int h = 0; h < FMT_HALVES(fmt); h++) {
        d[h] = load16(fmt, v->d, (b * FMT_HALVES(fmt) + h) * 16);
        m[h] = FMT_HAS_MIN(fmt) ? load16(fmt, v->m, (b * FMT_HALVES(fmt) + h) * 16) : _mm512_setzero_ps();
    }
}

/* w[g]: k = 4g .. 4g + 3 of the panel block qb's 16 rows as unsigned bytes (I8H: signed int8 + 128). */
static inline __attribute__((always_inline)) void weights16(const int fmt, const uint8_t *qb, __m512i *w) {
    if (FMT_NIBBLES(fmt)) {
        for (int g = 0; g < 4; g++) {
            const __m512i x = _mm512_loadu_si512(qb + 64 * g);
            w[g] = _mm512_and_si512(x, _mm512_set1_epi8(15));
            w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(15));
        }
        /* The high bits shifted straight to bit 4 (16-bit shifts by at most 4 keep each byte's own bits
         * there), then masked and or-ed in: one vpternlogd. */
        if (FMT_Q5(fmt)) {  /* the high bit: plane vector bit g */
            const __m512i hi = _mm512_loadu_si512(qb + 256);
            for (int g = 0; g < 8; g++) {
                const __m512i at4 = g <= 4 ? _mm512_slli_epi16(hi, 4 - g) : _mm512_srli_epi16(hi, g - 4);
                w[g] = _mm512_or_si512(w[g], _mm512_and_si512(at4, _mm512_set1_epi8(0x10)));
            }
        }
        if (fmt == FMT_K6)  /* the high 2 bits: plane vector g & 1, bits 2 (g / 2) */
            for (int g = 0; g < 8; g++) {
                const __m512i hi = _mm512_loadu_si512(qb + 256 + 64 * (g & 1));
                const int j = g / 2;
                const __m512i at4 = j <= 2 ? _mm512_slli_epi16(hi, 4 - 2 * j) : _mm512_srli_epi16(hi, 2 * j - 4);
                w[g] = _mm512_or_si512(w[g], _mm512_and_si512(at4, _mm512_set1_epi8(0x30)));
            }
    } else {  /* signed int8 + 128 as unsigned: the GEMM takes the offset off with the limbs' sums */
        for (int g = 0; g < 8; g++) {
            const __m512i x = _mm512_loadu_si512(qb + 64 * g);
            w[g] = fmt == FMT_I8H ? _mm512_xor_si512(x, _mm512_set1_epi8(-128)) : x;
        }
    }
}
#endif
#endif
