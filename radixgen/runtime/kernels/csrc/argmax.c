/* Greedy sampling's argmax over float32 logit rows, for the CPU sampler.
 *
 * torch's max(-1).indices reads a row on one thread at ~4 GB/s (a 262k-token vocabulary: ~0.25 ms,
 * 2-3% of a small model's decode step); here each row is cut into chunks of CHUNK logits that the
 * kernel threads scan with 8-lane compare-and-blend (4 independent accumulators), then each row's
 * chunk results are merged. Every lane keeps the first position of its largest value and merges pick
 * the lower position among equal values, so the result is the first of equal maxima, as torch's.
 * NaN logits are not ordered here (torch would return a NaN's position); a row of -inf gives 0.
 */
#include <math.h>
#include <stdint.h>
#include "radixgen_kernels.h"
#include "scratch.h"
#include "simd_math.h"
#include "thread_pool.h"

#define CHUNK 16384         /* logits per work item */
#define PARALLEL_MIN 65536  /* logits below which one thread beats waking the team */

typedef struct {
    const float *x;
    int64_t V, chunks;
    float *best;      /* [B * chunks] each chunk's largest value */
    int64_t *where;   /* [B * chunks] its first position in the row */
} argmax_job;

/* (value, position) of the first largest of x[lo .. hi). */
static void chunk_argmax(const float *x, int64_t lo, int64_t hi, float *best, int64_t *where) {
    float m = -INFINITY;
    int64_t at = lo;
    int64_t i = lo;
#ifdef RG_AVX2
    if (hi - lo >= 32) {
        __m256 vm[4];
        __m256i vi[4];
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), step = _mm256_set1_epi32(32);
        __m256i pos[4];
        for (int a = 0; a < 4; a++) {
            vm[a] = _mm256_set1_ps(-INFINITY);
            vi[a] = _mm256_setzero_si256();
            pos[a] = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * a));  /* offsets from lo, < CHUNK */
        }
        for (; i + 32 <= hi; i += 32) {
            for (int a = 0; a < 4; a++) {
                const __m256 v = _mm256_loadu_ps(x + i + 8 * a);
                const __m256 gt = _mm256_cmp_ps(v, vm[a], _CMP_GT_OQ);
                vm[a] = _mm256_blendv_ps(vm[a], v, gt);
                vi[a] = _mm256_castps_si256(
                    _mm256_blendv_ps(_mm256_castsi256_ps(vi[a]), _mm256_castsi256_ps(pos[a]), gt));
                pos[a] = _mm256_add_epi32(pos[a], step);
            }
        }
        float fv[32];
        int32_t fi[32];
        for (int a = 0; a < 4; a++) {
            _mm256_storeu_ps(fv + 8 * a, vm[a]);
            _mm256_storeu_si256((__m256i *)(fi + 8 * a), vi[a]);
        }
        for (int l = 0; l < 32; l++)
            if (fv[l] > m || (fv[l] == m && lo + fi[l] < at)) m = fv[l], at = lo + fi[l];
    }
#endif
    for (; i < hi; i++)
        if (x[i] > m) m = x[i], at = i;
    *best = m;
    *where = at;
}

static void argmax_chunks(void *job, int64_t begin, int64_t end, int tid) {
    const argmax_job *j = (const argmax_job *)job;
    (void)tid;
    for (int64_t item = begin; item < end; item++) {
        const int64_t row = item / j->chunks, c = item % j->chunks, lo = c * CHUNK;
        const int64_t hi = lo + CHUNK < j->V ? lo + CHUNK : j->V;
        chunk_argmax(j->x + row * j->V, lo, hi, j->best + item, j->where + item);
    }
}

int argmax_rows(const float *x, int64_t B, int64_t V, int64_t *out, int nthreads) {
    if (B < 1 || V < 1 || nthreads < 1) return -1;
    const int64_t chunks = (V + CHUNK - 1) / CHUNK;
    const int64_t n = B * chunks, floats = (n + 1) / 2 * 2;  /* positions 8-byte aligned after the values */
    float *best = (float *)rg_scratch(RG_SCRATCH_ARGMAX, sizeof(float) * (size_t)floats + sizeof(int64_t) * (size_t)n);
    if (best == NULL) return -1;
    int64_t *where = (int64_t *)(best + floats);
    argmax_job job = {x, V, chunks, best, where};
    rg_parallel(B * V >= PARALLEL_MIN ? nthreads : 1, n, RG_STATIC, argmax_chunks, &job);
    for (int64_t b = 0; b < B; b++) {  /* chunks in order: a later chunk wins only by a larger value */
        int64_t k = b * chunks;
        for (int64_t c = 1; c < chunks; c++)
            if (best[b * chunks + c] > best[k]) k = b * chunks + c;
        out[b] = where[k];
    }
    return 0;
}
