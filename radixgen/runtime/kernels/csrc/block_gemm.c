/* y[M, N] = x[M, K] @ W^T for a weight W [N, K] in GGUF's 32-weight blocks (Q4_0/Q4_1/Q8_0),
 * repacked into panels of NR = 16 output rows.
 *
 * Block b of row n holds 32 small integers q, a float32 scale d and, for 4-bit, a min m:
 *   4-bit: W[n, 32b + j] = d * q_j + m, q in 0..15; Q4_0 is m = -8 d.
 *   8-bit: W[n, 32b + j] = d * q_j, q in -128..127.
 * Panel layout (p = n / 16, c = n % 16), so one 16-byte load holds a weight column for 16 rows:
 *   4-bit: qs[p][b][j][c], j < 16: low nibble = q_j, high nibble = q_{j+16} (GGUF's byte pairing)
 *   8-bit: qs[p][b][j][c], j < 32
 *   d, m:  [p][b][c]
 * Each weight column is widened to 16 floats in registers, scaled (d * q + m, exact in float32: the
 * product has at most 15 significant bits; these are the values the gguf package dequantizes to),
 * and multiplied into up to 16 activation rows, whose accumulators stay in registers. x is
 * transposed first so the 16 rows' values for one k share a cache line. Every output sums its K
 * products in the same order whatever M is, so a row's result does not depend on its batch-mates.
 * Panels are split over OpenMP threads (torch's runtime, so no second thread team). The weight
 * bytes are read once per 16 rows: 0.56 (Q4_1) or 1.06 (Q8_0) bytes a weight instead of 4, and at
 * 16 rows the widening costs little beside the 16 multiply-adds, so this beats a dense float32 GEMM
 * up to a few tens of rows.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "radixgen_kernels.h"

#define QK 32
#define NR 16   /* output rows per panel: one 16-float vector */
#define MR 16   /* activation rows per pass (accumulators in registers) */

#ifdef RADIXGEN_SCALAR
/* The scalar reference: every output sums its products in the same order as the vector code
 * (per block: weight j, then weight j + 16 for 4-bit; j in order for 8-bit). */
static void panel_any(int bits, int mr, const uint8_t *qs, const float *d, const float *m, int64_t nb,
                      const float *xt, float *y, int64_t ldy, int64_t nvalid) {
    for (int64_t c = 0; c < nvalid; c++)
        for (int i = 0; i < mr; i++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const float *xb = xt + b * QK * mr;
                const float dc = d[b * NR + c];
                if (bits == 4) {
                    const float mc = m[b * NR + c];
                    const uint8_t *qb = qs + b * (QK / 2) * NR;
                    for (int j = 0; j < QK / 2; j++) {
                        const uint8_t v = qb[j * NR + c];
                        acc += ((float)(v & 15) * dc + mc) * xb[j * mr + i];
                        acc += ((float)(v >> 4) * dc + mc) * xb[(j + QK / 2) * mr + i];
                    }
                } else {
                    const int8_t *qb = (const int8_t *)qs + b * QK * NR;
                    for (int j = 0; j < QK; j++) acc += ((float)qb[j * NR + c] * dc) * xb[j * mr + i];
                }
            }
            y[i * ldy + c] = acc;
        }
}
#else
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint8_t vu8 __attribute__((vector_size(16)));

static inline vf load_vf(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }

/* acc[i] += w * xk[i] for the mr rows of one k. */
#define FMA_ROWS(w, xk) for (int i = 0; i < mr; i++) acc[i] += (w) * (xk)[i]

/* One panel against mr rows of xt ([K, mr], k-major). bits 4 or 8; y gets columns [0, nvalid). */
static inline __attribute__((always_inline)) void panel(int bits, int mr, const uint8_t *qs, const float *d,
                                                         const float *m, int64_t nb, const float *xt, float *y,
                                                         int64_t ldy, int64_t nvalid) {
    vf acc[MR];
    for (int i = 0; i < mr; i++) acc[i] = (vf){0};
    for (int64_t b = 0; b < nb; b++) {
        const vf dv = load_vf(d + b * NR);
        const float *xb = xt + b * QK * mr;
        if (bits == 4) {
            const vf mv = load_vf(m + b * NR);
            const uint8_t *qb = qs + b * (QK / 2) * NR;
            for (int j = 0; j < QK / 2; j++) {
                vu8 v;
                memcpy(&v, qb + j * NR, sizeof v);
                const vf lo = __builtin_convertvector(__builtin_convertvector(v & 15, vi), vf) * dv + mv;
                const vf hi = __builtin_convertvector(__builtin_convertvector(v >> 4, vi), vf) * dv + mv;
                FMA_ROWS(lo, xb + j * mr);
                FMA_ROWS(hi, xb + (j + QK / 2) * mr);
            }
        } else {
            const uint8_t *qb = qs + b * QK * NR;
            for (int j = 0; j < QK; j++) {
                vu8 v;  /* int8 bytes; flipping the sign bit makes them q + 128 unsigned (widens in one op) */
                memcpy(&v, qb + j * NR, sizeof v);
                const vi q = __builtin_convertvector(v ^ 0x80, vi) - 128;
                const vf w = __builtin_convertvector(q, vf) * dv;
                FMA_ROWS(w, xb + j * mr);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        float out[NR];
        memcpy(out, &acc[i], sizeof out);
        memcpy(y + i * ldy, out, sizeof(float) * (size_t)nvalid);
    }
}

/* `panel` with mr a compile-time constant (accumulators in registers). */
static void panel_any(int bits, int mr, const uint8_t *qs, const float *d, const float *m, int64_t nb,
                      const float *xt, float *y, int64_t ldy, int64_t nvalid) {
#define CASE(R)                                                                          \
    case R:                                                                              \
        if (bits == 4) panel(4, R, qs, d, m, nb, xt, y, ldy, nvalid);                    \
        else panel(8, R, qs, d, m, nb, xt, y, ldy, nvalid);                              \
        return;
    switch (mr) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
        CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
    }
#undef CASE
}
#endif

/* x float [M, k], y float [M, n], contiguous; w's qs, scale, minv in the panel layout above for
 * ceil(n / 16) panels. Returns 0, or -1 when k is not a multiple of 32, bits is not 4 or 8, or the
 * transposed x cannot be allocated. */
int block_gemm(const rg_block_weight *w, const float *x, int64_t M, int64_t k, int64_t n, float *y, int nthreads) {
    const int bits = (int)w->bits;
    const void *qs = w->qs;
    const float *d = w->scale, *m = w->minv;
    if (k % QK != 0 || (bits != 4 && bits != 8)) return -1;
    const int64_t nb = k / QK, panels = (n + NR - 1) / NR;
    const int64_t panel_bytes = nb * (bits == 4 ? QK / 2 : QK) * NR;
    float *xt = (float *)malloc(sizeof(float) * (size_t)(M * k));  /* per MR-row group: [k, rows] */
    if (xt == NULL) return -1;
    for (int64_t i0 = 0; i0 < M; i0 += MR) {
        const int64_t mr = M - i0 < MR ? M - i0 : MR;
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t i = 0; i < mr; i++) xt[i0 * k + kk * mr + i] = x[(i0 + i) * k + kk];
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t p = 0; p < panels; p++) {
        const int64_t nvalid = n - p * NR < NR ? n - p * NR : NR;
        for (int64_t i0 = 0; i0 < M; i0 += MR) {
            const int mr = (int)(M - i0 < MR ? M - i0 : MR);
            panel_any(bits, mr, (const uint8_t *)qs + p * panel_bytes, d + p * nb * NR,
                      m == NULL ? NULL : m + p * nb * NR, nb, xt + i0 * k, y + i0 * n + p * NR, n, nvalid);
        }
    }
    free(xt);
    return 0;
}
