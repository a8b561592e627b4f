/* The block formats block_gemm.c and block_dequant.c read (rg_block_weight's bits and flags).
 *
 * GGUF's own layouts Q4_0, Q4_1 and Q8_0 are kernel formats as they are (fp16 scales, one scale and
 * min a 32-weight block); every other GGUF type converts into one of these exactly (no value of the
 * dequantized weight changes; runtime/kernels/gguf_blocks.py):
 *   U4H   4-bit q,  fp16 scale + min       Q4_0 (min -8 d), Q4_1
 *   I8H   int8 q,   fp16 scale, no min     Q8_0, Q5_0 (q - 16)
 *   U4F   4-bit q,  float32 scale + min    Q4_K (d * sc, -dmin * m: products fp16 cannot hold)
 *   U8F   uint8 q,  float32 scale + min    Q5_K, Q5_1
 *   U8F2  uint8 q,  float32 scale + min per half block (16 weights)   Q6_K, Q3_K, Q2_K
 */
#ifndef RADIXGEN_BLOCK_FORMAT_H
#define RADIXGEN_BLOCK_FORMAT_H
#include <stdint.h>
#include "radixgen_kernels.h"
#include "simd_math.h"

#define RG_SCALES_F32 1  /* scale and min are float32 (else fp16) */
#define RG_UNSIGNED8 2   /* 8-bit q are unsigned, with a min (else signed, no min) */
#define RG_HALF_BLOCKS 4 /* a scale and a min per 16 weights (else per 32) */

enum { FMT_U4H, FMT_I8H, FMT_U4F, FMT_U8F, FMT_U8F2, FMT_BAD };

/* The format of w, or FMT_BAD for a combination no kernel reads. */
static inline int rg_block_format(const rg_block_weight *w) {
    const int64_t f = w->flags;
    if (w->bits == 4 && f == 0) return FMT_U4H;
    if (w->bits == 4 && f == RG_SCALES_F32) return FMT_U4F;
    if (w->bits == 8 && f == 0) return FMT_I8H;
    if (w->bits == 8 && f == (RG_SCALES_F32 | RG_UNSIGNED8)) return FMT_U8F;
    if (w->bits == 8 && f == (RG_SCALES_F32 | RG_UNSIGNED8 | RG_HALF_BLOCKS)) return FMT_U8F2;
    return FMT_BAD;
}

#define FMT_BITS(f) ((f) == FMT_U4H || (f) == FMT_U4F ? 4 : 8)
#define FMT_HALVES(f) ((f) == FMT_U8F2 ? 2 : 1) /* scales a block */
#define FMT_HAS_MIN(f) ((f) != FMT_I8H)
#define FMT_F32(f) ((f) >= FMT_U4F)
#define FMT_BLOCK_BYTES(f) (FMT_BITS(f) == 4 ? 256 : 512) /* a panel's block of 16 rows */

/* Scale or min number i of a panel's array (fp16 or float32 by format). */
static inline float rg_block_scale(int fmt, const void *p, int64_t i) {
    return FMT_F32(fmt) ? ((const float *)p)[i] : rg_half_to_float(((const uint16_t *)p)[i]);
}

/* q of row c (0..15), weight k (0..31) of a panel's block qb. */
static inline int32_t rg_block_q(int fmt, const uint8_t *qb, int64_t c, int k) {
    const int g = k / 4, t = k % 4;
    if (FMT_BITS(fmt) == 4) {
        const uint8_t v = qb[64 * (g & 3) + 4 * c + t];
        return g < 4 ? (v & 15) : (v >> 4);
    }
    return fmt == FMT_I8H ? (int32_t)(int8_t)qb[64 * g + 4 * c + t] : (int32_t)qb[64 * g + 4 * c + t];
}
#endif
