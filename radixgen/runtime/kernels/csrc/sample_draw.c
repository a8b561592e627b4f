/* Seeded sampling's draw on CPU: temperature, top-k, top-p and min-p, then the inverse-CDF draw, per
 * row of processed logits, with the torch sampler's semantics (sampling/torch_ops.py: `sample`).
 *
 * The torch path finds top-k / top-p cuts with a topk of 1,024 candidates and, when the nucleus is
 * wider, a full sort: on a 262k vocabulary 2-3 ms a row, and 25 ms for a chat's first token (a
 * 20,000-token nucleus). Here both cuts are radix selects over the 32-bit order-preserving key of
 * each scaled logit: a histogram of the top 11 bits (counts for top-k, probability mass for top-p),
 * the bucket where the running count or mass from the top reaches the target, then the same over the
 * next 11 and last 10 bits among that bucket's tokens alone. That is exact and tie-inclusive, as the
 * sorted walk: top-k keeps x >= the k-th largest value, top-p keeps x >= the smallest value whose
 * mass strictly above is under top_p of the top-k survivors' mass. min-p keeps x >= max + log(min_p).
 * The draw walks the survivors' weights in vocabulary order, a double running sum rounded to float
 * as torch's cumsum does, to the first index whose sum passes u * total. Masses are summed in
 * another order than torch's sort, so a token exactly on a cut can fall the other way.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "radixgen_kernels.h"
#include "scratch.h"
#include "simd_math.h"
#include "thread_pool.h"

#define PARALLEL_MIN 65536 /* logits below which one thread beats waking the team */

typedef struct {
    const float *logits;
    int64_t V;
    const float *inv_temp, *top_p, *log_min_p, *u;
    const int64_t *top_k;
    int64_t *out;
} draw_job;

/* Order-preserving 32-bit key of a float: a < b iff key(a) < key(b) (NaN aside). */
static inline uint32_t key_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* The largest key K among keys >= floor such that the count (w NULL) or mass (w) of keys >= K,
 * walked from the top, first reaches `target`; the smallest such key when it never does. cand:
 * scratch for V indices. */
static uint32_t select_key(const uint32_t *keys, const float *w, int64_t V, uint32_t floor, double target,
                           int32_t *cand) {
    static const int shift[3] = {21, 10, 0}, width[3] = {11, 11, 10};
    double hist[2048];
    uint32_t prefix = 0;
    double above = 0.0;  /* count or mass above the current prefix's range */
    int64_t n = V;
    for (int lv = 0; lv < 3; lv++) {
        const uint32_t mask = (1u << width[lv]) - 1;
        memset(hist, 0, sizeof(double) * (size_t)(mask + 1));
        for (int64_t c = 0; c < n; c++) {
            const int64_t i = lv == 0 ? c : cand[c];
            const uint32_t k = keys[i];
            if (k >= floor) hist[(k >> shift[lv]) & mask] += w != NULL ? (double)w[i] : 1.0;
        }
        int64_t b = mask, lowest = -1;
        for (; b >= 0; b--) {
            if (hist[b] == 0.0) continue;
            lowest = b;
            if (above + hist[b] >= target) break;
            above += hist[b];
        }
        if (b < 0) b = lowest < 0 ? 0 : lowest;  /* never reached (rounding): keep going to the smallest key */
        prefix = (prefix << width[lv]) | (uint32_t)b;
        if (lv < 2) {  /* the bucket's tokens alone go on to the next bits */
            int64_t m = 0;
            for (int64_t c = 0; c < n; c++) {
                const int64_t i = lv == 0 ? c : cand[c];
                const uint32_t k = keys[i];
                if (k >= floor && (k >> shift[lv]) == prefix) cand[m++] = (int32_t)i;
            }
            n = m;
        }
    }
    return prefix;
}

/* The float whose key is k (key_of's inverse); -inf for 0 (no cut: below every non-NaN key). */
static inline float value_of(uint32_t k) {
    if (k <= key_of(-INFINITY)) return -INFINITY;
    const uint32_t b = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Sum of w[i] over xs[i] >= cut (double lanes: as exact as a sequential double sum to float's precision). */
static double mass_from(const float *xs, const float *w, int64_t V, float cut) {
    double acc = 0.0;
    int64_t i = 0;
#ifdef RG_AVX2
    const __m256 c = _mm256_set1_ps(cut);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_and_ps(_mm256_loadu_ps(w + i), _mm256_cmp_ps(_mm256_loadu_ps(xs + i), c, _CMP_GE_OQ));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(lo, hi));
    acc = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#endif
    for (; i < V; i++)
        if (xs[i] >= cut) acc += w[i];
    return acc;
}

/* keys[i] = key_of(xs[i]) for i < n. */
static void keys_of(const float *xs, int64_t n, uint32_t *keys) {
    for (int64_t i = 0; i < n; i++) keys[i] = key_of(xs[i]);
}

/* Row `row`'s draw. Scratch of V each: xs (scaled logits), w (weights), keys, cand, map. With a top-k
 * cut, its survivors (k and its ties, in vocabulary order) are moved to the front of xs first, so the
 * weights, the top-p select and the draw read those alone. */
static void draw_one(const draw_job *j, int64_t row, float *xs, float *w, uint32_t *keys, int32_t *cand,
                     int32_t *map) {
    const int64_t V = j->V;
    const float *x = j->logits + row * V, t = j->inv_temp[row];
    float x_max = -INFINITY;
    int64_t i = 0;
#ifdef RG_AVX2
    const __m256 vt = _mm256_set1_ps(t);
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= V; i += 8) {  /* the scaled logits, as torch's logits * inv_temperature, and their max */
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vt);
        _mm256_storeu_ps(xs + i, v);
        vm = _mm256_max_ps(vm, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vm);
    for (int l = 0; l < 8; l++) x_max = lanes[l] > x_max ? lanes[l] : x_max;
#endif
    for (; i < V; i++) {
        xs[i] = x[i] * t;
        x_max = xs[i] > x_max ? xs[i] : x_max;
    }
    const int64_t k = j->top_k[row];
    int64_t n = V;  /* tokens still in play: xs[0 .. n), token map[i] (identity without a top-k cut) */
    int mapped = 0;
    if (k >= 1 && k < V) {
        keys_of(xs, V, keys);
        const uint32_t kth = select_key(keys, NULL, V, 0, (double)k, cand);
        n = 0;
        for (i = 0; i < V; i++)
            if (keys[i] >= kth) {
                xs[n] = xs[i];
                map[n++] = (int32_t)i;
            }
        mapped = 1;
    }
    i = 0;
#ifdef RG_AVX2
    const __m256 vmax = _mm256_set1_ps(x_max);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(w + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(xs + i), vmax)));
#endif
    for (; i < n; i++) w[i] = expf(xs[i] - x_max);
    uint32_t cut = 0;  /* survivors: key >= cut */
    if (j->top_p[row] < 1.0f) {
        const double total = mass_from(xs, w, n, -INFINITY);  /* the top-k survivors' mass */
        keys_of(xs, n, keys);
        cut = select_key(keys, w, n, 0, (double)(j->top_p[row] * (float)total), cand);
    }
    if (j->log_min_p[row] > -INFINITY) {
        const uint32_t m_cut = key_of(x_max + j->log_min_p[row]);
        cut = m_cut > cut ? m_cut : cut;
    }
    const float cut_value = value_of(cut);
    const float target = j->u[row] * (float)mass_from(xs, w, n, cut_value);
    int64_t last = -1;
    double acc = 0.0;
    for (i = 0; i < n; i++) {
        if (xs[i] < cut_value || w[i] <= 0.0f) continue;
        acc += w[i];
        last = i;
        if ((float)acc > target) break;
    }
    /* none passed (rounding at the very end): the last positive weight */
    j->out[row] = last < 0 ? 0 : mapped ? map[last] : last;
}

static void draw_rows(void *job, int64_t begin, int64_t end, int tid) {
    const draw_job *j = (const draw_job *)job;
    (void)tid;
    float *xs = (float *)rg_scratch(RG_SCRATCH_DRAW, (size_t)j->V * (2 * sizeof(float) + 3 * sizeof(int32_t)));
    for (int64_t row = begin; row < end; row++) {
        if (xs == NULL) {
            j->out[row] = -1;
            continue;
        }
        draw_one(j, row, xs, xs + j->V, (uint32_t *)(xs + 2 * j->V), (int32_t *)(xs + 3 * j->V),
                 (int32_t *)(xs + 4 * j->V));
    }
}

int sample_draw(const float *logits, int64_t B, int64_t V, const float *inv_temp, const int64_t *top_k,
                const float *top_p, const float *log_min_p, const float *u, int64_t *out, int nthreads) {
    if (B < 1 || V < 1 || V > INT32_MAX || nthreads < 1) return -1;
    draw_job job = {logits, V, inv_temp, top_p, log_min_p, u, top_k, out};
    rg_parallel(B * V >= PARALLEL_MIN ? nthreads : 1, B, RG_DYNAMIC, draw_rows, &job);
    for (int64_t b = 0; b < B; b++)
        if (out[b] < 0) return -1;
    return 0;
}
