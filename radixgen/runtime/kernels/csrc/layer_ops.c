/* The per-token ops between a decoder layer's GEMMs, fused for the float32 CPU forward.
 *
 * In torch each is several ops (an RMSNorm alone is pow, mean, add, rsqrt, mul, mul), and at decode
 * batch sizes every op costs its dispatch, not its arithmetic: ~40 ops a layer against 4 GEMMs.
 * All math is float32, in the same formulas as the torch path.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "radixgen_kernels.h"
#include "simd_math.h"
#include "thread_pool.h"

#define PARALLEL_MIN 65536 /* elements below which one thread beats waking the team */

typedef struct {
    float *h;
    const float *delta, *w;
    int64_t n;
    float eps;
    float *out;
} norm_job;

/* x [n] += delta (when not NULL); returns the sum of x's squares, summed in vector lanes (one serial
 * chain of n adds takes ~4 cycles an element). */
static float add_sum_squares(float *x, const float *delta, int64_t n) {
    int64_t i = 0;
    float ss = 0.0f;
#ifdef RG_AVX512
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (delta != NULL) {
            v = _mm512_add_ps(v, _mm512_loadu_ps(delta + i));
            _mm512_storeu_ps(x + i, v);
        }
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    ss = _mm512_reduce_add_ps(acc);
#elif defined(RG_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (delta != NULL) {
            v = _mm256_add_ps(v, _mm256_loadu_ps(delta + i));
            _mm256_storeu_ps(x + i, v);
        }
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    ss = hsum(acc);
#elif defined(RG_NEON)
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        if (delta != NULL) {
            v = vaddq_f32(v, vld1q_f32(delta + i));
            vst1q_f32(x + i, v);
        }
        acc = vfmaq_f32(acc, v, v);
    }
    ss = vaddvq_f32(acc);
#endif
    for (; i < n; i++) {
        if (delta != NULL) x[i] += delta[i];
        ss += x[i] * x[i];
    }
    return ss;
}

static void norm_rows(void *job, int64_t begin, int64_t end, int tid) {
    const norm_job *j = (const norm_job *)job;
    const int64_t n = j->n;
    (void)tid;
    for (int64_t t = begin; t < end; t++) {
        float *x = j->h + t * n, *o = j->out + t * n;
        const float ss = add_sum_squares(x, j->delta == NULL ? NULL : j->delta + t * n, n);
        const float r = 1.0f / sqrtf(ss / (float)n + j->eps);
        for (int64_t i = 0; i < n; i++) o[i] = x[i] * r * j->w[i];
    }
}

/* h [T, n] += delta (when not NULL); out [T, n] = h * (1 / sqrt(mean(h^2) + eps)) * w. */
void add_rms_norm(float *h, const float *delta, const float *w, int64_t T, int64_t n, float eps, float *out,
                  int nthreads) {
    norm_job job = {h, delta, w, n, eps, out};
    rg_parallel(T * n >= PARALLEL_MIN ? nthreads : 1, T, RG_STATIC, norm_rows, &job);
}

typedef struct {
    const float *gu;
    int64_t inter;
    float *out;
} silu_job;

static void silu_rows(void *job, int64_t begin, int64_t end, int tid) {
    const silu_job *j = (const silu_job *)job;
    const float *gu = j->gu;
    const int64_t inter = j->inter;
    float *out = j->out;
    (void)tid;
    for (int64_t t = begin; t < end; t++) {
        const float *g = gu + t * 2 * inter, *u = g + inter;
        float *o = out + t * inter;
        int64_t i = 0;
#ifdef RG_AVX512
        for (; i + 16 <= inter; i += 16) {
            const __m512 x = _mm512_loadu_ps(g + i);
            const __m512 sig = _mm512_mul_ps(x, recip16(_mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), x)))));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(sig, _mm512_loadu_ps(u + i)));
        }
#endif
#ifdef RG_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (; i + 8 <= inter; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 sig = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
        }
#elif defined(RG_NEON)
        for (; i + 4 <= inter; i += 4) {
            const float32x4_t x = vld1q_f32(g + i);
            const float32x4_t sig = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(x))));
            vst1q_f32(o + i, vmulq_f32(sig, vld1q_f32(u + i)));
        }
#endif
        for (; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* gu [T, 2 * inter] = [gate | up] -> out [T, inter] = silu(gate) * up. */
void silu_mul(const float *gu, int64_t T, int64_t inter, float *out, int nthreads) {
    silu_job job = {gu, inter, out};
    rg_parallel(T * inter >= PARALLEL_MIN ? nthreads : 1, T, RG_STATIC, silu_rows, &job);
}

typedef struct {
    const float *gu;
    int64_t inter;
    float *out;
} gelu_job;

/* gelu_tanh(x) = x / 2 * (1 + tanh(y)), y = sqrt(2 / pi) * (x + 0.044715 x^3), computed as
 * x / (1 + e^(-2y)) (1 + tanh(y) = 2 sigmoid(2y)): no cancellation where tanh(y) is near -1. */
#define GELU_2C 1.5957691216057308f /* 2 sqrt(2 / pi) */
#define GELU_A 0.044715f

static void gelu_rows(void *job, int64_t begin, int64_t end, int tid) {
    const gelu_job *j = (const gelu_job *)job;
    const float *gu = j->gu;
    const int64_t inter = j->inter;
    float *out = j->out;
    (void)tid;
    for (int64_t t = begin; t < end; t++) {
        const float *g = gu + t * 2 * inter, *u = g + inter;
        float *o = out + t * inter;
        int64_t i = 0;
#ifdef RG_AVX512
        for (; i + 16 <= inter; i += 16) {
            const __m512 x = _mm512_loadu_ps(g + i);
            const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
            const __m512 y2 = _mm512_mul_ps(_mm512_set1_ps(GELU_2C), _mm512_fmadd_ps(_mm512_set1_ps(GELU_A), x3, x));
            const __m512 gl = _mm512_mul_ps(x, recip16(_mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), y2)))));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(gl, _mm512_loadu_ps(u + i)));
        }
#endif
#ifdef RG_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (; i + 8 <= inter; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
            const __m256 y2 = _mm256_mul_ps(_mm256_set1_ps(GELU_2C), _mm256_fmadd_ps(_mm256_set1_ps(GELU_A), x3, x));
            const __m256 gl = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, y2))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(gl, _mm256_loadu_ps(u + i)));
        }
#elif defined(RG_NEON)
        for (; i + 4 <= inter; i += 4) {
            const float32x4_t x = vld1q_f32(g + i);
            const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
            const float32x4_t y2 = vmulq_n_f32(vfmaq_n_f32(x, x3, GELU_A), GELU_2C);
            const float32x4_t gl = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(y2))));
            vst1q_f32(o + i, vmulq_f32(gl, vld1q_f32(u + i)));
        }
#endif
        for (; i < inter; i++) {
            const float x = g[i];
            o[i] = x / (1.0f + expf(-GELU_2C * (x + GELU_A * x * x * x))) * u[i];
        }
    }
}

/* gu [T, 2 * inter] = [gate | up] -> out [T, inter] = gelu_tanh(gate) * up (GeGLU). */
void gelu_mul(const float *gu, int64_t T, int64_t inter, float *out, int nthreads) {
    gelu_job job = {gu, inter, out};
    rg_parallel(T * inter >= PARALLEL_MIN ? nthreads : 1, T, RG_STATIC, gelu_rows, &job);
}

typedef struct {
    float *qkv;
    int64_t H, Hkv, D;
    const float *cos_t, *sin_t;
    const int64_t *positions, *loc;
    void *k_buf, *v_buf;
    int kv_dtype;
    const float *q_norm, *k_norm;
    float eps;
} rope_job;

/* x [D] = RMSNorm(x) * w in place. */
static void head_rms_norm(float *x, const float *w, int64_t D, float eps) {
    const float r = 1.0f / sqrtf(add_sum_squares(x, NULL, D) / (float)D + eps);
    for (int64_t i = 0; i < D; i++) x[i] = x[i] * r * w[i];
}

static void rope_rows(void *job, int64_t begin, int64_t end, int tid) {
    const rope_job *j = (const rope_job *)job;
    float *qkv = j->qkv;
    const int64_t H = j->H, Hkv = j->Hkv, D = j->D, row = (H + 2 * Hkv) * D, half = D / 2;
    const float *cos_t = j->cos_t, *sin_t = j->sin_t;
    const int64_t *positions = j->positions, *loc = j->loc;
    void *k_buf = j->k_buf, *v_buf = j->v_buf;
    const int kv_dtype = j->kv_dtype;
    (void)tid;
    for (int64_t t = begin; t < end; t++) {
        float *x = qkv + t * row;
        const float *c = cos_t + positions[t] * half, *s = sin_t + positions[t] * half;
        for (int64_t h = 0; h < H + Hkv; h++) {
            float *a = x + h * D, *b = a + half;
            const float *w = h < H ? j->q_norm : j->k_norm;
            if (w != NULL) head_rms_norm(a, w, D, j->eps);
            for (int64_t i = 0; i < half; i++) {
                const float x1 = a[i], x2 = b[i];
                a[i] = x1 * c[i] - x2 * s[i];
                b[i] = x2 * c[i] + x1 * s[i];
            }
        }
        const int64_t hs = rg_kv_head_stride(kv_dtype, D);
        for (int64_t h = 0; h < Hkv; h++) {
            rg_kv_store_head(k_buf, (loc[t] * Hkv + h) * hs, x + (H + h) * D, D, kv_dtype);
            rg_kv_store_head(v_buf, (loc[t] * Hkv + h) * hs, x + (H + Hkv + h) * D, D, kv_dtype);
        }
    }
}

/* qkv [T, (H + 2 Hkv) D]: each q and k head RMSNorm-ed (q_norm / k_norm [D], NULL: not) and rotated in
 * place (rotate-half layout; cos/sin tables [P, D/2] read at positions[t]), then each token's k and v
 * heads copied to k_buf / v_buf [N, Hkv, D] at slot loc[t], converted to the KV type kv_dtype
 * (RG_KV_*, rounding to nearest even; int8 rows [N, Hkv, D + 4] quantized per head). */
void rope_store(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const float *cos_t, const float *sin_t,
                const int64_t *positions, const int64_t *loc, void *k_buf, void *v_buf, int kv_dtype,
                const float *q_norm, const float *k_norm, float eps, int nthreads) {
    rope_job job = {qkv, H, Hkv, D, cos_t, sin_t, positions, loc, k_buf, v_buf, kv_dtype, q_norm, k_norm, eps};
    rg_parallel(T * (H + 2 * Hkv) * D >= PARALLEL_MIN ? nthreads : 1, T, RG_STATIC, rope_rows, &job);
}
