/* Which SIMD paths a build of the kernels runs, chosen from the compiler's target macros (the
 * native build is -march=native, so the paths are this CPU's), and small helpers shared by the
 * kernels (header-only; part of every kernel's build key).
 *
 *   RG_AVX2        AVX2 + FMA (+ F16C): 8-float vectors; int8 dot products by vpmaddubsw
 *   RG_AVXVNNI     AVX-VNNI: 256-bit vpdpbusd (e.g. Alder Lake, Sierra Forest)
 *   RG_AVX512      AVX-512 F/BW/VL/DQ with AVX512-VNNI: 16-float vectors, 512-bit vpdpbusd
 *   RG_AVX512BF16  AVX512-BF16: vdpbf16ps, pairs of bfloat16 products summed in float32
 *   RG_AMX         AMX tiles with int8 and bf16 dot products (and AVX512-BF16): the matrix units
 *   RG_NEON        Arm64 NEON with the dot-product extension (Armv8.2 sdot: Graviton 2+, Ampere, Apple M):
 *                  4-float vectors, 16 signed byte products per instruction
 *
 * -DRADIXGEN_SCALAR turns all of them off: the plain C reference every path is tested against.
 * Each RG_* flag bit below is what rg_simd_level() reports.
 */
#ifndef RADIXGEN_SIMD_MATH_H
#define RADIXGEN_SIMD_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(RADIXGEN_SCALAR)
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RG_AVX2 1
#endif
#if defined(RG_AVX2) && defined(__AVXVNNI__)
#define RG_AVXVNNI 1
#endif
#if defined(RG_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define RG_AVX512 1
#endif
#if defined(RG_AVX512) && defined(__AVX512BF16__)
#define RG_AVX512BF16 1
#endif
#if defined(RG_AVX512) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__) && defined(__linux__)
#define RG_AMX 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define RG_NEON 1
#include <arm_neon.h>
#endif
#endif

#define RG_BIT_AVX2 1
#define RG_BIT_AVXVNNI 2
#define RG_BIT_AVX512 4
#define RG_BIT_AMX 8
#define RG_BIT_NEON 16

/* IEEE half -> float (the GGUF block scales), for the scalar paths. */
static inline float rg_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    float f;
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    const uint32_t bits = sign | (e == 31 ? 0x7F800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float -> IEEE half, rounding to nearest even (as torch's .half()), for the scalar paths. */
static inline uint16_t rg_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);  /* NaN */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {  /* below 2^-14: a subnormal half (or zero), m * 2^-24 */
        if (a < 0x33000000u) return sign;  /* below 2^-25: rounds to zero */
        const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - (a >> 23);  /* 14..24 */
        uint32_t h = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((a >> 13) - (112u << 10));  /* rebias the exponent, keep 10 mantissa bits */
    const uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  /* may carry into the exponent: fine */
    return (uint16_t)(sign | h);
}

/* float -> bfloat16, rounding to nearest even (as torch's .bfloat16()); NaN stays NaN. */
static inline uint16_t rg_float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static inline float rg_bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* KV cache element types (the kv_dtype arguments of radixgen_kernels.h). RG_KV_I8 rows: per
 * (token, KV head) D int8 values q and a float32 scale s in the next 4 bytes, x = s * q, s = max|x| / 127
 * (a head row is D + 4 bytes; every other type's is D elements). */
#define RG_KV_F32 0
#define RG_KV_BF16 1
#define RG_KV_F16 2
#define RG_KV_I8 3

static inline int64_t rg_kv_bytes(int kv) { return kv == RG_KV_F32 ? 4 : kv == RG_KV_I8 ? 1 : 2; }

/* Elements from one KV head row to the next. */
static inline int64_t rg_kv_head_stride(int kv, int64_t D) { return kv == RG_KV_I8 ? D + 4 : D; }

/* The scale of the int8 head row starting at element `base` (1 for the other types). */
static inline float rg_kv_row_scale(const void *p, int64_t base, int64_t D, int kv) {
    if (kv != RG_KV_I8) return 1.0f;
    float s;
    memcpy(&s, (const int8_t *)p + base + D, sizeof s);
    return s;
}

/* Element i, unscaled for int8 rows (times the row's scale it is the value). */
static inline float rg_kv_load(const void *p, int64_t i, int kv) {
    if (kv == RG_KV_F32) return ((const float *)p)[i];
    if (kv == RG_KV_I8) return (float)((const int8_t *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return kv == RG_KV_BF16 ? rg_bf16_to_float(h) : rg_half_to_float(h);
}

/* One head row src[0 .. D) stored at element `base` in the KV type (int8: quantized as torch's
 * round(x / s), ties to even, with s = max|x| / 127, 0 for an all-zero row). */
static inline void rg_kv_store_head(void *dst, int64_t base, const float *src, int64_t D, int kv) {
    if (kv == RG_KV_F32) {
        memcpy((float *)dst + base, src, sizeof(float) * (size_t)D);
        return;
    }
    if (kv == RG_KV_I8) {
        float amax = 0.0f;
        for (int64_t i = 0; i < D; i++) amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
        const float s = amax / 127.0f, div = s == 0.0f ? 1.0f : s;
        int8_t *d = (int8_t *)dst + base;
        for (int64_t i = 0; i < D; i++) {
            const float q = rintf(src[i] / div);
            d[i] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
        }
        memcpy(d + D, &s, sizeof s);
        return;
    }
    uint16_t *d = (uint16_t *)dst + base;
    for (int64_t i = 0; i < D; i++) d[i] = kv == RG_KV_BF16 ? rg_float_to_bf16(src[i]) : rg_float_to_half(src[i]);
}

#ifdef RG_AVX2
#include <immintrin.h>

/* Keeps a vector accumulator's chain of adds as written: GCC reassociates a loop's integer vector adds
 * into a tree whose partial sums outnumber the 16 ymm registers and spill (the AVX2 block GEMM's
 * vpmaddubsw / vpmaddwd sums ran 15-35% slower so); an empty asm that may change v stops that. */
#define RG_KEEP_CHAIN(v) __asm__("" : "+x"(v))

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* e^x for x in [-87, 88] (clamped outside): Cephes expf, Cody-Waite reduction by ln 2 and a
 * degree-6 polynomial, about 1e-7 relative error. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

#ifdef RG_NEON
/* exp8's Cephes expf on 4 floats (NEON), about 1e-7 relative error. */
static inline float32x4_t exp4(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_n_f32(x, n, 0.693359375f);
    r = vfmsq_n_f32(r, n, -2.12194440e-4f);
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}
#endif

#ifdef RG_AVX512
/* Elements i .. i + 16 of a K/V buffer of dtype kv as floats (int8: unscaled, see rg_kv_row_scale). */
static inline __m512 rg_kv_load16(const void *p, int64_t i, int kv) {
    if (kv == RG_KV_F32) return _mm512_loadu_ps((const float *)p + i);
    if (kv == RG_KV_I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)p + i))));
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (kv == RG_KV_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* exp8 on 16 floats. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* 1 / x: vrcp14ps and one Newton step (~1e-7 relative, as a division; 0 where 1 / x is below float32's
 * normal range), at a fraction of vdivps's cost. */
static inline __m512 recip16(__m512 x) {
    const __m512 r = _mm512_rcp14_ps(x);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(x, r, _mm512_set1_ps(2.0f)));
}

/* Lane i of the result: the sum of v[i]'s 16 lanes (a transposing add tree: 45 instructions for
 * 16 horizontal sums instead of ~8 each). */
static inline __m512 sum16x16(const __m512 *v) {
    __m512 x[8], y[4];
    for (int i = 0; i < 8; i++)  /* per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) of v[2i], v[2i+1] */
        x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)  /* per 128-bit lane: the lane's sum of v[4i + c] at position c */
        y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 z23 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif
#endif
