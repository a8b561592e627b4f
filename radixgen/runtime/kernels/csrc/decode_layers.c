/* Every decoder layer of a pure-decode step in one call, for the float32 CPU forward.
 *
 * The same kernels in the same order as the model's per-op path (`DecoderLayer.forward` with its
 * C ops): RMSNorm, block GEMM q/k/v, (q/k head norms +) rotary + K/V store, decode attention (or the
 * shared-prefix cascade; a sliding-window layer over its window's slots), block GEMM o, (its output
 * norm,) residual + RMSNorm, block GEMM gate/up, SiLU or GELU * up, block GEMM down, (its output norm,)
 * residual. So the result is bitwise that path's; what goes away is ~12 Python -> C transitions a
 * layer (5-10 us each: 2-4 ms of a SmolLM2 step). The layers and the step are the structs of
 * radixgen_kernels.h.
 */
#include <stdint.h>
#include <stdlib.h>
#include "amx_gemm.h"
#include "radixgen_kernels.h"
#include "scratch.h"
#include "simd_math.h"

int rg_simd_level(void) {
    int bits = 0;
#ifdef RG_AVX2
    bits |= RG_BIT_AVX2;
#endif
#ifdef RG_AVXVNNI
    bits |= RG_BIT_AVXVNNI;
#endif
#ifdef RG_AVX512
    bits |= RG_BIT_AVX512;
#endif
#ifdef RG_NEON
    bits |= RG_BIT_NEON;
#endif
    if (amx_ready()) bits |= RG_BIT_AMX;
    return bits;
}

int64_t rg_sizeof_block_weight(void) { return (int64_t)sizeof(rg_block_weight); }
int64_t rg_sizeof_layer(void) { return (int64_t)sizeof(rg_layer); }
int64_t rg_sizeof_decode_step(void) { return (int64_t)sizeof(rg_decode_step); }

/* h [tokens, hidden] float32 is updated in place through all n_layers layers. Returns 0, or -1
 * when a kernel fails (sizes) or memory runs out. */
int decode_layers(const rg_layer *layers, int64_t n_layers, float *h, const rg_decode_step *step, int nthreads) {
    const int64_t T = step->tokens, hidden = step->hidden, H = step->heads, Hkv = step->kv_heads;
    const int kv = (int)step->kv_dtype;
    const int64_t D = step->head_dim, inter = step->inter;
    const int64_t C = kv == RG_KV_I8 ? 0 : step->n_shared;  /* int8 K/V: no shared-prefix kernel, whole sequences */
    const int64_t qd = H * D, qkv_n = (H + 2 * Hkv) * D;
    const size_t floats = (size_t)T * (size_t)(2 * hidden + qkv_n + 2 * qd + H + 3 * inter + hidden);
    float *work = (float *)rg_scratch(RG_SCRATCH_STEP, sizeof(float) * floats);
    if (work == NULL) return -1;
    float *x = work, *qkv = x + T * hidden, *q = qkv + T * qkv_n, *att = q + T * qd, *lse = att + T * qd;
    float *gu = lse + T * H, *act = gu + T * 2 * inter, *o = act + T * inter, *dn = o + T * hidden;
    int rc = 0;
    for (int64_t l = 0; l < n_layers && rc == 0; l++) {
        const rg_layer *layer = layers + l;
        const int local = layer->local && step->local_cos_t != NULL;
        const int windowed = layer->local && step->win_table != NULL; /* some token's keys reach past the window */
        add_rms_norm(h, NULL, layer->input_norm, T, hidden, step->eps, x, nthreads);
        if ((rc = block_gemm(&layer->qkv, x, T, hidden, qkv_n, qkv, nthreads)) != 0) break;
        rope_store(qkv, T, H, Hkv, D, local ? step->local_cos_t : step->cos_t, local ? step->local_sin_t : step->sin_t,
                   step->positions, step->loc, layer->k_buf, layer->v_buf, kv, layer->q_norm, layer->k_norm,
                   step->eps, nthreads);
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < qd; j++) q[t * qd + j] = qkv[t * qkv_n + j];
        if (windowed) {  /* each token over its window's slots, no shared prefix (it may have left the window) */
            rc = decode_attention(q, layer->k_buf, layer->v_buf, kv, step->win_table, step->win_stride,
                                  step->win_rows, step->win_seq_lens, 0, T, H, Hkv, D, step->scale, att, NULL,
                                  nthreads);
        } else {
            rc = decode_attention(q, layer->k_buf, layer->v_buf, kv, step->req_to_token, step->table_stride,
                                  step->rows, step->seq_lens, C, T, H, Hkv, D, step->scale, att, C > 0 ? lse : NULL,
                                  nthreads);
            if (rc == 0 && C > 0)
                rc = shared_prefix_attention(q, layer->k_buf, layer->v_buf, kv, step->shared, C, T, H, Hkv, D,
                                             step->scale, att, lse, nthreads);
        }
        if (rc != 0 || (rc = block_gemm(&layer->o, att, T, qd, hidden, o, nthreads)) != 0) break;
        if (layer->attn_out_norm != NULL) add_rms_norm(o, NULL, layer->attn_out_norm, T, hidden, step->eps, o, nthreads);
        add_rms_norm(h, o, layer->post_norm, T, hidden, step->eps, x, nthreads); /* h += o */
        if ((rc = block_gemm(&layer->gate_up, x, T, hidden, 2 * inter, gu, nthreads)) != 0) break;
        if (layer->gelu)
            gelu_mul(gu, T, inter, act, nthreads);
        else
            silu_mul(gu, T, inter, act, nthreads);
        if ((rc = block_gemm(&layer->down, act, T, inter, hidden, dn, nthreads)) != 0) break;
        if (layer->mlp_out_norm != NULL) add_rms_norm(dn, NULL, layer->mlp_out_norm, T, hidden, step->eps, dn, nthreads);
        for (int64_t i = 0; i < T * hidden; i++) h[i] += dn[i];
    }
    return rc;
}
