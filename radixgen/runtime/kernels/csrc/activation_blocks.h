/* Activations quantized per row and 32-value block into int8 limbs (block_gemm.c's quantize_rows), as
 * the block GEMM's vector path (block_gemm.c) and its AMX tiles (amx_int8.c) read them: both compute the
 * same integer sums and combine them in the same float operations, so a row's result is the same on
 * either. Internal to the kernel library. */
#ifndef RADIXGEN_ACTIVATION_BLOCKS_H
#define RADIXGEN_ACTIVATION_BLOCKS_H
#include <stddef.h>
#include <stdint.h>
#include "block_format.h"
#include "simd_math.h"

#define QK 32
#define LIMBS 3
#define LIMB_BASE 254.0f

/* One block of one activation row: its scale, what its weight format's products add (the float sums its
 * mins multiply, free mins, or the integer sums its offset multiplies, offset formats), then its limbs.
 * Only a GEMM's `limbs` limbs are stored, so a row's blocks lie XBLOCK_BYTES(limbs) apart (48, 80 or 112
 * bytes, xblock_at): every panel streams all the activation rows past its weights, and a prefill's one or
 * two limbs are then 2.7x or 1.6x fewer bytes than a fixed 128-byte block. */
typedef struct {
    float s;                   /* x ~= s * q0, s * (254 q0 + q1) or s * (q0 + q1 / 254 + q2 / 254^2) */
    union {                    /* per scale: the block ([0]) or each half (x 0..15, 16..31) */
        float sum[2];          /* free mins: the sums of x */
        int32_t off[2];        /* an offset, one or two limbs: -offset * the sum of q0 or of 254 q0 + q1 (the
                                  last limb sum's start) */
        float foff[2];         /* an offset, three limbs: -offset * (the sums of q0 + q1 / 254 + q2 / 254^2) */
    };
    int32_t pad;
    int8_t q[LIMBS][QK];       /* the first `limbs` only */
} xblock;

#define XBLOCK_BYTES(limbs) ((int64_t)offsetof(xblock, q) + QK * (int64_t)(limbs))
_Static_assert(offsetof(xblock, q) == 16, "an xblock's limbs start 16 bytes in");

/* Block i (row * blocks per row + block) of activations stored in `limbs` limbs. */
static inline const xblock *xblock_at(const xblock *xq, int64_t i, int limbs) {
    return (const xblock *)((const char *)xq + i * XBLOCK_BYTES(limbs));
}

/* x86's vector paths read signed 8-bit q as unsigned (q + 128: vpdpbusd's unsigned side), an offset of
 * 128 their sums take off like a format's own; the others multiply signed q as they are. */
#if defined(RG_AVX512) || defined(RG_AVXVNNI)
#define SIGNED8_OFFSET 128
#else
#define SIGNED8_OFFSET 0
#endif

/* The offset the integer sums take off for format fmt: its own (FMT_OFFSET), or signed 8-bit q's. */
static inline int xblock_offset(const int fmt) { return fmt == FMT_I8H ? SIGNED8_OFFSET : FMT_OFFSET(fmt); }

/* AVX2 without VNNI has no dot product of signed bytes by signed bytes (vpmaddubsw's first side is
 * unsigned: |q| and a sign per limb, three instructions a limb), so signed 8-bit weights in two or three
 * limbs multiply int16 words instead (vpmaddwd, the weights widened): the first two limbs are stored as
 * the words 254 q0 + q1 (the integers two limbs combine into elsewhere; |254 q0 + q1| <= 32,385) in
 * q[0] and q[1]'s 64 bytes; a third stays bytes. */
#if defined(RG_AVX2) && !defined(RG_AVXVNNI) && !defined(RG_AVX512)
#define XBLOCK_WORDS(fmt, limbs) ((fmt) == FMT_I8H && (limbs) >= 2)
#else
#define XBLOCK_WORDS(fmt, limbs) 0
#endif

/* The float sums of x fmt's mins multiply: 0 (no mins, or an offset instead), 1 (the block's), 2 (its halves'). */
static inline int xblock_sums(const int fmt) { return FMT_HAS_MIN(fmt) && !FMT_OFFSET(fmt) ? FMT_HALVES(fmt) : 0; }

#define C1 (1.0f / LIMB_BASE)                 /* the second limb's unit */
#define C2 (1.0f / (LIMB_BASE * LIMB_BASE))   /* the third's */

/* 254 a, for two limbs' int32 combination (shifts: vpmulld would take an FMA pipe's slot). */
#if defined(RG_AVX512)
static inline __m512i times_base(__m512i a) {
    return _mm512_sub_epi32(_mm512_slli_epi32(a, 8), _mm512_slli_epi32(a, 1));
}
#elif defined(RG_AVX2)
static inline __m256i times_base(__m256i a) {
    return _mm256_sub_epi32(_mm256_slli_epi32(a, 8), _mm256_slli_epi32(a, 1));
}
#endif
#endif
