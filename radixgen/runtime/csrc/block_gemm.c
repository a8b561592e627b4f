/* y[M, N] = x[M, K] @ W^T for a weight W [N, K] kept in 32-weight blocks (GGUF Q4_0/Q4_1/Q8_0).
 *
 * Block b of row n holds 32 small integers q, a float32 scale d and, for 4-bit, a min m:
 *   4-bit: W[n, 32b + j] = d * q_j + m, q in 0..15; byte j of the block holds q_j (low nibble) and
 *          q_{j+16} (high nibble), as in GGUF. Q4_0 is m = -8 d.
 *   8-bit: W[n, 32b + j] = d * q_j, q in -128..127.
 * The weights are the float32 values the gguf package dequantizes to; all math is float32:
 *   y[i, n] = sum_b d_b * sum_j q_j x[i, 32b + j]  +  sum_b m_b * xsum[i, b],
 * with xsum[i, b] the sum of x[i]'s b-th block. Each weight byte is read from memory once per call
 * and widened in registers, so decoding (M of 1-3) streams 0.56 (Q4_1) or 1.06 (Q8_0) bytes per weight
 * instead of 4. Rows of x go in groups of MR; for larger M a dense GEMM is faster (compute-bound).
 * Rows of W are split over OpenMP threads (the runtime torch itself uses, so no second thread team).
 */
#include <stdint.h>
#include <stdlib.h>
#include "simd_math.h"

#define QK 32
#define MR 4

#ifdef __AVX2__
/* The four 8-weight chunks of a block as floats (q, not yet scaled). */
static inline void block_q(int bits, const uint8_t *q, __m256 out[4]) {
    if (bits == 4) {
        const __m128i v = _mm_loadu_si128((const __m128i *)q), low4 = _mm_set1_epi8(15);
        const __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
        out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
        out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
        out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
        out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    } else {
        for (int p = 0; p < 4; p++)
            out[p] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * p))));
    }
}

/* sum_b d_b * dot(q_b, x[i]_b) for one row of W and `mr` (compile-time after inlining) rows of x. */
static inline __attribute__((always_inline)) void row_dots(int bits, int mr, const uint8_t *q, const float *scale,
                                                           int64_t nb, const float *x, int64_t k, float *out) {
    __m256 tot[MR];
    for (int i = 0; i < mr; i++) tot[i] = _mm256_setzero_ps();
    const int64_t qbytes = bits == 4 ? QK / 2 : QK;
    for (int64_t b = 0; b < nb; b++) {
        __m256 qf[4];
        block_q(bits, q + b * qbytes, qf);
        const __m256 d = _mm256_set1_ps(scale[b]);
        for (int i = 0; i < mr; i++) {
            const float *xb = x + i * k + b * QK;
            __m256 acc = _mm256_mul_ps(qf[0], _mm256_loadu_ps(xb));
            acc = _mm256_fmadd_ps(qf[1], _mm256_loadu_ps(xb + 8), acc);
            acc = _mm256_fmadd_ps(qf[2], _mm256_loadu_ps(xb + 16), acc);
            acc = _mm256_fmadd_ps(qf[3], _mm256_loadu_ps(xb + 24), acc);
            tot[i] = _mm256_fmadd_ps(acc, d, tot[i]);
        }
    }
    for (int i = 0; i < mr; i++) out[i] = hsum(tot[i]);
}

/* dot(a, b) over n floats. */
static inline float dot(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    float s = hsum(acc);
    for (; j < n; j++) s += a[j] * b[j];
    return s;
}
#else
static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t j = 0; j < n; j++) s += a[j] * b[j];
    return s;
}
#endif

static void row_dots_any(int bits, int mr, const uint8_t *q, const float *scale, int64_t nb, const float *x,
                         int64_t k, float *out) {
#ifdef __AVX2__
    switch (mr) {  /* constant mr per case: accumulators stay in registers */
    case 1: row_dots(bits, 1, q, scale, nb, x, k, out); return;
    case 2: row_dots(bits, 2, q, scale, nb, x, k, out); return;
    case 3: row_dots(bits, 3, q, scale, nb, x, k, out); return;
    default: row_dots(bits, 4, q, scale, nb, x, k, out); return;
    }
#else
    const int64_t qbytes = bits == 4 ? QK / 2 : QK;
    for (int i = 0; i < mr; i++) out[i] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qb = q + b * qbytes;
        for (int i = 0; i < mr; i++) {
            const float *xb = x + i * k + b * QK;
            float acc = 0.0f;
            for (int j = 0; j < QK; j++) {
                const float qj = bits == 4 ? (float)(j < QK / 2 ? qb[j] & 15 : qb[j - QK / 2] >> 4)
                                           : (float)((const int8_t *)qb)[j];
                acc += qj * xb[j];
            }
            out[i] += scale[b] * acc;
        }
    }
#endif
}

/* bits: 4 (qs uint8 [n, k/2], minv float [n, k/32]) or 8 (qs int8 [n, k], minv NULL); scale float [n, k/32];
 * x float [M, k] and y float [M, n], contiguous. Returns 0, or -1 when k is not a multiple of 32 or the
 * block sums cannot be allocated. */
int block_gemm(int bits, const float *x, int64_t M, int64_t k, const void *qs, const float *scale,
               const float *minv, int64_t n, float *y, int nthreads) {
    if (k % QK != 0) return -1;
    const int64_t nb = k / QK, qrow = bits == 4 ? k / 2 : k;
    float *xsum = NULL;
    if (bits == 4) {
        xsum = (float *)malloc(sizeof(float) * (size_t)(M * nb));  /* [M, nb] */
        if (xsum == NULL) return -1;
        for (int64_t i = 0; i < M * nb; i++) {
            float s = 0.0f;
            for (int j = 0; j < QK; j++) s += x[i * QK + j];
            xsum[i] = s;
        }
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t row = 0; row < n; row++) {
        const uint8_t *q = (const uint8_t *)qs + row * qrow;
        for (int64_t i0 = 0; i0 < M; i0 += MR) {
            const int mr = (int)(M - i0 < MR ? M - i0 : MR);
            float dots[MR];
            row_dots_any(bits, mr, q, scale + row * nb, nb, x + i0 * k, k, dots);
            for (int i = 0; i < mr; i++)
                y[(i0 + i) * n + row] = dots[i] + (bits == 4 ? dot(minv + row * nb, xsum + (i0 + i) * nb, nb) : 0.0f);
        }
    }
    free(xsum);
    return 0;
}
