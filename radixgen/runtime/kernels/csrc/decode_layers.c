/* Every decoder layer of a pure-decode step in one call, for the float32 CPU forward.
 *
 * The same kernels in the same order as the model's per-op path (`DecoderLayer._forward_fused`):
 * RMSNorm, block GEMM q/k/v, rotary + K/V store, decode attention (or the shared-prefix
 * cascade), block GEMM o, residual + RMSNorm, block GEMM gate/up, SiLU * up, block GEMM down,
 * residual. So the result is bitwise that path's; what goes away is ~12 Python -> C transitions a
 * layer (5-10 us each: 2-4 ms of a SmolLM2 step).
 *
 * table [n_layers, LAYER_FIELDS] int64 holds each layer's pointers (as integers) and weight formats;
 * see the F_* indices. KV buffers are float32 [N, Hkv, D].
 */
#include <stdint.h>
#include <stdlib.h>

int block_gemm(int bits, const float *x, int64_t M, int64_t k, const void *qs, const float *d, const float *m,
               int64_t n, float *y, int nthreads);
int decode_attention(const float *q, const void *k_buf, const void *v_buf, int bf16, const int64_t *req_to_token,
                     int64_t table_stride, const int64_t *rows, const int64_t *seq_lens, int64_t start, int64_t B,
                     int64_t H, int64_t Hkv, int64_t D, float scale, float *out, float *lse, int nthreads);
int shared_prefix_attention(const float *q, const void *k_buf, const void *v_buf, int bf16, const int64_t *shared,
                            int64_t C, int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale, float *out,
                            const float *lse_own, int nthreads);
void add_rms_norm(float *h, const float *delta, const float *w, int64_t T, int64_t n, float eps, float *out,
                  int nthreads);
void silu_mul(const float *gu, int64_t T, int64_t inter, float *out, int nthreads);
void rope_store(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const float *cos_t, const float *sin_t,
                const int64_t *positions, const int64_t *loc, float *k_buf, float *v_buf, int nthreads);

/* Per-layer table fields. A matrix is 4 fields from its base: bits, qs, scale, min (0 when none). */
enum {
    F_INPUT_NORM, F_POST_NORM, F_K_BUF, F_V_BUF,
    F_QKV, F_O = F_QKV + 4, F_GATE_UP = F_O + 4, F_DOWN = F_GATE_UP + 4,
    LAYER_FIELDS = F_DOWN + 4
};

int decode_layers_fields(void) { return LAYER_FIELDS; }

#define PTR(type, i) ((type)(intptr_t)layer[i])

static int gemm(const int64_t *layer, int base, const float *x, int64_t T, int64_t k, int64_t n, float *y,
                int nthreads) {
    return block_gemm((int)layer[base], x, T, k, PTR(const void *, base + 1), PTR(const float *, base + 2),
                      PTR(const float *, base + 3), n, y, nthreads);
}

/* h [T, hidden] float32 is updated in place through all n_layers layers. Token t is a decode of
 * request rows[t] at positions[t], its K/V stored at slot loc[t], attending to seq_lens[t] keys
 * read through req_to_token [*, table_stride]; when C > 0 the first C keys of every request are
 * the slots `shared` and are attended by the cascade. Returns 0, or -1 when a kernel fails (sizes)
 * or memory runs out. */
int decode_layers(const int64_t *table, int64_t n_layers, float *h, int64_t T, int64_t hidden, int64_t H,
                  int64_t Hkv, int64_t D, int64_t inter, float eps, float scale, const float *cos_t,
                  const float *sin_t, const int64_t *positions, const int64_t *loc, const int64_t *req_to_token,
                  int64_t table_stride, const int64_t *rows, const int64_t *seq_lens, const int64_t *shared,
                  int64_t C, int nthreads) {
    const int64_t qd = H * D, qkv_n = (H + 2 * Hkv) * D;
    const size_t floats = (size_t)T * (size_t)(2 * hidden + qkv_n + 2 * qd + H + 3 * inter + hidden);
    float *work = (float *)malloc(sizeof(float) * floats);
    if (work == NULL) return -1;
    float *x = work, *qkv = x + T * hidden, *q = qkv + T * qkv_n, *att = q + T * qd, *lse = att + T * qd;
    float *gu = lse + T * H, *act = gu + T * 2 * inter, *o = act + T * inter, *dn = o + T * hidden;
    int rc = 0;
    for (int64_t l = 0; l < n_layers && rc == 0; l++) {
        const int64_t *layer = table + l * LAYER_FIELDS;
        float *k_buf = PTR(float *, F_K_BUF), *v_buf = PTR(float *, F_V_BUF);
        add_rms_norm(h, NULL, PTR(const float *, F_INPUT_NORM), T, hidden, eps, x, nthreads);
        if ((rc = gemm(layer, F_QKV, x, T, hidden, qkv_n, qkv, nthreads)) != 0) break;
        rope_store(qkv, T, H, Hkv, D, cos_t, sin_t, positions, loc, k_buf, v_buf, nthreads);
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < qd; j++) q[t * qd + j] = qkv[t * qkv_n + j];
        rc = decode_attention(q, k_buf, v_buf, 0, req_to_token, table_stride, rows, seq_lens, C, T, H, Hkv, D, scale,
                              att, C > 0 ? lse : NULL, nthreads);
        if (rc == 0 && C > 0)
            rc = shared_prefix_attention(q, k_buf, v_buf, 0, shared, C, T, H, Hkv, D, scale, att, lse, nthreads);
        if (rc != 0 || (rc = gemm(layer, F_O, att, T, qd, hidden, o, nthreads)) != 0) break;
        add_rms_norm(h, o, PTR(const float *, F_POST_NORM), T, hidden, eps, x, nthreads); /* h += o */
        if ((rc = gemm(layer, F_GATE_UP, x, T, hidden, 2 * inter, gu, nthreads)) != 0) break;
        silu_mul(gu, T, inter, act, nthreads);
        if ((rc = gemm(layer, F_DOWN, act, T, inter, hidden, dn, nthreads)) != 0) break;
        for (int64_t i = 0; i < T * hidden; i++) h[i] += dn[i];
    }
    free(work);
    return rc;
}
