/* The wide steps' bfloat16 GEMM on AMX tiles (wide_matmul_dtype bfloat16): y[M, N] = bf16(x)[M, K] @
 * bf16(W)^T with float32 sums, W in GGUF blocks (block_gemm.c's panel layout, any block_format.h format).
 * Each weight is rounded as block_dequant_rows rounds it (scale * q + min in float32, then to the nearest
 * bfloat16), each activation to the nearest bfloat16: the factors of the bfloat16 slices' GEMMs
 * (`wide_linear`), with float32 sums and outputs where those round each output to bfloat16.
 *
 * With the scales inside the weights, a result tile sums a row's whole K and is stored once: no per-block
 * epilogue, which bounds the integer tiles (amx_gemm.c) at many rows. The price is the bfloat16 rounding of
 * both factors, which the integer paths do not have.
 *
 * Work: M in chunks of CHUNK rows; in a chunk, pairs of 16-row weight panels over the kernels' threads, and
 * K in passes whose A tiles (PASS_BYTES) stay in L2 while a thread's pairs pass. Per pass, a thread
 * dequantizes each pair's blocks straight into B tiles (no row-major copy), then for each pair of
 * activation tiles runs 2 x 2 result tiles over the pass (per 32 k: 4 tile loads, 4 products) and stores
 * them into y (later passes load them back first).
 */
#include <stdint.h>
#include <string.h>

#include "amx_gemm.h"
#include "block_format.h"
#include "block_unpack.h"
#include "scratch.h"
#include "simd_math.h"
#include "thread_pool.h"

#pragma GCC optimize("fp-contract=off") /* scale * q + min as block_dequant.c computes it: no FMA */

#ifdef RG_AMX

#define QK 32
#define NR 16
#define MT AMX_TILE_ROWS
#define CHUNK 256      /* activation rows a weight pair's B tiles serve before the next chunk */
#define PASS_BYTES (512 << 10) /* a chunk's A tiles of one pass over K (L2 holds them while the pairs pass) */
#define TILE_ELEMS 512 /* bfloat16 values of one A or B tile: 16 rows of 64 bytes */

/* x [rows, K] float32 -> A tiles [rows_pad / 16][K / 32][16][32] bfloat16, rounded to nearest even; the rows
 * past `rows` zero. */
typedef struct {
    const float *x;
    int64_t rows, K;
    uint16_t *tiles;
} round_job;

static void round_range(void *job, int64_t begin, int64_t end, int tid) {
    const round_job *j = (const round_job *)job;
    const int64_t nb = j->K / QK;
    (void)tid;
    for (int64_t i = begin; i < end; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *src = j->x + i * j->K + b * QK;
            const __m512i bf = i < j->rows
                                   ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src))
                                   : _mm512_setzero_si512();
            _mm512_store_si512(j->tiles + ((i / MT * nb + b) * MT + i % MT) * QK, bf);
        }
}

/* Block b of panel v as a B tile out[16][16][2]: out[i][c] holds row c's weights at k = 2i, 2i + 1, each
 * scale * q + min in float32 rounded to the nearest bfloat16 (block_dequant.c's values). Group vector g
 * holds row c's q at k = 4g .. 4g + 3 in its dword c: tile row 2g takes its bytes 0, 1 and row 2g + 1 its
 * bytes 2, 3. */
static inline __attribute__((always_inline)) void weight_tile(const int fmt, const rg_panel *v, int64_t b,
                                                               uint16_t *out) {
    /* words (c, 16 + c) side by side: a row's pair from the two converted vectors */
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 d[2], m[2];
    scales16(fmt, v, b, d, m);
    __m512i w[8];
    weights16(fmt, v->qs + b * FMT_BLOCK_BYTES(fmt), w);
    for (int g = 0; g < 8; g++) {
        const int h = FMT_HALVES(fmt) == 2 ? g / 4 : 0;
        __m512 f[4];
        for (int t = 0; t < 4; t++) {
            __m512i q = _mm512_and_si512(_mm512_srli_epi32(w[g], 8 * t), _mm512_set1_epi32(255));
            if (fmt == FMT_I8H) q = _mm512_sub_epi32(q, _mm512_set1_epi32(128));
            f[t] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d[h]);
            if (FMT_HAS_MIN(fmt)) f[t] = _mm512_add_ps(f[t], m[h]);
        }
        for (int s = 0; s < 2; s++) {
            const __m512i bf = (__m512i)_mm512_cvtne2ps_pbh(f[2 * s + 1], f[2 * s]);
            _mm512_store_si512(out + (2 * g + s) * 32, _mm512_permutexvar_epi16(pairs, bf));
        }
    }
}

/* Blocks b0 .. b0 + n - 1 of panel p as B tiles [n][16][16][2]. */
static void weight_tiles(int fmt, const rg_block_weight *w, int64_t nb, int64_t p, int64_t b0, int64_t n,
                         uint16_t *out) {
    const rg_panel v = rg_panel_of(fmt, w, nb, p);
#define FOR_FORMAT(F) \
    case F:           \
        for (int64_t b = 0; b < n; b++) weight_tile(F, &v, b0 + b, out + b * TILE_ELEMS); \
        return;
    switch (fmt) {
        FOR_FORMAT(FMT_U4H) FOR_FORMAT(FMT_I8H) FOR_FORMAT(FMT_U4F) FOR_FORMAT(FMT_U8F) FOR_FORMAT(FMT_U8F2)
        FOR_FORMAT(FMT_K4) FOR_FORMAT(FMT_K6) FOR_FORMAT(FMT_U5H) FOR_FORMAT(FMT_U5F) FOR_FORMAT(FMT_O4H)
        FOR_FORMAT(FMT_O5H)
    }
#undef FOR_FORMAT
}

typedef struct {
    int fmt;
    const rg_block_weight *w;
    const uint16_t *atiles; /* the chunk's A tiles */
    int64_t rows, nb, N, panels;
    int64_t kc;             /* blocks of K a pass takes (their A tiles stay in L2 while the pairs pass) */
    uint8_t *scratch;       /* per thread: B tiles of a pair's kc blocks, then a result tile */
    size_t per_thread;
    float *y;               /* the chunk's first row */
} pairs_job;

/* Result tile `tile` (activation tile t by panel p) from y, the sums of the earlier passes over K: where
 * whole straight from y, else through cbuf (the lanes outside y left as they are: a result lane depends on
 * its own row and column alone, and those are never stored). */
static void load_tile(const pairs_job *j, int tile, int64_t t, int64_t p, float *cbuf) {
    const int64_t row = t * MT, col = p * NR;
    const int64_t nrows = j->rows - row < MT ? j->rows - row : MT, ncols = j->N - col < NR ? j->N - col : NR;
    const float *src = j->y + row * j->N + col;
    int64_t stride = j->N * 4;
    if (nrows < MT || ncols < NR) {
        for (int64_t r = 0; r < nrows; r++) memcpy(cbuf + r * NR, src + r * j->N, sizeof(float) * (size_t)ncols);
        src = cbuf;
        stride = 64;
    }
    switch (tile) {
        case T_C00: _tile_loadd(T_C00, src, stride); return;
        case T_C01: _tile_loadd(T_C01, src, stride); return;
        case T_C10: _tile_loadd(T_C10, src, stride); return;
        default: _tile_loadd(T_C11, src, stride); return;
    }
}

/* Result tile `tile`, activation tile t by panel p: into y where whole, else through cbuf. */
static void store_tile(const pairs_job *j, int tile, int64_t t, int64_t p, float *cbuf) {
    const int64_t row = t * MT, col = p * NR;
    const int64_t nrows = j->rows - row < MT ? j->rows - row : MT, ncols = j->N - col < NR ? j->N - col : NR;
    if (nrows == MT && ncols == NR) {
        switch (tile) {
            case T_C00: _tile_stored(T_C00, j->y + row * j->N + col, j->N * 4); return;
            case T_C01: _tile_stored(T_C01, j->y + row * j->N + col, j->N * 4); return;
            case T_C10: _tile_stored(T_C10, j->y + row * j->N + col, j->N * 4); return;
            default: _tile_stored(T_C11, j->y + row * j->N + col, j->N * 4); return;
        }
    }
    switch (tile) {
        case T_C00: _tile_stored(T_C00, cbuf, 64); break;
        case T_C01: _tile_stored(T_C01, cbuf, 64); break;
        case T_C10: _tile_stored(T_C10, cbuf, 64); break;
        default: _tile_stored(T_C11, cbuf, 64); break;
    }
    for (int64_t r = 0; r < nrows; r++)
        memcpy(j->y + (row + r) * j->N + col, cbuf + r * NR, sizeof(float) * (size_t)ncols);
}

/* The thread's pairs of panels, K a pass of kc blocks at a time: per pass and pair, the pair's blocks
 * to B tiles, then 2 x 2 result tiles (zeroed on the first pass, else loaded from y) per pair of
 * activation tiles over the pass's blocks, stored into y. */
static void pairs_range(void *job, int64_t begin, int64_t end, int tid) {
    const pairs_job *j = (const pairs_job *)job;
    const int64_t nb = j->nb, kc = j->kc, tiles = (j->rows + MT - 1) / MT;
    uint16_t *btiles = (uint16_t *)(j->scratch + j->per_thread * (size_t)tid), *b1tiles = btiles + kc * TILE_ELEMS;
    float *cbuf = (float *)(btiles + 2 * kc * TILE_ELEMS);
    rg_configure_bf16_tiles();
    for (int64_t k0 = 0; k0 < nb; k0 += kc) {
        const int64_t kn = nb - k0 < kc ? nb - k0 : kc;
        for (int64_t pair = begin; pair < end; pair++) {
            const int64_t p0 = 2 * pair, two_panels = p0 + 1 < j->panels;
            weight_tiles(j->fmt, j->w, nb, p0, k0, kn, btiles);
            weight_tiles(j->fmt, j->w, nb, two_panels ? p0 + 1 : p0, k0, kn, b1tiles);
            for (int64_t t = 0; t < tiles; t += 2) {
                const int two = t + 1 < tiles;
                const uint16_t *a0 = j->atiles + (t * nb + k0) * TILE_ELEMS, *a1 = a0 + nb * TILE_ELEMS;
                if (k0 == 0) {
                    _tile_zero(T_C00);
                    _tile_zero(T_C01);
                    _tile_zero(T_C10);
                    _tile_zero(T_C11);
                } else {
                    load_tile(j, T_C00, t, p0, cbuf);
                    if (two_panels) load_tile(j, T_C01, t, p0 + 1, cbuf);
                    if (two) {
                        load_tile(j, T_C10, t + 1, p0, cbuf);
                        if (two_panels) load_tile(j, T_C11, t + 1, p0 + 1, cbuf);
                    }
                }
                for (int64_t b = 0; b < kn; b++) {
                    _tile_loadd(T_B0, btiles + b * TILE_ELEMS, 64);
                    _tile_loadd(T_B1, b1tiles + b * TILE_ELEMS, 64);
                    _tile_loadd(T_A0, a0 + b * TILE_ELEMS, 64);
                    _tile_dpbf16ps(T_C00, T_A0, T_B0);
                    _tile_dpbf16ps(T_C01, T_A0, T_B1);
                    if (two) {
                        _tile_loadd(T_A1, a1 + b * TILE_ELEMS, 64);
                        _tile_dpbf16ps(T_C10, T_A1, T_B0);
                        _tile_dpbf16ps(T_C11, T_A1, T_B1);
                    }
                }
                store_tile(j, T_C00, t, p0, cbuf);
                if (two_panels) store_tile(j, T_C01, t, p0 + 1, cbuf);
                if (two) {
                    store_tile(j, T_C10, t + 1, p0, cbuf);
                    if (two_panels) store_tile(j, T_C11, t + 1, p0 + 1, cbuf);
                }
            }
        }
    }
    _tile_release();
}

int block_gemm_bf16(const rg_block_weight *w, const float *x, int64_t M, int64_t K, int64_t N, float *y, int nthreads) {
    const int fmt = rg_block_format(w);
    if (fmt == FMT_BAD || K % QK != 0 || (FMT_SUPER(fmt) && K % 256 != 0) || (FMT_MIN_BYTES(fmt) && w->minv == NULL) ||
        M < 1 || N < 1 || !amx_ready())
        return -1;
    const int64_t nb = K / QK, panels = (N + NR - 1) / NR, pairs = (panels + 1) / 2;
    const int64_t chunk = M < CHUNK ? M : CHUNK, chunk_pad = (chunk + MT - 1) / MT * MT;
    uint16_t *atiles = (uint16_t *)rg_scratch(RG_SCRATCH_AMX_LIMBS, (size_t)(chunk_pad * K) * 2);
    const int64_t kc_fit = PASS_BYTES / (chunk_pad * QK * 2), kc = kc_fit < 1 ? 1 : kc_fit < nb ? kc_fit : nb;
    const size_t per_thread = (size_t)(2 * kc * TILE_ELEMS) * 2 + MT * NR * 4;
    const size_t team = (size_t)(nthreads > 1 ? nthreads : 1);
    uint8_t *scratch = (uint8_t *)rg_scratch(RG_SCRATCH_AMX_THREADS, per_thread * team);
    if (atiles == NULL || scratch == NULL) return -1;
    for (int64_t i0 = 0; i0 < M; i0 += CHUNK) {
        const int64_t rows = M - i0 < CHUNK ? M - i0 : CHUNK, rows_pad = (rows + MT - 1) / MT * MT;
        round_job rj = {x + i0 * K, rows, K, atiles};
        rg_parallel(rows * K >= 65536 ? nthreads : 1, rows_pad, RG_STATIC, round_range, &rj);
        pairs_job job = {fmt, w, atiles, rows, nb, N, panels, kc, scratch, per_thread, y + i0 * N};
        rg_parallel(nthreads, pairs, RG_STATIC, pairs_range, &job);
    }
    return 0;
}

int block_gemm_bf16_available(void) { return amx_ready(); }
#else
int block_gemm_bf16(const rg_block_weight *w, const float *x, int64_t M, int64_t K, int64_t N, float *y, int nthreads) {
    (void)w, (void)x, (void)M, (void)K, (void)N, (void)y, (void)nthreads;
    return -1;
}

int block_gemm_bf16_available(void) { return 0; }
#endif
