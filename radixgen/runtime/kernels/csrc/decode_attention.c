/* Decode attention on CPU: each request's one new query token attends to all of its tokens' K/V,
 * read in place by KV slot through its req_to_token row (no gathered K/V copy, no padding).
 *
 * Work items (chunks of a request's keys for all its heads; see decode_attention) run on the
 * kernels' threads (thread_pool.c). K/V are float32, bfloat16 or float16 (widened to float32); q and
 * the output are float32. A request's keys all starting with a shared prefix are attended in two
 * parts (shared_prefix_attention: the prefix for every request's queries at once).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "radixgen_kernels.h"
#include "scratch.h"
#include "simd_math.h"
#include "thread_pool.h"

#define PREFETCH_AHEAD 16  /* keys ahead (the next block): slots may be scattered, where the hardware prefetcher cannot follow */

/* Prefetch the `bytes` of one key's head row starting at element `base`. */
static inline void prefetch_row(const void *buf, int64_t base, int64_t bytes, int kv) {
    const char *p = (const char *)buf + base * rg_kv_bytes(kv);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

/* prefetch_row into L2 only: the V rows of keys whose scores are being computed, read by the values
 * pass once the chunk's softmax is done (so V streams in beside K, not after it: ~15% faster at 8k keys). */
static inline void prefetch_row_l2(const void *buf, int64_t base, int64_t bytes, int kv) {
    const char *p = (const char *)buf + base * rg_kv_bytes(kv);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}

static inline float load1(const void *p, int64_t i, int kv) { return rg_kv_load(p, i, kv); }

#ifdef RG_AVX2
static inline __m256 load8(const void *p, int64_t i, int kv) {
    if (kv == RG_KV_F32) return _mm256_loadu_ps((const float *)p + i);
    if (kv == RG_KV_I8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)p + i))));
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (kv == RG_KV_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

#endif

#ifdef RG_NEON
/* Elements i .. i + 4 of a K/V buffer of dtype kv as floats (int8: unscaled, see rg_kv_row_scale). */
static inline float32x4_t load4(const void *p, int64_t i, int kv) {
    if (kv == RG_KV_F32) return vld1q_f32((const float *)p + i);
    if (kv == RG_KV_I8) {
        int32_t w;
        memcpy(&w, (const int8_t *)p + i, 4);
        return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w))))));
    }
    const uint16x4_t h = vld1_u16((const uint16_t *)p + i);
    if (kv == RG_KV_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}
#endif

/* max of p[0..n), n >= 1 (vectorized: a scalar max is a 4-cycle dependency chain per key). */
static float max_of(const float *p, int64_t n) {
    int64_t s = 0;
    float max = p[0];
#if defined(RG_AVX512)
    if (n >= 16) {
        __m512 m = _mm512_loadu_ps(p);
        for (s = 16; s + 16 <= n; s += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(p + s));
        max = _mm512_reduce_max_ps(m);
    }
#elif defined(RG_AVX2)
    if (n >= 8) {
        __m256 m = _mm256_loadu_ps(p);
        for (s = 8; s + 8 <= n; s += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(p + s));
        max = hmax(m);
    }
#elif defined(RG_NEON)
    if (n >= 4) {
        float32x4_t m = vld1q_f32(p);
        for (s = 4; s + 4 <= n; s += 4) m = vmaxq_f32(m, vld1q_f32(p + s));
        max = vmaxvq_f32(m);
    }
#endif
    for (; s < n; s++) max = p[s] > max ? p[s] : max;
    return max;
}

/* p[0..n) = exp(p - max), returns their sum. */
static float exp_sum(float *p, int64_t n, float max) {
    int64_t s = 0;
    float sum = 0.0f;
#if defined(RG_AVX512)
    __m512 acc = _mm512_setzero_ps();
    const __m512 m = _mm512_set1_ps(max);
    for (; s + 16 <= n; s += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p + s), m));
        _mm512_storeu_ps(p + s, e);
        acc = _mm512_add_ps(acc, e);
    }
    sum = _mm512_reduce_add_ps(acc);
#elif defined(RG_AVX2)
    __m256 acc = _mm256_setzero_ps();
    const __m256 m = _mm256_set1_ps(max);
    for (; s + 8 <= n; s += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + s), m));
        _mm256_storeu_ps(p + s, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum(acc);
#elif defined(RG_NEON)
    float32x4_t acc = vdupq_n_f32(0.0f);
    const float32x4_t m = vdupq_n_f32(max);
    for (; s + 4 <= n; s += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(p + s), m));
        vst1q_f32(p + s, e);
        acc = vaddq_f32(acc, e);
    }
    sum = vaddvq_f32(acc);
#endif
    for (; s < n; s++) {
        p[s] = expf(p[s] - max);
        sum += p[s];
    }
    return sum;
}

#define GMAX 4  /* query heads handled together (their accumulators stay in registers) */

/* Heads from h to the end of KV head hkv's group of G, at most GMAX (one heads_pass). */
static inline int heads_at(int64_t h, int64_t hkv, int64_t G) {
    const int64_t left = (hkv + 1) * G - h;
    return (int)(left < GMAX ? left : GMAX);
}

#ifdef RG_AVX512
/* part[g * 16] = per-lane products of q_g and the key's head row at element base, for N <= GMAX heads
 * (summed horizontally 16 keys at a time by scores16_rows). */
static inline __attribute__((always_inline)) void key_dots(const int N, const float *q, const void *k_buf, int64_t base,
                                                           int64_t D, int kv, __m512 *part) {
    __m512 a[GMAX];
    const __m512 k0 = rg_kv_load16(k_buf, base, kv);
    for (int g = 0; g < N; g++) a[g] = _mm512_mul_ps(_mm512_loadu_ps(q + g * D), k0);
    for (int64_t d = 16; d < D; d += 16) {
        const __m512 k = rg_kv_load16(k_buf, base + d, kv);
        for (int g = 0; g < N; g++) a[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + d), k, a[g]);
    }
    if (kv == RG_KV_I8) {  /* the key's scale */
        const __m512 ks = _mm512_set1_ps(rg_kv_row_scale(k_buf, base, D, kv));
        for (int g = 0; g < N; g++) a[g] = _mm512_mul_ps(a[g], ks);
    }
    for (int g = 0; g < N; g++) part[g * 16] = a[g];
}

/* part[g * 16 + j] = per-lane products of q_g (NH heads, held in registers) and the head row at element
 * off of each of the m <= 16 keys at slots, for D = 16 DV (DV even): even and odd vectors sum apart, two
 * short dependency chains per head. The first pf_count keys each prefetch one of the rows pf_rows (K
 * and V, whole rows into L2), so the next block streams in evenly, in address order, over the passes. */
static inline __attribute__((always_inline)) void slice_dots(const int NH, const int DV, const float *q,
                                                             const void *k_buf, const void *v_buf,
                                                             const int64_t *slots, int64_t m, const int64_t *pf_rows,
                                                             int64_t pf_count, int64_t off, int64_t row_elems,
                                                             int kv, __m512 *part) {
    __m512 qv[4][8];
    for (int g = 0; g < NH; g++)
        for (int i = 0; i < DV; i++) qv[g][i] = _mm512_loadu_ps(q + g * 16 * DV + 16 * i);
    for (int64_t j = 0; j < m; j++) {
        if (j < pf_count) {
            const int64_t row_bytes = row_elems * rg_kv_bytes(kv);
            prefetch_row_l2(k_buf, pf_rows[j] * row_elems, row_bytes, kv);
            prefetch_row_l2(v_buf, pf_rows[j] * row_elems, row_bytes, kv);
        }
        const int64_t base = slots[j] * row_elems + off;
        __m512 e[4], o[4];
        const __m512 k0 = rg_kv_load16(k_buf, base, kv), k1 = rg_kv_load16(k_buf, base + 16, kv);
        for (int g = 0; g < NH; g++) {
            e[g] = _mm512_mul_ps(qv[g][0], k0);
            o[g] = _mm512_mul_ps(qv[g][1], k1);
        }
        for (int i = 2; i < DV; i += 2) {
            const __m512 ke = rg_kv_load16(k_buf, base + 16 * i, kv);
            const __m512 ko = rg_kv_load16(k_buf, base + 16 * i + 16, kv);
            for (int g = 0; g < NH; g++) {
                e[g] = _mm512_fmadd_ps(qv[g][i], ke, e[g]);
                o[g] = _mm512_fmadd_ps(qv[g][i + 1], ko, o[g]);
            }
        }
        const __m512 ks = _mm512_set1_ps(rg_kv_row_scale(k_buf, base, 16 * DV, kv));
        for (int g = 0; g < NH; g++) {
            const __m512 a = _mm512_add_ps(e[g], o[g]);
            part[g * 16 + j] = kv == RG_KV_I8 ? _mm512_mul_ps(a, ks) : a;
        }
    }
}

/* part[h * 16 + j] for all H heads and the m <= 16 keys at slots, D = 16 DV (DV = 4 or 8): a KV head's
 * slice of the m keys at a time, up to 12 vectors of its query heads in registers (~15% faster than
 * key_parts from cache). The next block's rows (keys 16 .. 32 from slots, up to `avail`) stream into L2
 * spread over the passes, whole rows in address order (from DRAM, prefetching only each pass's slice
 * is ~15% slower at 8k keys). */
static inline __attribute__((always_inline)) void slice_parts(const int DV, const float *q, const void *k_buf,
                                                              const void *v_buf, const int64_t *slots, int64_t m,
                                                              int64_t avail, int64_t H, int64_t Hkv,
                                                              int64_t row_elems, int kv, __m512 *part) {
    const int64_t D = 16 * DV, G = H / Hkv, hs = rg_kv_head_stride(kv, D), hb = DV == 4 ? 3 : 2;
    const int64_t left_ahead = avail - PREFETCH_AHEAD, ahead = left_ahead < 0 ? 0 : left_ahead < 16 ? left_ahead : 16;
    const int64_t per_hkv = (G + hb - 1) / hb, passes = Hkv * per_hkv;
    for (int64_t hkv = 0; hkv < Hkv; hkv++)
        for (int64_t h = hkv * G; h < (hkv + 1) * G; h += hb) {
            const int64_t pass = hkv * per_hkv + (h - hkv * G) / hb;
            const int64_t p0 = ahead * pass / passes, npf = ahead * (pass + 1) / passes - p0;
            const int64_t *pf = slots + PREFETCH_AHEAD + p0, left = (hkv + 1) * G - h;
            const float *qh = q + h * D;
            __m512 *ph = part + h * 16;
#define SLICE(NH) slice_dots(NH, DV, qh, k_buf, v_buf, slots, m, pf, npf, hkv * hs, row_elems, kv, ph)
            if (left >= 3 && hb >= 3) SLICE(3);
            else if (left >= 2) SLICE(2);
            else SLICE(1);
#undef SLICE
        }
}

/* slice_parts for any D % 16 == 0: key by key, every KV head of a key (its whole row) before the next
 * key, so the reads are in address order. Keys up to `avail` from slots are prefetched ahead (their V
 * rows into L2). */
static inline __attribute__((always_inline)) void key_parts(const float *q, const void *k_buf, const void *v_buf,
                                                            const int64_t *slots, int64_t m, int64_t avail, int64_t H,
                                                            int64_t Hkv, int64_t D, int64_t row_elems, int kv,
                                                            __m512 *part) {
    const int64_t G = H / Hkv, hs = rg_kv_head_stride(kv, D), row_bytes = row_elems * rg_kv_bytes(kv);
    for (int64_t j = 0; j < m; j++) {
        const int64_t base = slots[j] * row_elems;
        if (j + PREFETCH_AHEAD < avail) {
            prefetch_row(k_buf, slots[j + PREFETCH_AHEAD] * row_elems, row_bytes, kv);
            prefetch_row_l2(v_buf, slots[j + PREFETCH_AHEAD] * row_elems, row_bytes, kv);
        }
        for (int64_t hkv = 0; hkv < Hkv; hkv++)
            for (int64_t h = hkv * G; h < (hkv + 1) * G; h += GMAX) {
                const float *qh = q + h * D;
                __m512 *ph = part + h * 16 + j;
                switch (heads_at(h, hkv, G)) {
                    case 1: key_dots(1, qh, k_buf, base + hkv * hs, D, kv, ph); break;
                    case 2: key_dots(2, qh, k_buf, base + hkv * hs, D, kv, ph); break;
                    case 3: key_dots(3, qh, k_buf, base + hkv * hs, D, kv, ph); break;
                    default: key_dots(4, qh, k_buf, base + hkv * hs, D, kv, ph);
                }
            }
    }
}

/* scores[h * stride + s] = scale * dot(q_h, k_s) for all H heads and the m <= 16 keys at slots, for
 * D % 16 == 0, from per-lane partial products (part: [H, 16] vectors of scratch) summed 16 keys at a
 * time. */
static inline __attribute__((always_inline)) void scores16_rows(const float *q, const void *k_buf,
                                                                const void *v_buf, const int64_t *slots, int64_t m,
                                                                int64_t avail, int64_t H, int64_t Hkv, int64_t D,
                                                                int64_t row_elems, float scale, int kv, float *scores,
                                                                int64_t stride, __m512 *part) {
    if (D == 64 || D == 128) slice_parts((int)(D / 16), q, k_buf, v_buf, slots, m, avail, H, Hkv, row_elems, kv, part);
    else key_parts(q, k_buf, v_buf, slots, m, avail, H, Hkv, D, row_elems, kv, part);
    for (int64_t h = 0; h < H; h++)  /* a partial last block: zero lanes, not stored */
        for (int64_t j = m; j < 16; j++) part[h * 16 + j] = _mm512_setzero_ps();
    const __mmask16 keep = (__mmask16)((1u << m) - 1u);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t h = 0; h < H; h++)
        _mm512_mask_storeu_ps(scores + h * stride, keep, _mm512_mul_ps(sc, sum16x16(part + h * 16)));
}

/* NV vectors of dims (d0 .. d0 + 16 NV) x G heads of out[g] += sum_s probs[g, s] * v_s, accumulators in
 * registers. */
static inline __attribute__((always_inline)) void values16_dims(const int G, const int NV, const float *probs,
                                                                int64_t stride, const void *v_buf,
                                                                const int64_t *slots, int64_t S, int64_t avail,
                                                                int64_t hkv, int64_t D, int64_t d0, int64_t row_elems,
                                                                int kv, float *out) {
    const int64_t hs = rg_kv_head_stride(kv, D), bytes = hs * rg_kv_bytes(kv);
    __m512 a[GMAX][4];
    for (int g = 0; g < G; g++)
        for (int i = 0; i < NV; i++) a[g][i] = _mm512_loadu_ps(out + g * D + d0 + 16 * i);
    for (int64_t s = 0; s < S; s++) {
        const int64_t base = slots[s] * row_elems + hkv * hs + d0;
        if (d0 == 0 && s + PREFETCH_AHEAD < avail)
            prefetch_row(v_buf, slots[s + PREFETCH_AHEAD] * row_elems + hkv * hs, bytes, kv);
        __m512 v[4];
        for (int i = 0; i < NV; i++) v[i] = rg_kv_load16(v_buf, base + 16 * i, kv);
        const float vs = rg_kv_row_scale(v_buf, base - d0, D, kv);
        for (int g = 0; g < G; g++) {
            const __m512 p = _mm512_set1_ps(probs[g * stride + s] * vs);
            for (int i = 0; i < NV; i++) a[g][i] = _mm512_fmadd_ps(p, v[i], a[g][i]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(out + g * D + d0 + 16 * i, a[g][i]);
}

/* values_g for D % 16 == 0 on 16-float vectors: 64 dims at a time, then the rest. */
static inline __attribute__((always_inline)) void values16_g(const int G, const float *probs, int64_t stride,
                                                             const void *v_buf, const int64_t *slots, int64_t S,
                                                             int64_t avail, int64_t hkv, int64_t D, int64_t row_elems,
                                                             int kv, float *out) {
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64)
        values16_dims(G, 4, probs, stride, v_buf, slots, S, avail, hkv, D, d0, row_elems, kv, out);
    for (; d0 < D; d0 += 16) values16_dims(G, 1, probs, stride, v_buf, slots, S, avail, hkv, D, d0, row_elems, kv, out);
}
#endif

/* scores[g * stride + s] = scale * dot(q_g, k_s) for g < G heads of one group and the S keys at slots;
 * each K row is read once. Keys up to `avail` from slots are prefetched ahead (their V rows into L2). */
static inline __attribute__((always_inline)) void scores_g(const int G, const float *q, const void *k_buf,
                                                           const void *v_buf, const int64_t *slots, int64_t S,
                                                           int64_t avail, int64_t hkv,
                                                           int64_t D, int64_t row_elems, float scale, int kv,
                                                           float *scores, int64_t stride) {
    const int64_t hs = rg_kv_head_stride(kv, D), bytes = hs * rg_kv_bytes(kv);
    for (int64_t s = 0; s < S; s++) {
        const int64_t base = slots[s] * row_elems + hkv * hs;
        const float ks = scale * rg_kv_row_scale(k_buf, base, D, kv);
        if (s + PREFETCH_AHEAD < avail) {
            prefetch_row(k_buf, slots[s + PREFETCH_AHEAD] * row_elems + hkv * hs, bytes, kv);
            prefetch_row_l2(v_buf, slots[s + PREFETCH_AHEAD] * row_elems + hkv * hs, bytes, kv);
        }
#ifdef RG_AVX2
        if (D % 8 == 0) {
            __m256 a[GMAX];
            for (int g = 0; g < G; g++) a[g] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 k = load8(k_buf, base + d, kv);
                for (int g = 0; g < G; g++) a[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * D + d), k, a[g]);
            }
            for (int g = 0; g < G; g++) scores[g * stride + s] = ks * hsum(a[g]);
            continue;
        }
#elif defined(RG_NEON)
        if (D % 4 == 0) {
            float32x4_t a[GMAX];
            for (int g = 0; g < G; g++) a[g] = vdupq_n_f32(0.0f);
            for (int64_t d = 0; d < D; d += 4) {
                const float32x4_t k = load4(k_buf, base + d, kv);
                for (int g = 0; g < G; g++) a[g] = vfmaq_f32(a[g], vld1q_f32(q + g * D + d), k);
            }
            for (int g = 0; g < G; g++) scores[g * stride + s] = ks * vaddvq_f32(a[g]);
            continue;
        }
#endif
        for (int g = 0; g < G; g++) {
            float a = 0.0f;
            for (int64_t d = 0; d < D; d++) a += q[g * D + d] * load1(k_buf, base + d, kv);
            scores[g * stride + s] = ks * a;
        }
    }
}

/* out[g] += sum_s probs[g * stride + s] * v_s for g < G heads of one group and the S keys at slots. */
static inline __attribute__((always_inline)) void values_g(const int G, const float *probs, int64_t stride,
                                                           const void *v_buf, const int64_t *slots, int64_t S,
                                                           int64_t avail, int64_t hkv, int64_t D, int64_t row_elems,
                                                           int kv, float *out) {
    const int64_t hs = rg_kv_head_stride(kv, D), bytes = hs * rg_kv_bytes(kv);
#ifdef RG_AVX2
    if (D % 16 == 0) {
        for (int64_t d0 = 0; d0 < D; d0 += 16) {  /* 16 dims x G heads of accumulators in registers */
            __m256 a[GMAX][2];
            for (int g = 0; g < G; g++) {
                a[g][0] = _mm256_loadu_ps(out + g * D + d0);
                a[g][1] = _mm256_loadu_ps(out + g * D + d0 + 8);
            }
            for (int64_t s = 0; s < S; s++) {
                const int64_t base = slots[s] * row_elems + hkv * hs + d0;
                if (d0 == 0 && s + PREFETCH_AHEAD < avail)
                    prefetch_row(v_buf, slots[s + PREFETCH_AHEAD] * row_elems + hkv * hs, bytes, kv);
                const __m256 v0 = load8(v_buf, base, kv), v1 = load8(v_buf, base + 8, kv);
                const float vs = rg_kv_row_scale(v_buf, base - d0, D, kv);
                for (int g = 0; g < G; g++) {
                    const __m256 p = _mm256_set1_ps(probs[g * stride + s] * vs);
                    a[g][0] = _mm256_fmadd_ps(p, v0, a[g][0]);
                    a[g][1] = _mm256_fmadd_ps(p, v1, a[g][1]);
                }
            }
            for (int g = 0; g < G; g++) {
                _mm256_storeu_ps(out + g * D + d0, a[g][0]);
                _mm256_storeu_ps(out + g * D + d0 + 8, a[g][1]);
            }
        }
        return;
    }
#elif defined(RG_NEON)
    if (D % 16 == 0) {
        for (int64_t d0 = 0; d0 < D; d0 += 16) {  /* 16 dims x G heads of accumulators in registers */
            float32x4_t a[GMAX][4];
            for (int g = 0; g < G; g++)
                for (int i = 0; i < 4; i++) a[g][i] = vld1q_f32(out + g * D + d0 + 4 * i);
            for (int64_t s = 0; s < S; s++) {
                const int64_t base = slots[s] * row_elems + hkv * hs + d0;
                if (d0 == 0 && s + PREFETCH_AHEAD < avail)
                    prefetch_row(v_buf, slots[s + PREFETCH_AHEAD] * row_elems + hkv * hs, bytes, kv);
                float32x4_t v[4];
                for (int i = 0; i < 4; i++) v[i] = load4(v_buf, base + 4 * i, kv);
                const float vs = rg_kv_row_scale(v_buf, base - d0, D, kv);
                for (int g = 0; g < G; g++) {
                    const float p = probs[g * stride + s] * vs;
                    for (int i = 0; i < 4; i++) a[g][i] = vfmaq_n_f32(a[g][i], v[i], p);
                }
            }
            for (int g = 0; g < G; g++)
                for (int i = 0; i < 4; i++) vst1q_f32(out + g * D + d0 + 4 * i, a[g][i]);
        }
        return;
    }
#endif
    for (int64_t s = 0; s < S; s++) {
        const int64_t base = slots[s] * row_elems + hkv * hs;
        if (s + PREFETCH_AHEAD < avail) prefetch_row(v_buf, slots[s + PREFETCH_AHEAD] * row_elems + hkv * hs, bytes, kv);
        const float vs = rg_kv_row_scale(v_buf, base, D, kv);
        for (int64_t d = 0; d < D; d++) {
            const float v = load1(v_buf, base + d, kv);
            for (int g = 0; g < G; g++) out[g * D + d] += probs[g * stride + s] * vs * v;
        }
    }
}

/* Scores (pass 1: K into out[g * stride + s], V prefetched) or values (pass 2: V added to out[g * D + d],
 * probs[g * stride + s]) of heads g0 .. g0 + n (n <= GMAX) and S keys at slots, with a compile-time head count. */
static inline __attribute__((always_inline)) void heads_pass(int pass, int n, const float *q_or_probs,
                                                              const void *k_buf, const void *v_buf,
                                                              const int64_t *slots, int64_t S, int64_t avail,
                                                              int64_t hkv, int64_t D, int64_t row_elems, float scale,
                                                              int kv, float *out, int64_t stride) {
#ifdef RG_AVX512
#define WIDE_CASE(N)                                                                                           \
    if (D % 16 == 0 && pass == 2) {  /* pass 1 at D % 16 == 0: scores16_rows */                               \
        values16_g(N, q_or_probs, stride, v_buf, slots, S, avail, hkv, D, row_elems, kv, out);                 \
        return;                                                                                                \
    }
#else
#define WIDE_CASE(N)
#endif
#define HEADS_CASE(N)                                                                                          \
    case N:                                                                                                    \
        WIDE_CASE(N)                                                                                           \
        if (pass == 1)                                                                                         \
            scores_g(N, q_or_probs, k_buf, v_buf, slots, S, avail, hkv, D, row_elems, scale, kv, out, stride); \
        else values_g(N, q_or_probs, stride, v_buf, slots, S, avail, hkv, D, row_elems, kv, out);              \
        return;
    switch (n) {
        HEADS_CASE(1)
        HEADS_CASE(2)
        HEADS_CASE(3)
        HEADS_CASE(4)
    }
#undef HEADS_CASE
#undef WIDE_CASE
}

#define CHUNK_KEYS_MIN 128 /* keys per work item: a request's keys are split over threads in chunks ... */
#define CHUNK_KEYS_MAX 512 /* ...of up to this many: a core streams a long request's K and V in longer runs */
#define CHUNKS_WANTED 16   /* chunks grow (doubling) only while a request keeps more than this many */

/* Keys per chunk for a request attending n keys: a function of n alone, so its result does not depend
 * on its batch-mates or the thread count (8k keys: 512, ~12% faster than 128 on AMD Zen 4, 2 threads). */
static int64_t chunk_keys(int64_t n) {
    int64_t c = CHUNK_KEYS_MIN;
    while (c < CHUNK_KEYS_MAX && c * CHUNKS_WANTED < n) c *= 2;
    return c;
}

typedef struct {
    const float *q;
    const void *k_buf, *v_buf;
    int kv;
    const int64_t *req_to_token, *rows, *seq_lens;
    int64_t table_stride, start, H, Hkv, D;
    float scale;
    const int32_t *chunk_req, *chunk_idx;  /* each chunk's request and its index there */
    const int64_t *first_chunk;            /* [B + 1] each request's first chunk */
    const int32_t *unit_chunks;            /* chunks grouped in work units: those reading the same keys */
    const int64_t *unit_first;             /* [units + 1] each unit's first entry in unit_chunks */
    float *partials;                       /* [chunks * Hkv][G][2 + D]: max, sum of exp, unnormalized output */
    float *out, *lse;
} attention_job;

#define BLOCK_KEYS 16  /* keys that every KV head attends before the next keys: their whole rows are read together */

/* One chunk's heads: scores, softmax statistics and exp-weighted values into its partials. The keys go
 * BLOCK_KEYS at a time through every KV head, so memory is read a block of whole K/V rows after
 * another, not one KV head's slice of every key in turn (~25% faster at 8k keys, which are read from
 * DRAM). kv and D are compile-time constants where attention_chunks specializes them, so the loads and
 * loops are resolved once, not per key. scores: [H, CHUNK_KEYS_MAX], o: [H, D], part16: scores16_rows'
 * [H, 16] vectors of scratch (AVX-512). */
static inline __attribute__((always_inline)) void attend_chunk(const attention_job *j, int64_t chunk, const int kv,
                                                               const int64_t D, float *scores, float *o, void *part16) {
    const int64_t H = j->H, Hkv = j->Hkv, G = H / Hkv, row = Hkv * rg_kv_head_stride(kv, D), b = j->chunk_req[chunk];
    const int64_t size = chunk_keys(j->seq_lens[b] - j->start), k0 = j->start + j->chunk_idx[chunk] * size;
    const int64_t n = j->seq_lens[b] - k0 < size ? j->seq_lens[b] - k0 : size;
    const int64_t *slots = j->req_to_token + j->rows[b] * j->table_stride + k0;
    const float *qb = j->q + b * H * D;  /* [H, D] */
    float *part = j->partials + chunk * H * (2 + D);
    (void)part16;
    for (int64_t s0 = 0; s0 < n; s0 += BLOCK_KEYS) {
        const int64_t m = n - s0 < BLOCK_KEYS ? n - s0 : BLOCK_KEYS;
#ifdef RG_AVX512
        if (D % 16 == 0) {
            scores16_rows(qb, j->k_buf, j->v_buf, slots + s0, m, n - s0, H, Hkv, D, row, j->scale, kv, scores + s0, n,
                          (__m512 *)part16);
            continue;
        }
#endif
        for (int64_t hkv = 0; hkv < Hkv; hkv++)
            for (int64_t h = hkv * G; h < (hkv + 1) * G; h += GMAX)
                heads_pass(1, heads_at(h, hkv, G), qb + h * D, j->k_buf, j->v_buf, slots + s0, m, n - s0, hkv, D, row,
                           j->scale, kv, scores + h * n + s0, n);
    }
    for (int64_t h = 0; h < H; h++) {
        float *p = scores + h * n, max = max_of(p, n);
        part[h * (2 + D)] = max;
        part[h * (2 + D) + 1] = exp_sum(p, n, max);
    }
    memset(o, 0, sizeof(float) * (size_t)(H * D));
    for (int64_t s0 = 0; s0 < n; s0 += BLOCK_KEYS) {
        const int64_t m = n - s0 < BLOCK_KEYS ? n - s0 : BLOCK_KEYS;
        for (int64_t hkv = 0; hkv < Hkv; hkv++)
            for (int64_t h = hkv * G; h < (hkv + 1) * G; h += GMAX) {
                const float *probs = scores + h * n + s0;
                heads_pass(2, heads_at(h, hkv, G), probs, j->k_buf, j->v_buf, slots + s0, m, n - s0, hkv, D, row, 0.0f,
                           kv, o + h * D, n);
            }
    }
    for (int64_t h = 0; h < H; h++) memcpy(part + h * (2 + D) + 2, o + h * D, sizeof(float) * (size_t)D);
}

/* Items (work units): each chunk of the unit (attend_chunk). A unit's chunks read the same keys (rows of
 * one request verifying drafts), so the keys come from this core's cache after the first; each chunk's
 * arithmetic is the same as alone. */
static void attention_chunks(void *job, int64_t begin, int64_t end, int tid) {
    const attention_job *j = (const attention_job *)job;
    const int64_t H = j->H, D = j->D;
    float scores[H * CHUNK_KEYS_MAX];  /* [H, n] */
    float o[H * D];                    /* [H, D] */
#ifdef RG_AVX512
    __m512 part16[H * 16];             /* [H, 16] scores16_rows' partial products */
#else
    void *part16 = NULL;
#endif
    (void)tid;
    for (int64_t unit = begin; unit < end; unit++)
        for (int64_t e = j->unit_first[unit]; e < j->unit_first[unit + 1]; e++) {
            const int64_t chunk = j->unit_chunks[e];
#if defined(RG_AVX2) || defined(RG_NEON)
#define KV_CASE(KV)                                                      \
    case KV:                                                             \
        if (D == 64) attend_chunk(j, chunk, KV, 64, scores, o, part16);  \
        else attend_chunk(j, chunk, KV, 128, scores, o, part16);         \
        continue;
            if (D == 64 || D == 128)  /* compiled per KV dtype at these head sizes: ~14% less compute (AVX2 ~10%) */
                switch (j->kv) {
                    KV_CASE(RG_KV_F32)
                    KV_CASE(RG_KV_BF16)
                    KV_CASE(RG_KV_F16)
                    KV_CASE(RG_KV_I8)
                }
#undef KV_CASE
#endif
            attend_chunk(j, chunk, j->kv, D, scores, o, part16);
        }
}

/* Items (request, KV head): merge the request's chunks by their log-sum-exp. */
static void attention_merge(void *job, int64_t begin, int64_t end, int tid) {
    const attention_job *j = (const attention_job *)job;
    const int64_t H = j->H, Hkv = j->Hkv, D = j->D, G = H / Hkv;
    (void)tid;
    for (int64_t item = begin; item < end; item++) {
        const int64_t b = item / Hkv, hkv = item % Hkv, c0 = j->first_chunk[b], c1 = j->first_chunk[b + 1];
        for (int64_t g = 0; g < G; g++) {
            float top = -INFINITY, total = 0.0f;
            for (int64_t c = c0; c < c1; c++) {
                const float m = j->partials[((c * Hkv + hkv) * G + g) * (2 + D)];
                top = m > top ? m : top;
            }
            float *o = j->out + (b * H + hkv * G + g) * D;
            memset(o, 0, sizeof(float) * (size_t)D);
            for (int64_t c = c0; c < c1; c++) {
                const float *part = j->partials + ((c * Hkv + hkv) * G + g) * (2 + D);
                const float w = c1 - c0 == 1 ? 1.0f : expf(part[0] - top);
                total += w * part[1];
                for (int64_t d = 0; d < D; d++) o[d] += w * part[2 + d];
            }
            const float inv = 1.0f / total;
            for (int64_t d = 0; d < D; d++) o[d] *= inv;
            if (j->lse != NULL) j->lse[b * H + hkv * G + g] = top + logf(total);
        }
    }
}

/* q, out: float [B, H, D]; k_buf, v_buf: [N, Hkv, D] in the KV dtype kv (RG_KV_*: float32, bfloat16, float16;
 * int8 rows [N, Hkv, D + 4]);
 * request b's keys are slots req_to_token[rows[b] * table_stride + start .. seq_lens[b]) (start: keys
 * before it are attended elsewhere, e.g. a shared prefix). lse (may be NULL): float [B, H], the
 * natural-log sum of exp(scores), to merge with another partial result. H % Hkv == 0.
 * Work is per chunk of up to chunk_keys(keys) keys: its heads' scores (K read once for each KV head's group),
 * softmax statistics and exp-weighted sum of V (V read once for the group); each request's chunks then
 * merge by log-sum-exp. Consecutive requests on one req_to_token row (a request and the
 * rows verifying its drafts) share their i-th chunks' keys: those chunks form one work item, so the
 * keys are read from memory once and from this core's cache for the others. A request's chunks
 * depend on its length alone, so its result does not depend on its batch-mates or the thread count.
 * Returns 0, or -1 on bad sizes or when the buffers cannot be allocated. */
int decode_attention(const float *q, const void *k_buf, const void *v_buf, int kv, const int64_t *req_to_token,
                     int64_t table_stride, const int64_t *rows, const int64_t *seq_lens, int64_t start, int64_t B,
                     int64_t H, int64_t Hkv, int64_t D, float scale, float *out, float *lse, int nthreads) {
    if (Hkv <= 0 || H % Hkv != 0 || nthreads < 1 || start < 0 || H / Hkv > 64) return -1;
    const int64_t G = H / Hkv;
    int64_t chunks = 0;
    for (int64_t b = 0; b < B; b++) {
        if (seq_lens[b] <= start || seq_lens[b] > table_stride) return -1;
        const int64_t size = chunk_keys(seq_lens[b] - start);
        chunks += (seq_lens[b] - start + size - 1) / size;
    }
    const size_t map_bytes = ((size_t)(3 * chunks) * 4 + (size_t)(B + 1 + chunks + 1) * 8 + 63) / 64 * 64;
    uint8_t *mem = (uint8_t *)rg_scratch(RG_SCRATCH_ATTENTION,
                                         map_bytes + sizeof(float) * (size_t)(chunks * Hkv * G * (2 + D)));
    if (mem == NULL) return -1;
    int64_t *first_chunk = (int64_t *)mem, *unit_first = first_chunk + B + 1;
    int32_t *chunk_req = (int32_t *)(unit_first + chunks + 1), *chunk_idx = chunk_req + chunks;
    int32_t *unit_chunks = chunk_idx + chunks;
    for (int64_t b = 0, c = 0; b < B; b++) {
        first_chunk[b] = c;
        const int64_t size = chunk_keys(seq_lens[b] - start);
        for (int64_t i = 0; i < (seq_lens[b] - start + size - 1) / size; i++, c++) {
            chunk_req[c] = (int32_t)b;
            chunk_idx[c] = (int32_t)i;
        }
    }
    first_chunk[B] = chunks;
    /* Work units: the i-th chunks of consecutive requests on one req_to_token row (a request and the
     * rows verifying its drafts) form one unit; any other chunk is a unit alone. */
    int64_t units = 0, e = 0;
    for (int64_t b0 = 0, b1; b0 < B; b0 = b1) {
        for (b1 = b0 + 1; b1 < B && rows[b1] == rows[b0]; b1++) {}
        int64_t most = 0;  /* chunks of the group's longest request */
        for (int64_t b = b0; b < b1; b++) {
            const int64_t n = first_chunk[b + 1] - first_chunk[b];
            most = n > most ? n : most;
        }
        for (int64_t i = 0; i < most; i++) {
            unit_first[units++] = e;
            for (int64_t b = b0; b < b1; b++)
                if (first_chunk[b] + i < first_chunk[b + 1]) unit_chunks[e++] = (int32_t)(first_chunk[b] + i);
        }
    }
    unit_first[units] = e;
    attention_job job = {q, k_buf, v_buf, kv, req_to_token, rows, seq_lens, table_stride, start, H, Hkv, D, scale,
                         chunk_req, chunk_idx, first_chunk, unit_chunks, unit_first, (float *)(mem + map_bytes), out,
                         lse};
    rg_parallel(nthreads, units, RG_DYNAMIC, attention_chunks, &job);
    rg_parallel(B * H * D >= 65536 ? nthreads : 1, B * Hkv, RG_STATIC, attention_merge, &job);
    return 0;
}

#define QB 24 /* queries per work item of the shared-prefix kernel (3 vectors) */

typedef struct {
    const float *q;
    const void *k_buf, *v_buf;
    int kv;
    const int64_t *shared;
    int64_t C, B, H, Hkv, D;
    float scale;
    float *out;
    const float *lse_own;
    float *bufs;  /* each thread's scratch */
    size_t per_thread;
} shared_job;

#ifdef RG_AVX2
/* o^T[d0 .. d0 + NV] = sum_s v_s[d] * probs[s] over the C shared keys (NV x 3 accumulators). */
static inline __attribute__((always_inline)) void shared_values(const int NV, const float *probs, const void *v_buf,
                                                                const int64_t *shared, int64_t C, int64_t Hkv,
                                                                int64_t D, int64_t hkv, int64_t d0, int kv,
                                                                float *ot) {
    __m256 o[4][3];
    for (int i = 0; i < NV; i++) o[i][0] = o[i][1] = o[i][2] = _mm256_setzero_ps();
    for (int64_t s = 0; s < C; s++) {
        const int64_t base = shared[s] * Hkv * D + hkv * D + d0;
        const float *p = probs + s * QB;
        const __m256 p0 = _mm256_loadu_ps(p), p1 = _mm256_loadu_ps(p + 8), p2 = _mm256_loadu_ps(p + 16);
        for (int i = 0; i < NV; i++) {
            const __m256 vb = _mm256_set1_ps(load1(v_buf, base + i, kv));
            o[i][0] = _mm256_fmadd_ps(vb, p0, o[i][0]);
            o[i][1] = _mm256_fmadd_ps(vb, p1, o[i][1]);
            o[i][2] = _mm256_fmadd_ps(vb, p2, o[i][2]);
        }
    }
    for (int i = 0; i < NV; i++) {
        _mm256_storeu_ps(ot + (d0 + i) * QB, o[i][0]);
        _mm256_storeu_ps(ot + (d0 + i) * QB + 8, o[i][1]);
        _mm256_storeu_ps(ot + (d0 + i) * QB + 16, o[i][2]);
    }
}

/* shared_prefix_attention with AVX2: NQ = B * G queries of each KV head in work items of QB, each
 * shared key read once per QB queries, scores and values as outer products (no horizontal sums). */
static void shared_items(void *job, int64_t begin, int64_t end, int tid) {
    const shared_job *sj = (const shared_job *)job;
    const float *q = sj->q, *lse_own = sj->lse_own;
    const void *k_buf = sj->k_buf, *v_buf = sj->v_buf;
    const int kv = sj->kv;
    const int64_t *shared = sj->shared;
    const int64_t C = sj->C, H = sj->H, Hkv = sj->Hkv, D = sj->D, G = H / Hkv, NQ = sj->B * G;
    const int64_t groups = (NQ + QB - 1) / QB;
    const float scale = sj->scale;
    float *out = sj->out, *bufs = sj->bufs;
    const size_t per_thread = sj->per_thread;
    for (int64_t item = begin; item < end; item++) {
        const int64_t hkv = item / groups, q0 = (item % groups) * QB, nq = NQ - q0 < QB ? NQ - q0 : QB;
        float *probs = bufs + (size_t)tid * per_thread, *qt = probs + C * QB, *ot = qt + D * QB;
        /* query j of this item: request (q0 + j) / G, head hkv * G + (q0 + j) % G */
        for (int64_t d = 0; d < D; d++)
            for (int64_t j = 0; j < QB; j++) {
                const int64_t qi = q0 + j, b = qi / G, h = hkv * G + qi % G;
                qt[d * QB + j] = j < nq ? q[(b * H + h) * D + d] : 0.0f;
            }
        __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0;
        const __m256 sc = _mm256_set1_ps(scale);
        const int64_t bytes = D * rg_kv_bytes(kv);
        int64_t s = 0;
        for (; s + 4 <= C; s += 4) {  /* 4 keys x 24 queries: each q vector loaded once per 4 keys */
            int64_t base[4];
            for (int j = 0; j < 4; j++) {
                base[j] = shared[s + j] * Hkv * D + hkv * D;
                if (s + j + PREFETCH_AHEAD < C)
                    prefetch_row(k_buf, shared[s + j + PREFETCH_AHEAD] * Hkv * D + hkv * D, bytes, kv);
            }
            __m256 a[4][3];
            for (int j = 0; j < 4; j++) a[j][0] = a[j][1] = a[j][2] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d++) {
                const __m256 q0 = _mm256_loadu_ps(qt + d * QB), q1 = _mm256_loadu_ps(qt + d * QB + 8);
                const __m256 q2 = _mm256_loadu_ps(qt + d * QB + 16);
                for (int j = 0; j < 4; j++) {
                    const __m256 kb = _mm256_set1_ps(load1(k_buf, base[j] + d, kv));
                    a[j][0] = _mm256_fmadd_ps(q0, kb, a[j][0]);
                    a[j][1] = _mm256_fmadd_ps(q1, kb, a[j][1]);
                    a[j][2] = _mm256_fmadd_ps(q2, kb, a[j][2]);
                }
            }
            for (int j = 0; j < 4; j++) {
                a[j][0] = _mm256_mul_ps(a[j][0], sc); a[j][1] = _mm256_mul_ps(a[j][1], sc);
                a[j][2] = _mm256_mul_ps(a[j][2], sc);
                m0 = _mm256_max_ps(m0, a[j][0]); m1 = _mm256_max_ps(m1, a[j][1]); m2 = _mm256_max_ps(m2, a[j][2]);
                _mm256_storeu_ps(probs + (s + j) * QB, a[j][0]);
                _mm256_storeu_ps(probs + (s + j) * QB + 8, a[j][1]);
                _mm256_storeu_ps(probs + (s + j) * QB + 16, a[j][2]);
            }
        }
        for (; s < C; s++) {
            const int64_t base = shared[s] * Hkv * D + hkv * D;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0;
            for (int64_t d = 0; d < D; d++) {
                const __m256 kb = _mm256_set1_ps(load1(k_buf, base + d, kv));
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + d * QB), kb, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + d * QB + 8), kb, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + d * QB + 16), kb, a2);
            }
            a0 = _mm256_mul_ps(a0, sc); a1 = _mm256_mul_ps(a1, sc); a2 = _mm256_mul_ps(a2, sc);
            m0 = _mm256_max_ps(m0, a0); m1 = _mm256_max_ps(m1, a1); m2 = _mm256_max_ps(m2, a2);
            _mm256_storeu_ps(probs + s * QB, a0);
            _mm256_storeu_ps(probs + s * QB + 8, a1);
            _mm256_storeu_ps(probs + s * QB + 16, a2);
        }
        __m256 l0 = _mm256_setzero_ps(), l1 = l0, l2 = l0;
        for (int64_t s = 0; s < C; s++) {
            float *p = probs + s * QB;
            const __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), m0));
            const __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + 8), m1));
            const __m256 e2 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + 16), m2));
            _mm256_storeu_ps(p, e0); _mm256_storeu_ps(p + 8, e1); _mm256_storeu_ps(p + 16, e2);
            l0 = _mm256_add_ps(l0, e0); l1 = _mm256_add_ps(l1, e1); l2 = _mm256_add_ps(l2, e2);
        }
        int64_t d0 = 0;
        for (; d0 + 4 <= D; d0 += 4) shared_values(4, probs, v_buf, shared, C, Hkv, D, hkv, d0, kv, ot);
        for (; d0 < D; d0++) shared_values(1, probs, v_buf, shared, C, Hkv, D, hkv, d0, kv, ot);
        float mx[QB], sum[QB];
        _mm256_storeu_ps(mx, m0); _mm256_storeu_ps(mx + 8, m1); _mm256_storeu_ps(mx + 16, m2);
        _mm256_storeu_ps(sum, l0); _mm256_storeu_ps(sum + 8, l1); _mm256_storeu_ps(sum + 16, l2);
        for (int64_t j = 0; j < nq; j++) {  /* merge with the request's own part by log-sum-exp */
            const int64_t qi = q0 + j, b = qi / G, h = hkv * G + qi % G;
            const float lse_sh = mx[j] + logf(sum[j]), lo = lse_own[b * H + h];
            const float top = lse_sh > lo ? lse_sh : lo;
            const float w_sh = expf(lse_sh - top), w_own = expf(lo - top), inv = 1.0f / (w_sh + w_own);
            float *o = out + (b * H + h) * D;
            for (int64_t d = 0; d < D; d++) o[d] = (w_sh * ot[d * QB + j] / sum[j] + w_own * o[d]) * inv;
        }
    }
}

static size_t shared_per_thread(int64_t C, int64_t D) { return (size_t)(C * QB + D * QB + D * QB); }
static int64_t shared_items_count(int64_t B, int64_t H, int64_t Hkv) { return Hkv * ((B * (H / Hkv) + QB - 1) / QB); }
#else
/* The scalar reference of shared_prefix_attention: one (request, head) query at a time. */
static void shared_items(void *job, int64_t begin, int64_t end, int tid) {
    const shared_job *sj = (const shared_job *)job;
    const float *q = sj->q, *lse_own = sj->lse_own;
    const void *k_buf = sj->k_buf, *v_buf = sj->v_buf;
    const int kv = sj->kv;
    const int64_t *shared = sj->shared;
    const int64_t C = sj->C, H = sj->H, Hkv = sj->Hkv, D = sj->D, G = H / Hkv;
    const float scale = sj->scale;
    float *out = sj->out, *bufs = sj->bufs;
    for (int64_t bh = begin; bh < end; bh++) {
        const int64_t hkv = (bh % H) / G;
        float *p = bufs + (size_t)tid * (size_t)(C + D), *o = p + C;
        const float *qh = q + bh * D;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t s = 0; s < C; s++) {
            const int64_t base = shared[s] * Hkv * D + hkv * D;
            float a = 0.0f;
            for (int64_t d = 0; d < D; d++) a += qh[d] * load1(k_buf, base + d, kv);
            p[s] = scale * a;
            mx = p[s] > mx ? p[s] : mx;
        }
        for (int64_t s = 0; s < C; s++) {
            p[s] = expf(p[s] - mx);
            sum += p[s];
        }
        memset(o, 0, sizeof(float) * (size_t)D);
        for (int64_t s = 0; s < C; s++) {
            const int64_t base = shared[s] * Hkv * D + hkv * D;
            for (int64_t d = 0; d < D; d++) o[d] += p[s] * load1(v_buf, base + d, kv);
        }
        const float lse_sh = mx + logf(sum), lo = lse_own[bh], top = lse_sh > lo ? lse_sh : lo;
        const float w_sh = expf(lse_sh - top), w_own = expf(lo - top), inv = 1.0f / (w_sh + w_own);
        float *ob = out + bh * D;
        for (int64_t d = 0; d < D; d++) ob[d] = (w_sh * o[d] / sum + w_own * ob[d]) * inv;
    }
}

static size_t shared_per_thread(int64_t C, int64_t D) { return (size_t)(C + D); }
static int64_t shared_items_count(int64_t B, int64_t H, int64_t Hkv) { (void)Hkv; return B * H; }
#endif

/* Cascade decode attention, shared part: the B * H queries against the C keys at slots
 * shared[0 .. C) that every request starts with, merged into out / lse_own: out [B, H, D] float32
 * and lse_own [B, H] hold each request's attention over its own later keys (decode_attention with
 * start = C). Not for int8 K/V (callers attend the whole sequence with decode_attention instead).
 * Returns 0, or -1 on bad sizes, int8 K/V, or when the buffers cannot be allocated. */
int shared_prefix_attention(const float *q, const void *k_buf, const void *v_buf, int kv, const int64_t *shared,
                            int64_t C, int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale, float *out,
                            const float *lse_own, int nthreads) {
    if (Hkv <= 0 || H % Hkv != 0 || C < 1 || nthreads < 1 || kv == RG_KV_I8) return -1;
    const size_t per_thread = shared_per_thread(C, D);
    float *bufs = (float *)rg_scratch(RG_SCRATCH_SHARED, sizeof(float) * per_thread * (size_t)nthreads);
    if (bufs == NULL) return -1;
    shared_job job = {q, k_buf, v_buf, kv, shared, C, B, H, Hkv, D, scale, out, lse_own, bufs, per_thread};
    rg_parallel(nthreads, shared_items_count(B, H, Hkv), RG_DYNAMIC, shared_items, &job);
    return 0;
}
