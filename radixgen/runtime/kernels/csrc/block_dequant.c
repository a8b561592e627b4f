/* Rows of a block weight (block_gemm.c's panel layout, any block_format.h format) back to float32 or
 * bfloat16: the embedding lookup of a model whose token table stays in blocks, and the wide steps
 * (long prompt chunks) whose GEMMs run on a dequantized slice of a weight at a time instead of a
 * dense copy of the model. Each value is scale * q + min in float32, as the Python reference
 * (`BlockWeight.dequantize`) and gguf's dequantization compute it (no FMA contraction here).
 */
#include <stdint.h>
#include <stdlib.h>
#include "block_format.h"
#include "block_unpack.h"
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
    int64_t n_rows;
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

#if defined(RG_AVX512)
/* bfloat16 of 16 floats, rounded as rg_float_to_bf16 (to nearest even; NaN stays a quiet NaN). */
static inline __m256i to_bf16(__m512 x) {
#if defined(RG_AVX512BF16)
    return (__m256i)_mm512_cvtneps_pbh(x);
#else
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
#endif
}

/* Rows 16p .. 16p + nvalid - 1 of panel v into out [., k] (its row 16p first), float32 or bfloat16, a
 * block at a time: each of its 8 weight vectors (4 k of 16 rows) in 4 parts of 4 rows x 4 k, scaled by
 * those rows' own scales and mins (permuted into place once a block); a multiply then an add, as the
 * scalar path. */
static void dequant_panel(int fmt, const rg_panel *v, int64_t nb, int64_t k, int64_t nvalid, void *out,
                          int out_dtype) {
    const int halves = FMT_HALVES(fmt), parts = nvalid < 16 ? (int)((nvalid + 3) / 4) : 4;
    const __m512i lane_row = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2);
    for (int64_t b = 0; b < nb; b++) {
        __m512 d[2], m[2], dp[2][4], mp[2][4];  /* dp[h][j]: lane 4r + t holds row 4j + r's scale */
        scales16(fmt, v, b, d, m);
        for (int h = 0; h < halves; h++)
            for (int j = 0; j < 4; j++) {
                const __m512i rows = _mm512_add_epi32(lane_row, _mm512_set1_epi32(4 * j));
                dp[h][j] = _mm512_permutexvar_ps(rows, d[h]);
                mp[h][j] = FMT_HAS_MIN(fmt) ? _mm512_permutexvar_ps(rows, m[h]) : _mm512_setzero_ps();
            }
        __m512i w[8];
        weights16(fmt, v->qs + b * FMT_BLOCK_BYTES(fmt), w);
        for (int g = 0; g < 8; g++) {
            const int h = halves == 2 ? g / 4 : 0;
            const __m128i part[4] = {_mm512_extracti32x4_epi32(w[g], 0), _mm512_extracti32x4_epi32(w[g], 1),
                                     _mm512_extracti32x4_epi32(w[g], 2), _mm512_extracti32x4_epi32(w[g], 3)};
            for (int j = 0; j < parts; j++) {  /* rows 4j .. 4j + 3; lane 4r + t: row 4j + r, k 4g + t */
                __m512i qi = _mm512_cvtepu8_epi32(part[j]);
                if (fmt == FMT_I8H) qi = _mm512_sub_epi32(qi, _mm512_set1_epi32(128));
                __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(qi), dp[h][j]);
                if (FMT_HAS_MIN(fmt)) x = _mm512_add_ps(x, mp[h][j]);
                const int64_t at = 4 * j * k + b * 32 + 4 * g;
                const int count = nvalid - 4 * j < 4 ? (int)(nvalid - 4 * j) : 4;
                if (out_dtype == 0) {
                    float lanes[16];
                    _mm512_storeu_ps(lanes, x);
                    for (int r = 0; r < count; r++) memcpy((float *)out + at + r * k, lanes + 4 * r, 16);
                } else {
                    uint16_t lanes[16];
                    _mm256_storeu_si256((__m256i *)lanes, to_bf16(x));
                    for (int r = 0; r < count; r++) memcpy((uint16_t *)out + at + r * k, lanes + 4 * r, 8);
                }
            }
        }
    }
}

#elif defined(RG_AVX2)
/* bfloat16 of 8 floats, rounded as rg_float_to_bf16 (to nearest even; NaN stays a quiet NaN). */
static inline __m128i to_bf16(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i v = _mm256_blendv_epi8(r, quiet, nan);  /* [0, 0xFFFF] each: the pack saturates nothing */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0xD8));
}

/* Rows 16p .. 16p + nvalid - 1 of panel v into out [., k] (its row 16p first), float32 or bfloat16, a
 * block and half panel (8 rows) at a time: each of its 8 weight vectors (4 k of 8 rows) in 4 parts of
 * 2 rows x 4 k, scaled by those rows' own scales and mins (permuted into place once a block); a multiply
 * then an add, as the scalar path. */
static void dequant_panel(int fmt, const rg_panel *v, int64_t nb, int64_t k, int64_t nvalid, void *out,
                          int out_dtype) {
    const int halves = FMT_HALVES(fmt);
    for (int64_t b = 0; b < nb; b++) {
        for (int h = 0; h < 2 && 8 * h < nvalid; h++) {
            const int parts = nvalid - 8 * h < 8 ? (int)((nvalid - 8 * h + 1) / 2) : 4;
            __m256 d[2], m[2], dp[2][4], mp[2][4];  /* dp[s][j]: lane 4r + t holds row 2j + r's scale */
            scales8(fmt, v, b, h, d, m);
            for (int s = 0; s < halves; s++)
                for (int j = 0; j < 4; j++) {
                    const __m256i rows = _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                                           2 * j + 1);
                    dp[s][j] = _mm256_permutevar8x32_ps(d[s], rows);
                    mp[s][j] = FMT_HAS_MIN(fmt) ? _mm256_permutevar8x32_ps(m[s], rows) : _mm256_setzero_ps();
                }
            __m256i w[8];
            weights8(fmt, v->qs + b * FMT_BLOCK_BYTES(fmt), h, w);
            for (int g = 0; g < 8; g++) {
                const int s = halves == 2 ? g / 4 : 0;
                const __m128i lo = _mm256_castsi256_si128(w[g]), hi = _mm256_extracti128_si256(w[g], 1);
                for (int j = 0; j < parts; j++) {  /* rows 8h + 2j, + 1; lane 4r + t: row 8h + 2j + r, k 4g + t */
                    const __m128i src = j < 2 ? lo : hi, bytes = j % 2 ? _mm_unpackhi_epi64(src, src) : src;
                    const __m256i qi = fmt == FMT_I8H ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
                    __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(qi), dp[s][j]);
                    if (FMT_HAS_MIN(fmt)) x = _mm256_add_ps(x, mp[s][j]);
                    const int64_t row = 8 * h + 2 * j, at = row * k + b * 32 + 4 * g;
                    const int second = row + 1 < nvalid;
                    if (out_dtype == 0) {
                        _mm_storeu_ps((float *)out + at, _mm256_castps256_ps128(x));
                        if (second) _mm_storeu_ps((float *)out + at + k, _mm256_extractf128_ps(x, 1));
                    } else {
                        const __m128i bf = to_bf16(x);
                        _mm_storel_epi64((__m128i *)((uint16_t *)out + at), bf);
                        if (second) _mm_storel_epi64((__m128i *)((uint16_t *)out + at + k), _mm_unpackhi_epi64(bf, bf));
                    }
                }
            }
        }
    }
}
#endif

#if defined(RG_AVX512) || defined(RG_AVX2)
static void dequant_panels(void *job, int64_t begin, int64_t end, int tid) {
    const dequant_job *j = (const dequant_job *)job;
    const int64_t nb = j->k / QK, first = j->rows[0] / NR, elem = j->out_dtype == 0 ? 4 : 2;
    (void)tid;
    for (int64_t i = begin; i < end; i++) {
        const int64_t done = i * NR, nvalid = j->n_rows - done < NR ? j->n_rows - done : NR;
        const rg_panel v = rg_panel_of(j->fmt, j->w, nb, first + i);
        dequant_panel(j->fmt, &v, nb, j->k, nvalid, (uint8_t *)j->out + done * j->k * elem, j->out_dtype);
    }
}
#endif

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

int block_dequant_rows(const rg_block_weight *w, int64_t n, int64_t k, const int64_t *rows, int64_t n_rows, void *out,
                       int out_dtype, int nthreads) {
    const int fmt = rg_block_format(w);
    if (k % QK != 0 || fmt == FMT_BAD || (FMT_MIN_BYTES(fmt) && w->minv == NULL) || (FMT_SUPER(fmt) && k % 256 != 0) ||
        (out_dtype != 0 && out_dtype != 1))
        return -1;
    for (int64_t i = 0; i < n_rows; i++)
        if (rows[i] < 0 || rows[i] >= n) return -2;
    if (out_dtype == 1) {  /* the per-thread row buffers must be to be had */
        void *probe = malloc(sizeof(float) * (size_t)k);
        if (probe == NULL) return -1;
        free(probe);
    }
    dequant_job job = {w, fmt, k, rows, n_rows, out, out_dtype};
    const int threads = n_rows * k >= 65536 ? nthreads : 1;
#if defined(RG_AVX512) || defined(RG_AVX2)
    int whole = n_rows > 0 && rows[0] % NR == 0;  /* consecutive rows from a panel's first: by panels */
    for (int64_t i = 1; whole && i < n_rows; i++) whole = rows[i] == rows[0] + i;
    if (whole) {
        const int64_t first = rows[0] / NR, last = (rows[0] + n_rows - 1) / NR;
        rg_parallel(threads, last + 1 - first, RG_STATIC, dequant_panels, &job);
        return 0;
    }
#endif
    rg_parallel(threads, n_rows, RG_STATIC, dequant_range, &job);
    return 0;
}
