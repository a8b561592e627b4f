/* y[M, N] = x[M, K] @ W^T for a weight W [N, K] in GGUF's 32-weight blocks (Q4_0/Q4_1/Q8_0),
 * repacked into panels of NR = 16 output rows, by integer dot products.
 *
 * Block b of row n holds 32 small integers q, a scale d and, for 4-bit, a min m (fp16 in GGUF):
 *   4-bit: W[n, 32b + j] = d * q_j + m, q in 0..15; Q4_0 is m = -8 d.
 *   8-bit: W[n, 32b + j] = d * q_j, q in -128..127.
 * so sum_j W x_j = d * sum_j q_j x_j + m * sum_j x_j. Where m is -offset * d (block_format.h's offset
 * formats: Q4_0, Q5_0, Q6_K; and x86's unsigned reading of signed 8-bit q, offset 128) it is instead
 * d * sum_j (q_j - offset) x_j, the offset taken off the integer sums: no float product per block for
 * the min, and the activations' rounding error e_j weighs in as sum_j (q_j - offset) e_j, not the
 * larger sum_j q_j e_j (Gemma 3 in one limb: its input logprobs' error 0.5 instead of 0.9).
 *
 * Activations are split per row and block into three int8 limbs (quantize_rows): with
 * s = max|x| / 127, x = s * (x0 + x1 / 254 + x2 / 254^2) to 2^-24 of the block's largest value, which is
 * float32's own precision (one limb, as llama.cpp uses, moves SmolLM2's logits by up to ~1.4; two
 * by ~5e-3; three by ~1e-4, the same as float32 GEMMs). Each limb's dot product with q is exact in
 * int32 (vpdpbusd: 64 byte products per instruction; AVX2's vpmaddubsw pair, or for signed 8-bit weights
 * vpmaddwd of the weights widened by two limbs' int16 words, XBLOCK_WORDS; Arm64's sdot), and the three
 * combine in float; two combine in int32 as 254 x0 + x1 (below 2^29: the block's scale then carries
 * the 1 / 254), which leaves one conversion and one FMA a block and row, not two of each: the FMA pipes
 * are the ones vpdpbusd runs on. Per weight that is ~5x fewer vector instructions than widening each weight to
 * float32, so one decode row runs at the speed the weights stream in. Long prompt chunks may take fewer
 * limbs (block_gemm_limbs: 2 or 1), each about halving the integer work.
 *
 * Panel layout (p = n / 16, c = n % 16): a 64-byte vector holds 4 consecutive k of 16 rows, the
 * dword lanes vpdpbusd multiplies by 4 broadcast activation bytes:
 *   4-bit: qs[p][b][g][c][t], g < 4: low nibble = q at k = 4g + t, high nibble = q at k = 16 + 4g + t
 *          (these are GGUF's own block bytes, regrouped)
 *   8-bit: qs[p][b][g][c][t], g < 8: q at k = 4g + t (int8)
 *   d, m:  [p][b][c] fp16
 * Every output sums its products in the same order whatever M is, so a row's result does not
 * depend on its batch-mates. Panels are split over the kernels' threads (thread_pool.c).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "activation_blocks.h"
#include "amx_gemm.h"
#include "block_format.h"
#include "block_unpack.h"
#include "radixgen_kernels.h"
#include "scratch.h"
#include "simd_math.h"
#include "thread_pool.h"

#define NR 16   /* output rows per panel */
#define MR 8    /* activation rows per pass (their accumulators stay in registers) */
#define ROWS_1LIMB 4 /* rows whose one-limb sums the AVX-512 path interleaves (two with more limbs) */
/* The weights' software prefetches: on AVX-512, PREFETCH_BLOCKS ahead into L1, for the loads to hit there,
 * and PREFETCH_FAR ahead into L2, for the memory's bandwidth; on AVX2, a panel ahead into L2. A core keeps
 * only as many L1 misses in flight as it has fill buffers (~16 lines: ~10 GB/s a core at DRAM latency),
 * and prefetches into L1 from DRAM held those buffers; L2's queue holds more. */
#define PREFETCH_BLOCKS 8
#define PREFETCH_FAR 32
#define PARALLEL_MIN 16384 /* activation elements below which quantizing on one thread is faster */
#ifndef AMX_MIN_ROWS
#define AMX_MIN_ROWS AMX_TILE_ROWS /* rows from which the AMX paths are faster (a tile's rows) */
#endif

static const float LIMB_UNIT[LIMBS] = {1.0f, C1, C2};
static const float PAIR_UNIT[2] = {LIMB_BASE, 1.0f};  /* two limbs' weights in their int32 combination */

/* The first `limbs` limbs of one block (the first two as words where `words`: XBLOCK_WORDS), with the float
 * sums of x `sums` asks for (xblock_sums) or, for a nonzero `offset`, off (one or two limbs) or foff (three),
 * per half block where halves is 2; the rest is left unset (no kernel reads it). Each sum is a horizontal
 * reduction per block, which is why only those a format reads are computed. */
static void quantize_block(const float *x, int limbs, int sums, int offset, int halves, int words, xblock *out) {
    (void)words;  /* (read by the AVX2 path only) */
    float qh[2] = {0.0f, 0.0f};  /* with an offset: the sums of q0 + q1 / 254 + ... per half (one limb: exact) */
    float amax = 0.0f;
#if defined(RG_AVX512)
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    if (sums == 1) out->sum[0] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
    if (sums == 2) {
        out->sum[0] = _mm512_reduce_add_ps(v0);
        out->sum[1] = _mm512_reduce_add_ps(v1);
    }
#elif defined(RG_AVX2)
    __m256 v[4], mx = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_and_ps(v[i], abs_mask));
        sm = _mm256_add_ps(sm, v[i]);
    }
    amax = hmax(mx);
    if (sums == 1) out->sum[0] = hsum(sm);
    if (sums == 2) {
        out->sum[0] = hsum(_mm256_add_ps(v[0], v[1]));
        out->sum[1] = hsum(_mm256_add_ps(v[2], v[3]));
    }
#elif defined(RG_NEON)
    float32x4_t v[8], mx = vdupq_n_f32(0.0f), sm = vdupq_n_f32(0.0f);
    for (int i = 0; i < 8; i++) {
        v[i] = vld1q_f32(x + 4 * i);
        mx = vmaxq_f32(mx, vabsq_f32(v[i]));
        sm = vaddq_f32(sm, v[i]);
    }
    amax = vmaxvq_f32(mx);
    if (sums == 1) out->sum[0] = vaddvq_f32(sm);
    if (sums == 2) {
        out->sum[0] = vaddvq_f32(vaddq_f32(vaddq_f32(v[0], v[1]), vaddq_f32(v[2], v[3])));
        out->sum[1] = vaddvq_f32(vaddq_f32(vaddq_f32(v[4], v[5]), vaddq_f32(v[6], v[7])));
    }
#else
    float sum = 0.0f, half[2] = {0.0f, 0.0f};
    for (int j = 0; j < QK; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
        sum += x[j];
        half[j / 16] += x[j];
    }
    if (sums == 1) out->sum[0] = sum;
    if (sums == 2) {
        out->sum[0] = half[0];
        out->sum[1] = half[1];
    }
#endif
    if (!(amax > 0.0f) || !isfinite(amax)) {  /* zeros (or non-finite input: garbage in, no crash) */
        memset(out->q, 0, (size_t)(QK * limbs));
        if (offset) memset(out->off, 0, sizeof out->off);  /* (foff's zeros too) */
        out->s = 0.0f;
        return;
    }
    const float inv = 127.0f / amax;
    out->s = limbs == 2 ? amax / 127.0f * C1 : amax / 127.0f;
    const float *unit = limbs == 2 ? PAIR_UNIT : LIMB_UNIT;  /* each limb's weight in the offset's sum */
#if defined(RG_AVX512)
    __m512 r0 = _mm512_mul_ps(v0, _mm512_set1_ps(inv)), r1 = _mm512_mul_ps(v1, _mm512_set1_ps(inv));
    __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps();  /* qh's terms */
    for (int l = 0; l < limbs; l++) {
        const __m512 q0 = _mm512_roundscale_ps(r0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 q1 = _mm512_roundscale_ps(r1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i i0 = _mm512_cvtps_epi32(q0), i1 = _mm512_cvtps_epi32(q1);
        _mm_storeu_si128((__m128i *)out->q[l], _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(out->q[l] + 16), _mm512_cvtepi32_epi8(i1));
        if (offset) {
            f0 = _mm512_fmadd_ps(q0, _mm512_set1_ps(unit[l]), f0);
            f1 = _mm512_fmadd_ps(q1, _mm512_set1_ps(unit[l]), f1);
        }
        r0 = _mm512_mul_ps(_mm512_sub_ps(r0, q0), _mm512_set1_ps(LIMB_BASE));
        r1 = _mm512_mul_ps(_mm512_sub_ps(r1, q1), _mm512_set1_ps(LIMB_BASE));
    }
    if (offset) {
        qh[0] = _mm512_reduce_add_ps(f0);
        qh[1] = _mm512_reduce_add_ps(f1);
    }
#elif defined(RG_AVX2)
    for (int i = 0; i < 4; i++) v[i] = _mm256_mul_ps(v[i], _mm256_set1_ps(inv));
    __m256 f[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  /* qh's terms */
    __m256i t32[4];  /* words: 254 q0 + q1 */
    for (int l = 0; l < limbs; l++) {
        __m256i q32[4];
        for (int i = 0; i < 4; i++) {  /* rounded to nearest even, as rintf */
            const __m256 q = _mm256_round_ps(v[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q32[i] = _mm256_cvtps_epi32(q);
            if (offset) f[i / 2] = _mm256_fmadd_ps(q, _mm256_set1_ps(unit[l]), f[i / 2]);
            v[i] = _mm256_mul_ps(_mm256_sub_ps(v[i], q), _mm256_set1_ps(LIMB_BASE));
        }
        if (words && l < 2) {
            for (int i = 0; i < 4; i++) t32[i] = l == 0 ? times_base(q32[i]) : _mm256_add_epi32(t32[i], q32[i]);
            if (l == 1)  /* int32 -> int16 in order (as below) */
                for (int i = 0; i < 2; i++)
                    _mm256_storeu_si256((__m256i *)out->q[i],
                                        _mm256_permute4x64_epi64(_mm256_packs_epi32(t32[2 * i], t32[2 * i + 1]), 0xD8));
            continue;
        }
        /* int32 -> int8 in order: packs interleave 128-bit lanes, the permute puts them back */
        const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q32[0], q32[1]), _mm256_packs_epi32(q32[2], q32[3]));
        _mm256_storeu_si256((__m256i *)out->q[l],
                            _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    if (offset) {
        qh[0] = hsum(f[0]);
        qh[1] = hsum(f[1]);
    }
#elif defined(RG_NEON)
    for (int i = 0; i < 8; i++) v[i] = vmulq_n_f32(v[i], inv);
    float32x4_t f[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};  /* qh's terms */
    for (int l = 0; l < limbs; l++) {
        for (int i = 0; i < 8; i += 2) {  /* rounded to nearest even, as rintf */
            const float32x4_t q0 = vrndnq_f32(v[i]), q1 = vrndnq_f32(v[i + 1]);
            const int32x4_t i0 = vcvtq_s32_f32(q0), i1 = vcvtq_s32_f32(q1);
            vst1_s8(out->q[l] + 4 * i, vmovn_s16(vcombine_s16(vmovn_s32(i0), vmovn_s32(i1))));
            if (offset) f[i / 4] = vfmaq_n_f32(f[i / 4], vaddq_f32(q0, q1), unit[l]);
            v[i] = vmulq_n_f32(vsubq_f32(v[i], q0), LIMB_BASE);
            v[i + 1] = vmulq_n_f32(vsubq_f32(v[i + 1], q1), LIMB_BASE);
        }
    }
    if (offset) {
        qh[0] = vaddvq_f32(f[0]);
        qh[1] = vaddvq_f32(f[1]);
    }
#else
    float r[QK];
    for (int j = 0; j < QK; j++) r[j] = x[j] * inv;
    for (int l = 0; l < limbs; l++) {
        for (int j = 0; j < QK; j++) {
            const float q = rintf(r[j]);
            out->q[l][j] = (int8_t)q;
            if (offset) qh[j / 16] += q * unit[l];
            r[j] = (r[j] - q) * LIMB_BASE;
        }
    }
#endif
    if (!offset) return;
    for (int h = 0; h < halves; h++) {
        const float q = halves == 2 ? qh[h] : qh[0] + qh[1];
        if (limbs <= 2) out->off[h] = -offset * (int32_t)q;  /* integers below 2^21: summed exactly */
        else out->foff[h] = (float)-offset * q;
    }
}

typedef struct {
    const float *x;
    int64_t K;
    int limbs, fmt;
    xblock *xq;
} quantize_job;

static void quantize_range(void *job, int64_t begin, int64_t end, int tid) {
    const quantize_job *j = (const quantize_job *)job;
    const int64_t nb = j->K / QK;
    const int sums = xblock_sums(j->fmt), offset = xblock_offset(j->fmt), halves = FMT_HALVES(j->fmt);
    const int words = XBLOCK_WORDS(j->fmt, j->limbs);
    (void)tid;
    for (int64_t i = begin; i < end; i++)
        for (int64_t b = 0; b < nb; b++)
            quantize_block(j->x + i * j->K + b * QK, j->limbs, sums, offset, halves, words,
                           (xblock *)xblock_at(j->xq, i * nb + b, j->limbs));
}

/* xq [M][K / 32] blocks of x [M, K] in `limbs` limbs (XBLOCK_BYTES(limbs) each), with the sums weight
 * format fmt's products read. */
static void quantize_rows(const float *x, int64_t M, int64_t K, int limbs, int fmt, xblock *xq, int nthreads) {
    quantize_job job = {x, K, limbs, fmt, xq};
    rg_parallel(M * K >= PARALLEL_MIN ? nthreads : 1, M, RG_STATIC, quantize_range, &job);
}

/* The scalar reference of `panel` (below) for every format: the same integer sums, combined in the same
 * order. SIMD builds run it for the formats their vector path does not read (none on x86). */
static void panel_ref(const int fmt, const int mr, const int limbs, const rg_panel v, int64_t nb, const xblock *xq,
                      float *y, int64_t ldy, int64_t nvalid) {
    const int halves = FMT_HALVES(fmt), span = QK / halves;
    for (int i = 0; i < mr; i++)
        for (int64_t c = 0; c < nvalid; c++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const xblock *xb = xblock_at(xq, i * nb + b, limbs);
                const uint8_t *qb = v.qs + b * FMT_BLOCK_BYTES(fmt);
                for (int h = 0; h < halves; h++) {
                    /* rg_block_q reads signed 8-bit q as they are: only a format's own offset */
                    int32_t a[LIMBS] = {0, 0, 0};  /* the last limb's starts from the offset's share */
                    if (FMT_OFFSET(fmt) && limbs <= 2) a[limbs - 1] = xb->off[h];
                    for (int k = h * span; k < (h + 1) * span; k++) {
                        const int32_t q = rg_block_q(fmt, qb, c, k);
                        for (int l = 0; l < limbs; l++) a[l] += q * xb->q[l][k];
                    }
                    float d, m;
                    rg_block_dm(fmt, &v, b, h, c, &d, &m);
                    float sum = limbs == 1   ? (float)a[0]
                                : limbs == 2 ? (float)((int32_t)LIMB_BASE * a[0] + a[1])
                                             : (float)a[0] + (float)a[1] * C1 + (float)a[2] * C2;
                    if (FMT_OFFSET(fmt) && limbs > 2) sum += xb->foff[h];
                    acc += sum * (d * xb->s);
                    if (xblock_sums(fmt)) acc += m * xb->sum[halves == 2 ? h : 0];
                }
            }
            y[i * ldy + c] = acc;
        }
}

#if defined(RG_AVX512)
/* acc[r] += block b's products for R rows (xblock_at(xb, r * nb, L)) of one panel (w: its 8 weight
 * vectors; d, m: its scales and mins, one per half block). The rows' limb sums are independent
 * dependency chains, interleaved so that vpdpbusd's latency is hidden; being integer sums, their order
 * does not change any result. */
static inline __attribute__((always_inline)) void rows_block(const int R, const int L, const int fmt, const __m512i *w,
                                                              const __m512 *d, const __m512 *m, const xblock *xb,
                                                              int64_t nb, __m512 *acc) {
    const int halves = FMT_HALVES(fmt);
    __m512i a[ROWS_1LIMB][2][LIMBS];  /* [row][half][limb]; one or two limbs: the last from the offset's share */
    for (int r = 0; r < R; r++)
        for (int h = 0; h < halves; h++)
            for (int l = 0; l < L; l++)
                a[r][h][l] = xblock_offset(fmt) && L <= 2 && l == L - 1
                                 ? _mm512_set1_epi32(xblock_at(xb, r * nb, L)->off[h])
                                 : _mm512_setzero_si512();
    for (int g = 0; g < 8; g++)
        for (int r = 0; r < R; r++)
            for (int l = 0; l < L; l++) {
                int32_t x4;
                memcpy(&x4, xblock_at(xb, r * nb, L)->q[l] + 4 * g, 4);
                const int h = halves == 2 ? g / 4 : 0;
                a[r][h][l] = _mm512_dpbusd_epi32(a[r][h][l], w[g], _mm512_set1_epi32(x4));
            }
    const __m512 c1 = _mm512_set1_ps(C1), c2 = _mm512_set1_ps(C2);
    for (int r = 0; r < R; r++) {
        const xblock *x = xblock_at(xb, r * nb, L);
        for (int h = 0; h < halves; h++) {
            __m512 v = _mm512_cvtepi32_ps(L == 2 ? _mm512_add_epi32(times_base(a[r][h][0]), a[r][h][1]) : a[r][h][0]);
            if (L > 2) {
                v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r][h][1]), c1, v);
                v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r][h][2]), c2, v);
                if (xblock_offset(fmt)) v = _mm512_add_ps(v, _mm512_set1_ps(x->foff[h]));
            }
            acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(d[h], _mm512_set1_ps(x->s)), acc[r]);
            if (xblock_sums(fmt)) acc[r] = _mm512_fmadd_ps(m[h], _mm512_set1_ps(x->sum[halves == 2 ? h : 0]), acc[r]);
        }
    }
}

/* One panel against mr rows of xq (row stride nb blocks) in `limbs` limbs; y gets columns [0, nvalid) of its
 * first `stored` rows. */
static inline __attribute__((always_inline)) void panel(const int fmt, const int mr, const int limbs, const rg_panel v,
                                                         int64_t nb, const xblock *xq, float *y, int64_t ldy,
                                                         int64_t nvalid, int stored) {
    __m512 acc[MR];
    for (int i = 0; i < MR; i++) acc[i] = _mm512_setzero_ps();  /* all MR: `stored` <= mr is not known here */
    const int64_t block_bytes = FMT_BLOCK_BYTES(fmt), scale_bytes = FMT_SCALE_BYTES(fmt);
    const int64_t min_bytes = xblock_sums(fmt) ? FMT_MIN_BYTES(fmt) : 0;  /* an offset format's are not read */
    for (int64_t b = 0; b < nb; b++) {
        /* the weights PREFETCH_BLOCKS and PREFETCH_FAR ahead (past this panel's end: the next panel's, which
         * follow) */
        const char *ahead = (const char *)(v.qs + (b + PREFETCH_BLOCKS) * block_bytes);
        const char *far = (const char *)(v.qs + (b + PREFETCH_FAR) * block_bytes);
        for (int64_t line = 0; line < block_bytes; line += 64) {
            _mm_prefetch(ahead + line, _MM_HINT_T0);
            _mm_prefetch(far + line, _MM_HINT_T1);
        }
        for (int64_t line = 0; line < scale_bytes; line += 64)
            _mm_prefetch((const char *)v.d + (b + PREFETCH_BLOCKS) * scale_bytes + line, _MM_HINT_T0);
        for (int64_t line = 0; line < min_bytes; line += 64)
            _mm_prefetch((const char *)v.m + (b + PREFETCH_BLOCKS) * min_bytes + line, _MM_HINT_T0);
        if (FMT_SUPER(fmt) && b % 8 == 0)
            _mm_prefetch((const char *)v.sup + (b / 8 + 1) * FMT_SUP_BYTES(fmt), _MM_HINT_T0);
        __m512 d[2], m[2];
        scales16(fmt, &v, b, d, m);
        __m512i w[8];  /* w[g]: k = 4g .. 4g + 3 of the 16 rows, unsigned (signed int8 + 128 for I8H) */
        weights16(fmt, v.qs + b * block_bytes, w);
        const int step = limbs == 1 ? ROWS_1LIMB : 2;  /* rows whose sums interleave (all in registers) */
        int i = 0;
        for (; i + step <= mr; i += step)
            rows_block(step, limbs, fmt, w, d, m, xblock_at(xq, i * nb + b, limbs), nb, acc + i);
        for (; i < mr; i++) rows_block(1, limbs, fmt, w, d, m, xblock_at(xq, i * nb + b, limbs), nb, acc + i);
    }
    const __mmask16 keep = (__mmask16)((1u << nvalid) - 1u);
    for (int i = 0; i < stored; i++) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}
#define PANEL_READS(fmt) 1 /* formats the vector path reads: all */
#elif defined(RG_AVX2)
/* acc += the dword dot products of 4 unsigned weight bytes with 4 signed activation bytes. */
static inline __m256i dot4(__m256i acc, __m256i w, __m256i x) {
#ifdef RG_AVXVNNI
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

/* Four activation bytes (k = 4g .. 4g + 3 of a limb) in every dword lane. */
static inline __m256i bcast4(const int8_t *x) {
    int32_t x4;
    memcpy(&x4, x, 4);
    return _mm256_set1_epi32(x4);
}

#ifndef RG_AVXVNNI
/* Groups of 4 weights whose vpmaddubsw pair sums (at most 2 * max q * 127 each) add up in int16 without
 * overflow: 8 for 4-bit q (30,480), 4 for 5-bit (31,496), 2 for q up to 63 (32,004). */
static inline int int16_groups(const int fmt) { return FMT_Q4(fmt) ? 8 : FMT_Q5(fmt) ? 4 : 2; }
#endif

/* Dword lane c: the sum over groups g0 .. g1 - 1 (k = 4g0 .. 4g1 - 1) of weight row c (of this half of the
 * panel) times one limb's activation bytes xl. Integer sums, exact in any order. */
static inline __attribute__((always_inline)) __m256i limb_dot(const int fmt, const __m256i *w, const int8_t *xl,
                                                               const int g0, const int g1) {
#ifndef RG_AVXVNNI
    if (fmt != FMT_I8H) {  /* vpmaddubsw's pair sums add in int16 over int16_groups(fmt) groups, then widen */
        const int run = int16_groups(fmt);
        __m256i a = _mm256_setzero_si256();
        for (int g = g0; g < g1; g += run) {
            __m256i s = _mm256_maddubs_epi16(w[g], bcast4(xl + 4 * g));
            for (int j = 1; j < run; j++) {
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[g + j], bcast4(xl + 4 * (g + j))));
                RG_KEEP_CHAIN(s);
            }
            a = _mm256_add_epi32(a, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
            RG_KEEP_CHAIN(a);
        }
        return a;
    }
#endif
    __m256i a = _mm256_setzero_si256();
    for (int g = g0; g < g1; g++) {
        const __m256i x = bcast4(xl + 4 * g);
        if (fmt != FMT_I8H) a = dot4(a, w[g], x);  /* unsigned q (vpdpbusd: without VNNI only signed q get here) */
#ifdef RG_AVXVNNI
        else a = dot4(a, _mm256_xor_si256(w[g], _mm256_set1_epi8(-128)), x);
#else  /* |q| times x with q's sign: vpmaddubsw's pair sums stay below 2^15 */
        else a = dot4(a, _mm256_abs_epi8(w[g]), _mm256_sign_epi8(x, w[g]));
#endif
    }
    return a;
}

/* The lane order of 8 weight rows' sums that words_rows' vphaddd leaves (its own inverse): rows 0, 1, 4, 5,
 * 2, 3, 6, 7. */
#define PAIR_ORDER _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)

/* 64-bit lane j of v in every lane (vpermq takes j as an immediate). */
static inline __attribute__((always_inline)) __m256i lane64(const __m256i v, const int j) {
    switch (j) {
        case 0: return _mm256_permute4x64_epi64(v, 0x00);
        case 1: return _mm256_permute4x64_epi64(v, 0x55);
        case 2: return _mm256_permute4x64_epi64(v, 0xAA);
        default: return _mm256_permute4x64_epi64(v, 0xFF);
    }
}

/* acc[r] += block b's products for R (1 or 2) rows of xb (xblock_at(xb, r * nb, limbs)) with signed 8-bit
 * weights w (one half panel's: group g's 8 rows x 4 k at w + 64 g) in two or three limbs stored as words
 * (XBLOCK_WORDS): each group's weights widened to int16 once for the R rows, whose words 254 q0 + q1 (and
 * third limb, widened) vpmaddwd multiplies into one dword lane per weight row and pair of k; vphaddd then
 * adds the pairs, leaving the weight rows in PAIR_ORDER, the order d (the block's scales) and acc are kept
 * in. Integer sums, exact: a row's result does not depend on the others. */
static inline __attribute__((always_inline)) void words_rows(const int R, const int limbs, const uint8_t *w,
                                                              const __m256 d, const xblock *xb, int64_t nb,
                                                              __m256 *acc) {
    __m256i t[2][2], u[2][2];  /* [row][weight rows 0-3 | 4-7]: the words' sums, the third limb's */
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 2; j++) t[r][j] = u[r][j] = _mm256_setzero_si256();
    __m256i x2[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  /* the third limb of 4 groups (16 k)
                                                                           widened, a group a 64-bit lane */
    for (int g = 0; g < 8; g++) {
        const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 64 * g)));
        const __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 64 * g + 16)));
        for (int r = 0; r < R; r++) {
            const xblock *x = xblock_at(xb, r * nb, limbs);
            int64_t x8;  /* the words of k = 4g .. 4g + 3 */
            memcpy(&x8, (const int16_t *)(const void *)x->q[0] + 4 * g, 8);
            const __m256i xw = _mm256_set1_epi64x(x8);
            t[r][0] = _mm256_add_epi32(t[r][0], _mm256_madd_epi16(lo, xw));
            t[r][1] = _mm256_add_epi32(t[r][1], _mm256_madd_epi16(hi, xw));
            if (limbs == 3) {
                if (g % 4 == 0) x2[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x->q[2] + 4 * g)));
                const __m256i x2g = lane64(x2[r], g % 4);  /* group g's words */
                u[r][0] = _mm256_add_epi32(u[r][0], _mm256_madd_epi16(lo, x2g));
                u[r][1] = _mm256_add_epi32(u[r][1], _mm256_madd_epi16(hi, x2g));
                RG_KEEP_CHAIN(u[r][0]);
                RG_KEEP_CHAIN(u[r][1]);
            }
            RG_KEEP_CHAIN(t[r][0]);
            RG_KEEP_CHAIN(t[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {  /* x = s (254 q0 + q1) in two limbs, s / 254 (254 q0 + q1 + q2 / 254) in three */
        const xblock *x = xblock_at(xb, r * nb, limbs);
        __m256 sum = _mm256_cvtepi32_ps(_mm256_hadd_epi32(t[r][0], t[r][1]));
        if (limbs == 3)
            sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_hadd_epi32(u[r][0], u[r][1])), _mm256_set1_ps(C1), sum);
        const float s = limbs == 3 ? x->s * C1 : x->s;
        acc[r] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_set1_ps(s)), acc[r]);
    }
}

/* `panel` on 8-float vectors: the two halves of the panel (rows c = 8h .. 8h + 7) one after the other; a
 * block's weights are unpacked once for all mr rows. */
static inline __attribute__((always_inline)) void panel(const int fmt, const int mr, const int limbs, const rg_panel v,
                                                         int64_t nb, const xblock *xq, float *y, int64_t ldy,
                                                         int64_t nvalid, int stored) {
    const __m256 c1 = _mm256_set1_ps(C1), c2 = _mm256_set1_ps(C2);
    const int64_t block_bytes = FMT_BLOCK_BYTES(fmt), halves = FMT_HALVES(fmt);
    const int64_t scale_bytes = FMT_SCALE_BYTES(fmt);
    const int64_t min_bytes = xblock_sums(fmt) ? FMT_MIN_BYTES(fmt) : 0;  /* an offset format's are not read */
    for (int h = 0; h < 2; h++) {
        __m256 acc[MR];
        for (int i = 0; i < MR; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            {  /* the two passes stream the next panel (the one after this one's end) into L2, half a block a
                * step (L1 prefetches too, of the blocks just ahead, cost several-row calls more than they
                * saved one-row ones) */
                const int64_t t = h * nb + b;
                const char *qs = (const char *)(v.qs + nb * block_bytes) + t * block_bytes / 2;
                for (int64_t line = 0; line < block_bytes / 2; line += 64) _mm_prefetch(qs + line, _MM_HINT_T1);
                _mm_prefetch((const char *)v.d + nb * scale_bytes + t * scale_bytes / 2, _MM_HINT_T1);
                if (min_bytes) _mm_prefetch((const char *)v.m + nb * min_bytes + t * min_bytes / 2, _MM_HINT_T1);
            }
            __m256 d[2], m[2];
            scales8(fmt, &v, b, h, d, m);
            const uint8_t *qb = v.qs + b * block_bytes;
            if (XBLOCK_WORDS(fmt, limbs)) {  /* two rows at a time (their 8 integer sums in registers) */
                const __m256 dp = _mm256_permutevar8x32_ps(d[0], PAIR_ORDER);
                int i = 0;
                for (; i + 2 <= mr; i += 2)
                    words_rows(2, limbs, qb + 32 * h, dp, xblock_at(xq, i * nb + b, limbs), nb, acc + i);
                if (i < mr) words_rows(1, limbs, qb + 32 * h, dp, xblock_at(xq, i * nb + b, limbs), nb, acc + i);
                continue;
            }
            __m256i w[8];
            weights8(fmt, qb, h, w);
            for (int i = 0; i < mr; i++) {
                const xblock *xb = xblock_at(xq, i * nb + b, limbs);
                for (int s = 0; s < halves; s++) {
                    __m256i a[LIMBS];
                    for (int l = 0; l < limbs; l++) a[l] = limb_dot(fmt, w, xb->q[l], 8 / halves * s, 8 / halves * (s + 1));
                    if (xblock_offset(fmt) && limbs <= 2)
                        a[limbs - 1] = _mm256_add_epi32(a[limbs - 1], _mm256_set1_epi32(xb->off[s]));
                    __m256 sum = _mm256_cvtepi32_ps(limbs == 2 ? _mm256_add_epi32(times_base(a[0]), a[1]) : a[0]);
                    if (limbs > 2) {
                        sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[1]), c1, sum);
                        sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[2]), c2, sum);
                        if (xblock_offset(fmt)) sum = _mm256_add_ps(sum, _mm256_set1_ps(xb->foff[s]));
                    }
                    acc[i] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d[s], _mm256_set1_ps(xb->s)), acc[i]);
                    if (xblock_sums(fmt))
                        acc[i] = _mm256_fmadd_ps(m[s], _mm256_set1_ps(xb->sum[halves == 2 ? s : 0]), acc[i]);
                }
            }
        }
        const int64_t n0 = 8 * h, cnt = nvalid - n0 < 0 ? 0 : (nvalid - n0 > 8 ? 8 : nvalid - n0);
        for (int i = 0; i < stored; i++) {
            float out[8];
            _mm256_storeu_ps(out, XBLOCK_WORDS(fmt, limbs) ? _mm256_permutevar8x32_ps(acc[i], PAIR_ORDER) : acc[i]);
            memcpy(y + i * ldy + n0, out, sizeof(float) * (size_t)cnt);
        }
    }
}
#define PANEL_READS(fmt) 1
#elif defined(RG_NEON)
/* Group g's weights of block qb (k = 4g .. 4g + 3 of the 16 rows) as signed bytes, rows 4h .. 4h + 3 in
 * w[h]: each int32 lane of sdot's products is then one output row. 4-bit q (0..15) fit int8 as they
 * are, and 8-bit q are signed already, so no offset is taken off (unlike vpdpbusd's unsigned side). */
static inline __attribute__((always_inline)) void neon_weights(const int bits, const uint8_t *qb, const int g,
                                                                int8x16_t w[4]) {
    for (int h = 0; h < 4; h++) {
        if (bits == 4) {
            const uint8x16_t v = vld1q_u8(qb + 64 * (g & 3) + 16 * h);
            w[h] = vreinterpretq_s8_u8(g < 4 ? vandq_u8(v, vdupq_n_u8(15)) : vshrq_n_u8(v, 4));
        } else {
            w[h] = vld1q_s8((const int8_t *)qb + 64 * g + 16 * h);
        }
    }
}

/* sdot of group G's weights with its 4 activation bytes of each limb (lane G % 4 of the limb's half G / 4). */
#define NEON_GROUP(G)                                                                            \
    do {                                                                                         \
        int8x16_t w[4];                                                                          \
        neon_weights(bits, qb, G, w);                                                            \
        for (int l = 0; l < limbs; l++)                                                          \
            for (int h = 0; h < 4; h++) a[l][h] = vdotq_laneq_s32(a[l][h], w[h], x[l][(G) / 4], (G) % 4); \
    } while (0)

/* `panel` on 4-float vectors for the fp16 formats (U4H, O4H, I8H) (rows c = 4h .. 4h + 3 in vector h), one activation row at a time: its
 * limbs' int32 sums (up to 12; the unused limbs' stay zero) stay in registers over the block's 8 groups. */
static inline __attribute__((always_inline)) void panel(const int fmt, const int mr, const int limbs, const rg_panel v,
                                                         int64_t nb, const xblock *xq, float *y, int64_t ldy,
                                                         int64_t nvalid, int stored) {
    const int bits = fmt == FMT_I8H ? 8 : 4;
    const uint8_t *qs = v.qs;
    const uint16_t *d16 = (const uint16_t *)v.d, *m16 = (const uint16_t *)v.m;
    float32x4_t acc[MR][4];
    for (int i = 0; i < MR; i++)
        for (int h = 0; h < 4; h++) acc[i][h] = vdupq_n_f32(0.0f);
    const int64_t block_bytes = bits == 4 ? 256 : 512;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qb = qs + b * block_bytes;
        float32x4_t d[4], m[4];
        for (int h = 0; h < 4; h++) {
            d[h] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d16 + b * NR + 4 * h)));
            m[h] = xblock_sums(fmt) ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(m16 + b * NR + 4 * h))) : vdupq_n_f32(0.0f);
        }
        for (int i = 0; i < mr; i++) {
            const xblock *xb = xblock_at(xq, i * nb + b, limbs);
            int8x16_t x[LIMBS][2];
            int32x4_t a[LIMBS][4];
            for (int l = 0; l < LIMBS; l++) {
                if (l < limbs) {  /* (only those are stored) */
                    x[l][0] = vld1q_s8(xb->q[l]);
                    x[l][1] = vld1q_s8(xb->q[l] + 16);
                }
                for (int h = 0; h < 4; h++)  /* the last of one or two limbs starts from the offset's share */
                    a[l][h] = vdupq_n_s32(xblock_offset(fmt) && limbs <= 2 && l == limbs - 1 ? xb->off[0] : 0);
            }
            NEON_GROUP(0); NEON_GROUP(1); NEON_GROUP(2); NEON_GROUP(3);
            NEON_GROUP(4); NEON_GROUP(5); NEON_GROUP(6); NEON_GROUP(7);
            const float32x4_t ds_ = vdupq_n_f32(xb->s), sum = vdupq_n_f32(xblock_sums(fmt) ? xb->sum[0] : 0.0f);
            const float32x4_t foff = vdupq_n_f32(xblock_offset(fmt) && limbs > 2 ? xb->foff[0] : 0.0f);
            for (int h = 0; h < 4; h++) {
                float32x4_t v;
                if (limbs == 2) {  /* 254 a0 + a1 in int32, as the other paths */
                    v = vcvtq_f32_s32(vmlaq_n_s32(a[1][h], a[0][h], (int32_t)LIMB_BASE));
                } else {  /* one limb (a1, a2 zero) or three */
                    v = vfmaq_n_f32(vcvtq_f32_s32(a[0][h]), vcvtq_f32_s32(a[1][h]), C1);
                    v = vaddq_f32(vfmaq_n_f32(v, vcvtq_f32_s32(a[2][h]), C2), foff);
                }
                acc[i][h] = vfmaq_f32(acc[i][h], v, vmulq_f32(d[h], ds_));
                if (xblock_sums(fmt)) acc[i][h] = vfmaq_f32(acc[i][h], m[h], sum);
            }
        }
    }
    for (int i = 0; i < stored; i++) {
        float out[NR];
        for (int h = 0; h < 4; h++) vst1q_f32(out + 4 * h, acc[i][h]);
        memcpy(y + i * ldy, out, sizeof(float) * (size_t)nvalid);
    }
}
#undef NEON_GROUP
#define PANEL_READS(fmt) ((fmt) == FMT_U4H || (fmt) == FMT_O4H || (fmt) == FMT_I8H) /* the others: panel_ref */
#else
#define PANEL_READS(fmt) 0 /* the scalar build: panel_ref for all */
#endif

/* `panel` (or `panel_ref`) with the format, mr and limbs compile-time constants (accumulators in registers).
 * Three limbs (every row count a decode step has) take the rows as they come; fewer (long prompts) take
 * whole tiles of MR rows, the rows past `stored` being zero padding (quantize_rows). */
static void panel_any(int fmt, int mr, int limbs, const rg_panel v, int64_t nb, const xblock *xq, float *y,
                      int64_t ldy, int64_t nvalid, int stored) {
    (void)mr;  /* (the scalar build's panel_ref takes the stored rows only) */
    if (!PANEL_READS(fmt)) {
        panel_ref(fmt, stored, limbs, v, nb, xq, y, ldy, nvalid);
        return;
    }
#if defined(RG_AVX512) || defined(RG_AVX2) || defined(RG_NEON)
#define FORMATS(R, L)                                                                        \
    switch (fmt) {                                                                           \
        case FMT_U4H: panel(FMT_U4H, R, L, v, nb, xq, y, ldy, nvalid, stored); return;       \
        case FMT_O4H: panel(FMT_O4H, R, L, v, nb, xq, y, ldy, nvalid, stored); return;       \
        case FMT_I8H: panel(FMT_I8H, R, L, v, nb, xq, y, ldy, nvalid, stored); return;       \
        PANEL_CASES_MORE(R, L)                                                               \
    }                                                                                        \
    return;
#if !defined(RG_NEON)
#define PANEL_CASES_MORE(R, L)                                                         \
    case FMT_O5H: panel(FMT_O5H, R, L, v, nb, xq, y, ldy, nvalid, stored); return;     \
    case FMT_U4F: panel(FMT_U4F, R, L, v, nb, xq, y, ldy, nvalid, stored); return;     \
    case FMT_U8F: panel(FMT_U8F, R, L, v, nb, xq, y, ldy, nvalid, stored); return;     \
    case FMT_U8F2: panel(FMT_U8F2, R, L, v, nb, xq, y, ldy, nvalid, stored); return;   \
    case FMT_K4: panel(FMT_K4, R, L, v, nb, xq, y, ldy, nvalid, stored); return;       \
    case FMT_K6: panel(FMT_K6, R, L, v, nb, xq, y, ldy, nvalid, stored); return;       \
    case FMT_U5H: panel(FMT_U5H, R, L, v, nb, xq, y, ldy, nvalid, stored); return;     \
    case FMT_U5F: panel(FMT_U5F, R, L, v, nb, xq, y, ldy, nvalid, stored); return;
#else
#define PANEL_CASES_MORE(R, L)
#endif
#define CASE(R) case R: FORMATS(R, LIMBS)
    if (limbs == 1) {
        FORMATS(MR, 1)
    } else if (limbs == 2) {
        FORMATS(MR, 2)
    }
    switch (mr) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    }
#undef CASE
#undef FORMATS
#undef PANEL_CASES_MORE
#endif
}

typedef struct {
    int fmt, limbs;
    const rg_block_weight *w;
    int64_t nb;
    const xblock *xq;
    int64_t M, n;
    float *y;
} gemm_job;

static void panels_range(void *job, int64_t begin, int64_t end, int tid) {
    const gemm_job *j = (const gemm_job *)job;
    (void)tid;
    for (int64_t p = begin; p < end; p++) {
        const int64_t nvalid = j->n - p * NR < NR ? j->n - p * NR : NR;
        const rg_panel v = rg_panel_of(j->fmt, j->w, j->nb, p);
        for (int64_t i0 = 0; i0 < j->M; i0 += MR) {
            const int mr = (int)(j->M - i0 < MR ? j->M - i0 : MR);
            panel_any(j->fmt, mr, j->limbs, v, j->nb, xblock_at(j->xq, i0 * j->nb, j->limbs),
                      j->y + i0 * j->n + p * NR, j->n, nvalid, mr);
        }
    }
}

int64_t block_gemm_amx_rows(void) { return amx_ready() ? AMX_MIN_ROWS : 0; }

enum { ON_VECTORS, ON_INT8_TILES, ON_BF16_TILES };

/* Where M rows of format fmt in `limbs` limbs run: AMX int8 tiles (amx_gemm.c) from AMX_MIN_ROWS rows, but
 * the fp16 formats in three limbs on bfloat16 tiles (amx_bf16.c, faster there) and the half-block formats in
 * one limb on the vector path (two half-width tile products and stores a block: slower than vpdpbusd). */
static int gemm_path(int fmt, int limbs, int64_t M) {
    if (M < AMX_MIN_ROWS || (limbs == 1 && FMT_HALVES(fmt) == 2) || !amx_ready()) return ON_VECTORS;
    return limbs == LIMBS && (fmt == FMT_U4H || fmt == FMT_O4H || fmt == FMT_I8H) ? ON_BF16_TILES : ON_INT8_TILES;
}

/* x float [M, k], y float [M, n], contiguous; w's qs, scale, minv in the panel layout above for
 * ceil(n / 16) panels; `limbs` (1..3) activation limbs: 3 as float32 (decode), 2 to ~2^-16 of each block's
 * largest activation, 1 to 2^-8 (llama.cpp's Q8 activations), each fewer about halving the integer work.
 * Returns 0, or -1 when k is not a multiple of 32, limbs is not 1..3, w's format is not one of
 * block_format.h's, or the activation limbs cannot be allocated. From AMX_MIN_ROWS rows, where the CPU lends
 * AMX, the same sums run on its int8 tiles (amx_gemm.c), with the same result; but the fp16 formats in three
 * limbs, float32's precision, run on its bfloat16 tiles (amx_bf16.c), faster, within float32's rounding. */
int block_gemm_limbs(const rg_block_weight *w, const float *x, int64_t M, int64_t k, int64_t n, float *y, int limbs,
                     int nthreads) {
    const int fmt = rg_block_format(w);
    if (k % QK != 0 || limbs < 1 || limbs > LIMBS || fmt == FMT_BAD || (FMT_MIN_BYTES(fmt) && w->minv == NULL) ||
        (FMT_SUPER(fmt) && k % 256 != 0))
        return -1;
    const int path = gemm_path(fmt, limbs, M), int8_tiles = path == ON_INT8_TILES;
    if (path == ON_BF16_TILES) return amx_bf16_gemm(w, x, M, k, n, y, nthreads);
    const int64_t nb = k / QK, panels = (n + NR - 1) / NR;
    const int64_t tile = int8_tiles ? AMX_TILE_ROWS : MR;  /* the AMX tiles' rows, or the vector path's */
    const int64_t rows = limbs < LIMBS || int8_tiles ? (M + tile - 1) / tile * tile : M;  /* whole tiles: the rest zero */
    xblock *xq = (xblock *)rg_scratch(RG_SCRATCH_ACTIVATIONS, (size_t)(XBLOCK_BYTES(limbs) * rows * nb));
    if (xq == NULL) return -1;
    quantize_rows(x, M, k, limbs, fmt, xq, nthreads);
    memset((char *)xq + XBLOCK_BYTES(limbs) * M * nb, 0, (size_t)(XBLOCK_BYTES(limbs) * (rows - M) * nb));
    if (int8_tiles) return amx_block_gemm(w, xq, M, k, n, y, limbs, nthreads);
    gemm_job job = {fmt, limbs, w, nb, xq, M, n, y};
    /* a panel over a whole tile of rows costs more than a claim: runs shrink to single panels at the end */
    rg_parallel(nthreads, panels, M >= MR ? RG_GUIDED : RG_STATIC, panels_range, &job);
    return 0;
}

int block_gemm(const rg_block_weight *w, const float *x, int64_t M, int64_t k, int64_t n, float *y, int nthreads) {
    return block_gemm_limbs(w, x, M, k, n, y, LIMBS, nthreads);
}
