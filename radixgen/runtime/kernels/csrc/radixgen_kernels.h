/* The boundary between the C kernels and Python: every exported function and every struct that
 * crosses it, declared once, here. Each .c file includes this header, so the compiler checks each
 * definition against its declaration; kernels/ffi.py reads this file to bind every function with
 * ctypes (no hand-written argument lists) and checks its ctypes mirrors of the structs against the
 * declarations below and against sizeof() in the built library.
 *
 * Style (ffi.py parses it): one declaration per statement, return types int, void or int64_t,
 * parameters of types int, int64_t, float or pointers; structs as `typedef struct {...} name;`.
 *
 * Building with -DRADIXGEN_SCALAR gives the scalar reference of every kernel (no SIMD intrinsics),
 * which the tests diff against the native build.
 */
#ifndef RADIXGEN_KERNELS_H
#define RADIXGEN_KERNELS_H
#include <stdint.h>

/* A [n, k] weight in 32-weight blocks (GGUF's, or a GGUF type converted to one exactly), repacked in
 * panels of 16 rows (block_gemm.c). W = scale * q + min per block (per half block with RG_HALF_BLOCKS). */
typedef struct {
    int64_t bits;       /* 4: q 0..15 (Q4_0, Q4_1, Q4_K); 6: Q6_K; 8: a byte a q (Q8_0, Q5_0 signed; others unsigned) */
    int64_t flags;      /* RG_SCALES_F32 | RG_UNSIGNED8 | RG_HALF_BLOCKS | RG_SUPER_BLOCKS (block_format.h) */
    const void *qs;     /* packed integers */
    const void *scale;  /* [panels, k / 32, halves, 16] fp16, float32 (RG_SCALES_F32) or K-quant integers */
    const void *minv;   /* like scale; NULL where there is no min to store */
    const void *sup;    /* K-quants: fp16 factors [panels, k / 256, 1 or 2, 16]; else NULL */
} rg_block_weight;

/* One decoder layer of the one-call decode step (decode_layers.c). The optional parts (NULL / 0:
 * absent) are Qwen3's and Gemma's: per-head q/k RMSNorm, norms on the attention's and the MLP's outputs
 * before each residual add, GeGLU, and a sliding window with its own rotary table. */
typedef struct {
    const float *input_norm;    /* [hidden] */
    const float *post_norm;     /* [hidden] the norm before the MLP */
    void *k_buf;                /* [N, Hkv, D] in the step's kv_dtype */
    void *v_buf;                /* [N, Hkv, D] in the step's kv_dtype */
    rg_block_weight qkv;        /* [(H + 2 Hkv) D, hidden] */
    rg_block_weight o;          /* [hidden, H D] */
    rg_block_weight gate_up;    /* [2 inter, hidden] */
    rg_block_weight down;       /* [hidden, inter] */
    const float *q_norm;        /* [D] or NULL */
    const float *k_norm;        /* [D] or NULL */
    const float *attn_out_norm; /* [hidden] or NULL */
    const float *mlp_out_norm;  /* [hidden] or NULL */
    int64_t gelu;               /* 1: gelu_tanh(gate) * up; 0: silu(gate) * up */
    int64_t local;              /* 1: a sliding-window layer (the step's window table and local rotary) */
} rg_layer;

/* A decode step's sizes and per-token inputs (decode_layers.c). Token t decodes request rows[t] at
 * positions[t]; its K/V go to slot loc[t]; it attends to seq_lens[t] keys read through req_to_token
 * [*, table_stride]; the first n_shared keys of every request are the slots `shared` (0: none).
 * K/V buffers hold kv_dtype elements: 0 float32, 1 bfloat16, 2 float16, or 3 int8 rows (per token and
 * KV head D int8 values and a float32 scale: D + 4 bytes); the kv_dtype arguments below too. */
typedef struct {
    int64_t tokens;
    int64_t hidden;
    int64_t heads;
    int64_t kv_heads;
    int64_t head_dim;
    int64_t inter;
    float eps;
    float scale;
    const float *cos_t;  /* [P, D / 2] */
    const float *sin_t;  /* [P, D / 2] */
    const int64_t *positions;
    const int64_t *loc;
    const int64_t *req_to_token;
    int64_t table_stride;
    const int64_t *rows;
    const int64_t *seq_lens;
    const int64_t *shared;
    int64_t n_shared;
    int64_t kv_dtype;
    const float *local_cos_t;     /* [P, D / 2] sliding-window layers' rotary (NULL: cos_t / sin_t) */
    const float *local_sin_t;
    const int64_t *win_table;     /* [tokens, win_stride] each token's keys in the window (NULL: all
                                     tokens' keys are within it: local layers read as global ones) */
    int64_t win_stride;
    const int64_t *win_rows;      /* [tokens] 0 .. tokens - 1 */
    const int64_t *win_seq_lens;  /* [tokens] keys in the window */
} rg_decode_step;

/* The SIMD paths this build runs, a bit set (simd_math.h): 0 scalar (no SIMD, or -DRADIXGEN_SCALAR),
 * 1 AVX2 + FMA, 2 AVX-VNNI, 4 AVX-512 with VNNI, 8 AMX (int8 tiles). */
int rg_simd_level(void);

/* sizeof of the structs above, for ffi.py's check of its mirrors. */
int64_t rg_sizeof_block_weight(void);
int64_t rg_sizeof_layer(void);
int64_t rg_sizeof_decode_step(void);

/* y [M, n] = x [M, k] @ W^T for W in blocks (block_gemm.c; from block_gemm_amx_rows() rows on, on AMX
 * tiles: amx_gemm.c), with the activations in 3 int8 limbs (float32's precision), or in `limbs` (1..3:
 * block_gemm_limbs). 0, or -1 (k not a multiple of 32, limbs out of range, memory). */
int block_gemm(const rg_block_weight *w, const float *x, int64_t M, int64_t k, int64_t n, float *y, int nthreads);
int block_gemm_limbs(const rg_block_weight *w, const float *x, int64_t M, int64_t k, int64_t n, float *y, int limbs,
                     int nthreads);

/* out [n_rows, k] = rows `rows` of W [n, k] as float32 (out_dtype 0) or bfloat16 (1), each value scale * q +
 * min as the reference dequantization computes it (block_dequant.c). 0, -1 (bad format or k) or -2 (a row
 * outside [0, n)). */
int block_dequant_rows(const rg_block_weight *w, int64_t n, int64_t k, const int64_t *rows, int64_t n_rows, void *out,
                       int out_dtype, int nthreads);

/* y [M, n] = x [M, k] @ W^T with x and W each rounded to bfloat16 (W's values as block_dequant_rows rounds
 * them) and float32 sums, on AMX bfloat16 tiles (amx_bf16_wide.c): the wide steps' bfloat16 GEMM. 0, or -1
 * (no AMX, a bad format or k, memory). block_gemm_bf16_available: 1 where it runs. */
int block_gemm_bf16(const rg_block_weight *w, const float *x, int64_t M, int64_t k, int64_t n, float *y, int nthreads);
int block_gemm_bf16_available(void);

/* The row count from which block_gemm runs on AMX tiles; 0 when it never does (no AMX, or refused). */
int64_t block_gemm_amx_rows(void);

/* Decode attention over each request's keys start .. seq_lens[b] (decode_attention.c). */
int decode_attention(const float *q, const void *k_buf, const void *v_buf, int kv_dtype, const int64_t *req_to_token,
                     int64_t table_stride, const int64_t *rows, const int64_t *seq_lens, int64_t start, int64_t B,
                     int64_t H, int64_t Hkv, int64_t D, float scale, float *out, float *lse, int nthreads);

/* The shared-prefix part of cascade decode attention, merged into out / lse_own (decode_attention.c). */
int shared_prefix_attention(const float *q, const void *k_buf, const void *v_buf, int kv_dtype, const int64_t *shared,
                            int64_t C, int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale, float *out,
                            const float *lse_own, int nthreads);

/* Prompt attention in bfloat16 for B requests (extend_attention.c): q, out float [T, H, D], the
 * requests' new rows in order (q's rows q_stride floats apart, e.g. the q part of fused qkv rows); request b's keys are slots req_to_token[rows[b] * table_stride + 0 ..
 * prefix_lens[b] + extend_lens[b]), its new keys already stored; window > 0: each query sees only the
 * `window` latest keys up to itself. 0, or -1 (no AVX512-BF16 in this build, int8 K/V, bad sizes,
 * memory). */
int extend_attention_bf16(const float *q, int64_t q_stride, const void *k_buf, const void *v_buf, int kv_dtype,
                          const int64_t *req_to_token, int64_t table_stride, const int64_t *rows,
                          const int64_t *prefix_lens, const int64_t *extend_lens, int64_t B, int64_t H, int64_t Hkv,
                          int64_t D, int64_t window, float scale, float *out, int nthreads);

/* 1 when this build has extend_attention_bf16 (AVX512-BF16), else 0 (extend_attention.c). */
int extend_attention_bf16_available(void);

/* h [T, n] += delta (if not NULL); out = RMSNorm(h) * w (layer_ops.c). */
void add_rms_norm(float *h, const float *delta, const float *w, int64_t T, int64_t n, float eps, float *out,
                  int nthreads);

/* out [T, inter] = silu(gate) * up for gu [T, 2 inter] = [gate | up] (layer_ops.c). */
void silu_mul(const float *gu, int64_t T, int64_t inter, float *out, int nthreads);

/* out [T, inter] = gelu_tanh(gate) * up for gu [T, 2 inter] = [gate | up] (layer_ops.c). */
void gelu_mul(const float *gu, int64_t T, int64_t inter, float *out, int nthreads);

/* Per-head RMSNorm of qkv's q and k heads (q_norm / k_norm [D], NULL: none; eps), their rotary embedding
 * in place, then K/V stored at slots loc in kv_dtype (layer_ops.c). */
void rope_store(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const float *cos_t, const float *sin_t,
                const int64_t *positions, const int64_t *loc, void *k_buf, void *v_buf, int kv_dtype,
                const float *q_norm, const float *k_norm, float eps, int nthreads);

/* out[b] = the first position of row b's largest value, for x [B, V] float32 (argmax.c). 0, or -1 (bad
 * sizes, memory). */
int argmax_rows(const float *x, int64_t B, int64_t V, int64_t *out, int nthreads);

/* In place: logits [B, V] = -inf where bit t % 32 of bitmask[b * W + t / 32] is 0, W >= ceil(V / 32)
 * (bitmask.c). 0, or -1 (bad sizes). */
int apply_bitmask(float *logits, const int32_t *bitmask, int64_t B, int64_t V, int64_t W, int nthreads);

/* out[b] = the token drawn from row b of logits [B, V] (processed) at temperature 1 / inv_temp[b], cut to
 * its top_k[b] (>= V: none), top_p[b] (1: none) and min_p (log_min_p[b]; -inf: none), by the uniform
 * u[b] (sample_draw.c). 0, or -1 (bad sizes, memory). */
int sample_draw(const float *logits, int64_t B, int64_t V, const float *inv_temp, const int64_t *top_k,
                const float *top_p, const float *log_min_p, const float *u, int64_t *out, int nthreads);

/* Every layer of a pure-decode step: h [tokens, hidden] updated in place (decode_layers.c). */
int decode_layers(const rg_layer *layers, int64_t n_layers, float *h, const rg_decode_step *step, int nthreads);

#endif
