/* A panel block's weights and scales in AVX-512 registers (AVX2: a half panel's, 8 rows), for block_gemm.c's
 * GEMM and block_dequant.c's dequantization (the same unpacking, so both read the formats alike). */
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
#elif defined(RG_AVX2)
/* 8 scales or mins (fp16 or float32 by format) from element i of a panel's array. */
static inline __attribute__((always_inline)) __m256 load8(const int fmt, const void *p, int64_t i) {
    return FMT_F32(fmt) ? _mm256_loadu_ps((const float *)p + i)
                        : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}

/* Block b's scales d[s] and mins m[s] of rows 8h .. 8h + 7 of a panel (as scales16 in the AVX-512 path). */
static inline __attribute__((always_inline)) void scales8(const int fmt, const rg_panel *v, int64_t b, int h,
                                                           __m256 *d, __m256 *m) {
    if (fmt == FMT_K4) {
        const uint16_t *f = (const uint16_t *)v->sup + (b / 8) * 32 + 8 * h;
        const __m256 fd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)f));
        const __m256 fm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(f + 16)));
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(v->d + b * 16 + 8 * h))));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(v->m + b * 16 + 8 * h))));
        d[0] = _mm256_mul_ps(fd, sc);
        m[0] = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(fm, mn));
        return;
    }
    if (fmt == FMT_K6) {
        const uint16_t *f = (const uint16_t *)v->sup + (b / 8) * 16 + 8 * h;
        const __m256 fd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)f));
        for (int s = 0; s < 2; s++) {
            const __m128i sc = _mm_loadl_epi64((const __m128i *)(v->d + (b * 2 + s) * 16 + 8 * h));
            d[s] = _mm256_mul_ps(fd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
            m[s] = _mm256_mul_ps(_mm256_set1_ps(-32.0f), d[s]);
        }
        return;
    }
    for (int s = 0; s < FMT_HALVES(fmt); s++) {
        d[s] = load8(fmt, v->d, (b * FMT_HALVES(fmt) + s) * 16 + 8 * h);
        m[s] = FMT_HAS_MIN(fmt) ? load8(fmt, v->m, (b * FMT_HALVES(fmt) + s) * 16 + 8 * h) : _mm256_setzero_ps();
    }
}

/* w[g]: k = 4g .. 4g + 3 of rows 8h .. 8h + 7 of the panel block qb as bytes (I8H: signed int8, as stored;
 * the others unsigned q), as weights16 in the AVX-512 path. */
static inline __attribute__((always_inline)) void weights8(const int fmt, const uint8_t *qb, const int h, __m256i *w) {
    for (int g = 0; g < 8; g++) {
        if (FMT_NIBBLES(fmt)) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(qb + 64 * (g & 3) + 32 * h));
            w[g] = _mm256_and_si256(g < 4 ? x : _mm256_srli_epi16(x, 4), _mm256_set1_epi8(15));
            if (FMT_Q5(fmt)) {  /* the high bits shifted straight to bit 4, as weights16 */
                const __m256i hi = _mm256_loadu_si256((const __m256i *)(qb + 256 + 32 * h));
                const __m256i at4 = g <= 4 ? _mm256_slli_epi16(hi, 4 - g) : _mm256_srli_epi16(hi, g - 4);
                w[g] = _mm256_or_si256(w[g], _mm256_and_si256(at4, _mm256_set1_epi8(0x10)));
            }
            if (fmt == FMT_K6) {
                const __m256i hi = _mm256_loadu_si256((const __m256i *)(qb + 256 + 64 * (g & 1) + 32 * h));
                const int j = g / 2;
                const __m256i at4 = j <= 2 ? _mm256_slli_epi16(hi, 4 - 2 * j) : _mm256_srli_epi16(hi, 2 * j - 4);
                w[g] = _mm256_or_si256(w[g], _mm256_and_si256(at4, _mm256_set1_epi8(0x30)));
            }
        } else {
            w[g] = _mm256_loadu_si256((const __m256i *)(qb + 64 * g + 32 * h));
        }
    }
}
#endif
#endif
