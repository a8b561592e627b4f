/* Rows of a block weight (block_gemm.c's panel layout, any block_format.h format) back to float32 or
 * bfloat16: the embedding lookup of a model whose token table stays in blocks, and the wide steps
 * (long prompt chunks) whose GEMMs run on a dequantized slice of a weight at a time instead of a
 * dense copy of the model. Each value is scale * q + min in float32, as the Python reference
 * (`BlockWeight.dequantize`) and gguf's dequantization compute it (no FMA contraction here).
 */
#include <stdint.h>
#include <stdlib.h>
#include "block_format.h"
#include "radixgen_kernels.h"
#include "thread_pool.h"

#pragma GCC optimize("fp-contract=off")

#define QK 32
#define NR 16

typedef struct {
    const rg_block_weight *w;
    int fmt;
    int64_t k;
    const int64_t *rows;
    void *out;
    int out_dtype;
} dequant_job;

/* Row r of the weight into dst [k] float32. */
static void dequant_row(const dequant_job *j, int64_t r, float *dst) {
    const int fmt = j->fmt, halves = FMT_HALVES(fmt), span = QK / halves;
    const int64_t nb = j->k / QK, c = r % NR;
    const rg_panel v = rg_panel_of(fmt, j->w, nb, r / NR);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qb = v.qs + b * FMT_BLOCK_BYTES(fmt);
        for (int h = 0; h < halves; h++) {
            float d, m;
            rg_block_dm(fmt, &v, b, h, c, &d, &m);
            for (int t = h * span; t < (h + 1) * span; t++) {
                const float x = (float)rg_block_q(fmt, qb, c, t) * d;
                dst[b * QK + t] = FMT_HAS_MIN(fmt) ? x + m : x;
            }
        }
    }
}

static void dequant_range(void *job, int64_t begin, int64_t end, int tid) {
    const dequant_job *j = (const dequant_job *)job;
    (void)tid;
    if (j->out_dtype == 0) {
        for (int64_t i = begin; i < end; i++) dequant_row(j, j->rows[i], (float *)j->out + i * j->k);
        return;
    }
    float *row = (float *)malloc(sizeof(float) * (size_t)j->k);  /* one row in float32, then rounded */
    if (row == NULL) return;  /* block_dequant_rows allocated the same before starting: cannot happen */
    for (int64_t i = begin; i < end; i++) {
        dequant_row(j, j->rows[i], row);
        uint16_t *bf = (uint16_t *)j->out + i * j->k;
        for (int64_t t = 0; t < j->k; t++) bf[t] = rg_float_to_bf16(row[t]);
    }
    free(row);
}

int block_dequant_rows(const rg_block_weight *w, int64_t k, const int64_t *rows, int64_t n_rows, void *out,
                       int out_dtype, int nthreads) {
    const int fmt = rg_block_format(w);
    if (k % QK != 0 || fmt == FMT_BAD || (FMT_MIN_BYTES(fmt) && w->minv == NULL) || (FMT_SUPER(fmt) && k % 256 != 0) ||
        (out_dtype != 0 && out_dtype != 1))
        return -1;
    if (out_dtype == 1) {  /* the per-thread row buffers must be to be had */
        void *probe = malloc(sizeof(float) * (size_t)k);
        if (probe == NULL) return -1;
        free(probe);
    }
    dequant_job job = {w, fmt, k, rows, out, out_dtype};
    rg_parallel(n_rows * k >= 65536 ? nthreads : 1, n_rows, RG_STATIC, dequant_range, &job);
    return 0;
}
