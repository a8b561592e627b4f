/* The block formats block_gemm.c and block_dequant.c read (rg_block_weight's bits and flags).
 *
 * GGUF's own layouts Q4_0, Q4_1 and Q8_0 are kernel formats as they are (fp16 scales, one scale and
 * min a 32-weight block); every other GGUF type converts into one of these exactly (no value of the
 * dequantized weight changes; runtime/kernels/gguf_blocks.py):
 *   U4H   4-bit q,  fp16 scale + min       Q4_0 (min -8 d), Q4_1
 *   I8H   int8 q,   fp16 scale, no min     Q8_0, Q5_0 (q - 16)
 *   U4F   4-bit q,  float32 scale + min    Q4_K (d * sc, -dmin * m: products fp16 cannot hold)
 *   U8F   uint8 q,  float32 scale + min    Q5_K, Q5_1
 *   U8F2  uint8 q,  float32 scale + min per half block (16 weights)   Q3_K, Q2_K (and mixes)
 *   K4    4-bit q,  uint8 sc, m per block, fp16 d, dmin per 8 blocks   Q4_K in its own bytes
 *   K6    6-bit q (4-bit plane + 2-bit plane), int8 sc per half block, fp16 d per 8 blocks   Q6_K
 *   U5H   5-bit q (4-bit plane + 1-bit plane), fp16 scale + min   Q5_0 (min -16 d), Q5_1
 *   U5F   5-bit q, float32 scale + min                            Q5_K (d * sc, -dmin * m)
 *   O4H   U4H whose min is -8 d (RG_MIN_OFFSET)                    Q4_0
 *   O5H   U5H whose min is -16 d (RG_MIN_OFFSET)                   Q5_0
 * K4 and K6 hold a K-quant's bytes as the file does (its 6-bit scales widened to a byte): the
 * kernel computes each block's d * sc as gguf does.
 * O4H, O5H and K6 are offset formats (FMT_OFFSET): W = d (q - offset), so the GEMM takes the offset off
 * its integer sums (sum_k (q - offset) x_k) instead of adding min * sum(x) in float; their mins stay
 * stored for the other readers (dequantization, AMX tiles).
 */
#ifndef RADIXGEN_BLOCK_FORMAT_H
#define RADIXGEN_BLOCK_FORMAT_H
#include <stdint.h>
#include "radixgen_kernels.h"
#include "simd_math.h"

#define RG_SCALES_F32 1  /* scale and min are float32 (else fp16) */
#define RG_UNSIGNED8 2   /* 8-bit q are unsigned, with a min (else signed, no min) */
#define RG_HALF_BLOCKS 4 /* a scale and a min per 16 weights (else per 32) */
#define RG_SUPER_BLOCKS 8 /* K-quant scales: small integers per block times fp16 factors per 8 blocks (`sup`) */
#define RG_MIN_OFFSET 16  /* 4- or 5-bit q with fp16 scales whose min is -8 d or -16 d (Q4_0, Q5_0) */

enum { FMT_U4H, FMT_I8H, FMT_U4F, FMT_U8F, FMT_U8F2, FMT_K4, FMT_K6, FMT_U5H, FMT_U5F, FMT_O4H, FMT_O5H, FMT_BAD };

/* The format of w, or FMT_BAD for a combination no kernel reads. */
static inline int rg_block_format(const rg_block_weight *w) {
    const int64_t f = w->flags;
    if (w->bits == 4 && f == 0) return FMT_U4H;
    if (w->bits == 4 && f == RG_SCALES_F32) return FMT_U4F;
    if (w->bits == 8 && f == 0) return FMT_I8H;
    if (w->bits == 8 && f == (RG_SCALES_F32 | RG_UNSIGNED8)) return FMT_U8F;
    if (w->bits == 8 && f == (RG_SCALES_F32 | RG_UNSIGNED8 | RG_HALF_BLOCKS)) return FMT_U8F2;
    if (w->bits == 4 && f == RG_SUPER_BLOCKS && w->sup != NULL) return FMT_K4;
    if (w->bits == 6 && f == (RG_SUPER_BLOCKS | RG_HALF_BLOCKS) && w->sup != NULL) return FMT_K6;
    if (w->bits == 5 && f == 0) return FMT_U5H;
    if (w->bits == 5 && f == RG_SCALES_F32) return FMT_U5F;
    if (w->bits == 4 && f == RG_MIN_OFFSET) return FMT_O4H;
    if (w->bits == 5 && f == RG_MIN_OFFSET) return FMT_O5H;
    return FMT_BAD;
}

#define FMT_HALVES(f) ((f) == FMT_U8F2 || (f) == FMT_K6 ? 2 : 1) /* scales a block */
#define FMT_HAS_MIN(f) ((f) != FMT_I8H)
#define FMT_F32(f) ((f) == FMT_U4F || (f) == FMT_U8F || (f) == FMT_U8F2 || (f) == FMT_U5F)
#define FMT_SUPER(f) ((f) == FMT_K4 || (f) == FMT_K6)
#define FMT_Q4(f) ((f) == FMT_U4H || (f) == FMT_O4H || (f) == FMT_U4F || (f) == FMT_K4) /* q 0..15 */
#define FMT_Q5(f) ((f) == FMT_U5H || (f) == FMT_O5H || (f) == FMT_U5F) /* q 0..31: a nibble plane and a 1-bit plane */
#define FMT_NIBBLES(f) (FMT_Q4(f) || (f) == FMT_K6 || FMT_Q5(f)) /* a low-nibble plane */
#define FMT_OFFSET(f) ((f) == FMT_O4H ? 8 : (f) == FMT_O5H ? 16 : (f) == FMT_K6 ? 32 : 0) /* W = d (q - offset) */
/* bytes of a panel's block of 16 rows: q; scales; mins (K6: none stored, -32 scale); per 8 blocks: `sup` */
#define FMT_BLOCK_BYTES(f) ((f) == FMT_K6 ? 384 : FMT_Q5(f) ? 320 : FMT_NIBBLES(f) ? 256 : 512)
#define FMT_SCALE_BYTES(f) (FMT_SUPER(f) ? 16 * FMT_HALVES(f) : 16 * FMT_HALVES(f) * (FMT_F32(f) ? 4 : 2))
#define FMT_MIN_BYTES(f) ((f) == FMT_I8H || (f) == FMT_K6 ? 0 : FMT_SCALE_BYTES(f))
#define FMT_SUP_BYTES(f) ((f) == FMT_K4 ? 64 : (f) == FMT_K6 ? 32 : 0)

/* One panel's arrays (block_gemm.c's layout), each at the panel's first element. */
typedef struct {
    const uint8_t *qs, *d, *m, *sup;
} rg_panel;

/* The panel p of w, whose rows are k / 32 blocks long. */
static inline rg_panel rg_panel_of(int fmt, const rg_block_weight *w, int64_t nb, int64_t p) {
    const rg_panel v = {(const uint8_t *)w->qs + p * nb * FMT_BLOCK_BYTES(fmt),
                        (const uint8_t *)w->scale + p * nb * FMT_SCALE_BYTES(fmt),
                        FMT_MIN_BYTES(fmt) ? (const uint8_t *)w->minv + p * nb * FMT_MIN_BYTES(fmt) : NULL,
                        FMT_SUPER(fmt) ? (const uint8_t *)w->sup + p * nb / 8 * FMT_SUP_BYTES(fmt) : NULL};
    return v;
}

/* Scale and min of block b, half h, row c of a panel, as float32 (K-quants: d * sc and -(dmin * m), or
 * -32 d sc for Q6_K's offset, each product exact in float32, as gguf computes them). */
static inline void rg_block_dm(int fmt, const rg_panel *v, int64_t b, int h, int64_t c, float *d, float *m) {
    const int halves = FMT_HALVES(fmt);
    const int64_t at = (b * halves + h) * 16 + c;
    if (fmt == FMT_K4) {
        const uint16_t *dd = (const uint16_t *)v->sup + (b / 8) * 32;
        *d = rg_half_to_float(dd[c]) * (float)v->d[at];
        *m = -(rg_half_to_float(dd[16 + c]) * (float)v->m[at]);
        return;
    }
    if (fmt == FMT_K6) {
        *d = rg_half_to_float(((const uint16_t *)v->sup)[(b / 8) * 16 + c]) * (float)((const int8_t *)v->d)[at];
        *m = -32.0f * *d;
        return;
    }
    *d = FMT_F32(fmt) ? ((const float *)v->d)[at] : rg_half_to_float(((const uint16_t *)v->d)[at]);
    *m = !FMT_HAS_MIN(fmt) ? 0.0f
         : FMT_F32(fmt)    ? ((const float *)v->m)[at]
                           : rg_half_to_float(((const uint16_t *)v->m)[at]);
}

/* q of row c (0..15), weight k (0..31) of a panel's block qb. */
static inline int32_t rg_block_q(int fmt, const uint8_t *qb, int64_t c, int k) {
    const int g = k / 4, t = k % 4;
    if (FMT_NIBBLES(fmt)) {
        const uint8_t v = qb[64 * (g & 3) + 4 * c + t];
        const int32_t lo = g < 4 ? (v & 15) : (v >> 4);
        if (FMT_Q5(fmt)) return lo | (((qb[256 + 4 * c + t] >> g) & 1) << 4); /* the high bit: byte 4c + t, bit g */
        if (fmt != FMT_K6) return lo;
        /* the high 2 bits: plane byte (256 + 64 (g & 1) + 4c + t), bits 2 (g / 2) */
        return lo | (((qb[256 + 64 * (g & 1) + 4 * c + t] >> (2 * (g / 2))) & 3) << 4);
    }
    return fmt == FMT_I8H ? (int32_t)(int8_t)qb[64 * g + 4 * c + t] : (int32_t)qb[64 * g + 4 * c + t];
}
#endif
