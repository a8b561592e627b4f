/* The block GEMM (block_gemm.c) on AMX int8 tiles, for many activation rows: the same integer sums of the
 * same activation limbs (1 to 3, quantize_rows), combined by the same float operations, so a row's result is
 * the same bits on the tiles as on the vector path, and does not depend on how many rows share its step.
 *
 * A tile product TDPBSUD sums signed bytes times unsigned bytes into int32: C[16, 16] += A[16, 32] B[32, 16],
 * A one limb of 16 activation rows' block (32 int8), B a panel's block of 32 weights for its 16 output rows,
 * unsigned as the vector path reads them (weights16: the bytes vpdpbusd multiplies, 4 k per dword, which is
 * the tile's own layout). Each result tile then holds, for 16 rows, the sums the vector path's vpdpbusd
 * chains hold (for the offset formats in one or two limbs, B holds q - offset and TDPBSSD yields the same
 * integers: SIGNED_TILES), and the epilogue (fold_block) is the vector path's, operation for operation.
 * Half-block formats (Q6_K, Q2_K/Q3_K: a scale per 16 weights) take two half products (A [16, 16],
 * B [16, 16]) per block and limb.
 *
 * Work: panels (16 output rows) over the kernels' threads; a thread unpacks its panel's blocks to B tiles
 * and float scales once, then for each 16-row activation tile runs the blocks in order, block b + 1's tile
 * products issued before block b's epilogue (two sets of result tiles), the 16 rows' sums in registers. The
 * activations are first copied into one record per tile and block (limb tiles, then the rows' scales and
 * sums): 64-byte aligned tile rows (loads across cache lines are slow), and the epilogue's scalars in two
 * cache lines instead of 16 rows' blocks. Per block the work is bound by the epilogue (~8 vector operations
 * per 16 sums), not by the tile products; the AMX and AVX-512 parts do not overlap on the cores measured.
 * Linux lends AMX state to a process on request (arch_prctl ARCH_REQ_XCOMP_PERM); when it refuses,
 * block_gemm keeps its vector path.
 */
#include <stdint.h>
#include <string.h>

#include "activation_blocks.h"
#include "amx_gemm.h"
#include "block_unpack.h"
#include "scratch.h"
#include "thread_pool.h"

#ifdef RG_AMX
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NR 16          /* output rows per panel */
#define MT AMX_TILE_ROWS
#define A_BYTES 512    /* one limb of 16 rows' block: 16 x 32 int8 */
#define B_BYTES 512    /* a panel's block: 8 rows of 16 x 4 bytes */
#define C_BYTES 1024   /* a result tile: 16 x 16 int32 */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_permitted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void request_amx(void) {
    amx_permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int amx_ready(void) {
    pthread_once(&amx_once, request_amx);
    return amx_permitted;
}

/* Whether format fmt's B tiles hold signed weights q - offset in L limbs: the offset formats' in one or two
 * limbs, whose sums the vector path starts from the offset's share (xblock's off), an integer, so that
 * sum_k (q - offset) x_k is the same integer; in three limbs it adds the share in float (foff) after the
 * sums, which the epilogue does too. */
#define SIGNED_TILES(fmt, L) (xblock_offset(fmt) != 0 && (L) <= 2)

/* Tile registers: result tiles 0-5, a set (whole blocks: 0-2 and 3-5, the products of block b + 1 run while
 * block b's epilogue does) or a half block's (3 h + l) per limb l; then the A and B tiles of a whole block
 * (16 x 32 activation bytes, 8 x 64 weight bytes) or of a half block (16 x 16, 4 x 64). The intrinsics take
 * literal tile numbers. */
#define T_A 6
#define T_B 7

static void configure_tiles(int halves) {
    rg_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 6; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    cfg.rows[T_A] = 16, cfg.colsb[T_A] = (uint16_t)(QK / halves);
    cfg.rows[T_B] = (uint8_t)(QK / 4 / halves), cfg.colsb[T_B] = 64;
    _tile_loadconfig(&cfg);
}

typedef struct {
    int fmt, limbs;
    const rg_block_weight *w;
    const xblock *xq;
    uint8_t *atiles;   /* [tiles][nb] records of RECORD_BYTES(limbs, halves) */
    uint8_t *threads;  /* per thread (tid): per_thread bytes (panels_range) */
    size_t per_thread;
    int64_t M, nb, N;
    float *y;
} int8_job;

/* Activation tiles [begin, end) in records per tile and block: each limb's A tile [16][32] int8, then the 16
 * rows' scales s, then per scale of the block (halves) the rows' sums or offsets (xblock's union, as stored):
 * what a block's tile products and epilogue read, contiguous. */
#define RECORD_BYTES(L, halves) ((L) * A_BYTES + 64 * (1 + (halves)))

static void tile_rows(void *job, int64_t begin, int64_t end, int tid) {
    const int8_job *j = (const int8_job *)job;
    const int L = j->limbs, halves = FMT_HALVES(j->fmt);
    (void)tid;
    for (int64_t t = begin; t < end; t++)
        for (int64_t b = 0; b < j->nb; b++) {
            uint8_t *rec = j->atiles + (t * j->nb + b) * RECORD_BYTES(L, halves);
            float *scale = (float *)(rec + L * A_BYTES);
            for (int r = 0; r < MT; r++) {
                const xblock *x = xblock_at(j->xq, (t * MT + r) * j->nb + b, L);
                for (int l = 0; l < L; l++) memcpy(rec + l * A_BYTES + 32 * r, x->q[l], QK);
                scale[r] = x->s;
                for (int h = 0; h < halves; h++) memcpy(scale + 16 * (1 + h) + r, &x->sum[h], 4);
            }
        }
}

/* acc[r] += a block's products for the 16 rows of an activation tile (its record rec), from its result tiles
 * cb ([half][limb][16][16] int32) and the panel's scales d, m ([half][16]): block_gemm.c's rows_block epilogue,
 * operation for operation. */
static inline __attribute__((always_inline)) void fold_block(const int fmt, const int L, const int32_t *cb,
                                                              const float *d, const float *m, const uint8_t *rec,
                                                              __m512 *acc) {
    const int halves = FMT_HALVES(fmt);
    const float *scale = (const float *)(rec + L * A_BYTES), *sum = scale + 16;  /* sum: the union's bits */
    const __m512 c1 = _mm512_set1_ps(C1), c2 = _mm512_set1_ps(C2);
    /* 254 a0 by vpmulld, one instruction where the vector path's times_base is three: there the shifts keep the
     * multiplier pipe to vpdpbusd; here no dot product is in the vector pipes and the epilogue is the bound */
    const __m512i base = _mm512_set1_epi32((int32_t)LIMB_BASE);
    for (int r = 0; r < MT; r++) {
        for (int h = 0; h < halves; h++) {
            __m512i a[LIMBS];
            for (int l = 0; l < L; l++) a[l] = _mm512_load_si512(cb + ((h * L + l) * MT + r) * NR);
            __m512 v = _mm512_cvtepi32_ps(L == 2 ? _mm512_add_epi32(_mm512_mullo_epi32(a[0], base), a[1]) : a[0]);
            if (L > 2) {
                v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[1]), c1, v);
                v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[2]), c2, v);
                if (xblock_offset(fmt)) v = _mm512_add_ps(v, _mm512_set1_ps(sum[16 * h + r]));  /* foff */
            }
            acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(_mm512_load_ps(d + 16 * h), _mm512_set1_ps(scale[r])), acc[r]);
            if (xblock_sums(fmt))
                acc[r] = _mm512_fmadd_ps(_mm512_load_ps(m + 16 * h), _mm512_set1_ps(sum[16 * h + r]), acc[r]);
        }
    }
}

/* C += A B for signed activation bytes and weight bytes signed (S) or unsigned. */
#define PRODUCT(S, C)                                                                \
    do {                                                                             \
        if (S) _tile_dpbssd(C, T_A, T_B);                                            \
        else _tile_dpbsud(C, T_A, T_B);                                              \
    } while (0)

/* Products of one block (whole or half h: its activation record `rec` and B tile `bt` at that half) for each
 * limb l into result tile C<l>, the literal tile numbers of a set (0 1 2 or 3 4 5); S: signed weights. */
#define PRODUCTS(C0, C1, C2, S, L, bt, rec)                                          \
    do {                                                                             \
        _tile_loadd(T_B, (bt), 64);                                                  \
        _tile_zero(C0);                                                              \
        _tile_loadd(T_A, (rec), 32);                                                 \
        PRODUCT(S, C0);                                                              \
        if ((L) > 1) {                                                               \
            _tile_zero(C1);                                                          \
            _tile_loadd(T_A, (rec) + A_BYTES, 32);                                   \
            PRODUCT(S, C1);                                                          \
        }                                                                            \
        if ((L) > 2) {                                                               \
            _tile_zero(C2);                                                          \
            _tile_loadd(T_A, (rec) + 2 * A_BYTES, 32);                               \
            PRODUCT(S, C2);                                                          \
        }                                                                            \
    } while (0)

/* Result tiles C<l> to cb [limb][16][16]. */
#define STORE(C0, C1, C2, L, cb)                                                     \
    do {                                                                             \
        _tile_stored(C0, (cb), 64);                                                  \
        if ((L) > 1) _tile_stored(C1, (cb) + MT * NR, 64);                           \
        if ((L) > 2) _tile_stored(C2, (cb) + 2 * MT * NR, 64);                       \
    } while (0)

/* One panel (its B tiles bt, scales d and m) against activation tile t: y's columns [0, nvalid) of its rows. */
static inline __attribute__((always_inline)) void panel_tile(const int fmt, const int L, const int8_job *j,
                                                              const int8_t *bt, const float *d, const float *m,
                                                              int32_t *cbuf, int64_t t, float *y, int64_t nvalid) {
    const int halves = FMT_HALVES(fmt);
    const int64_t nb = j->nb, scales = 16 * halves, rec_bytes = RECORD_BYTES(L, halves);
    const int rows = (int)(j->M - t * MT < MT ? j->M - t * MT : MT);
    const uint8_t *recs = j->atiles + t * nb * rec_bytes;
    int32_t *cb0 = cbuf, *cb1 = cbuf + 3 * MT * NR;
    __m512 acc[MT];
    for (int r = 0; r < MT; r++) acc[r] = _mm512_setzero_ps();
#define FOLD(cb, b) fold_block(fmt, L, cb, d + (b) * scales, m + (b) * scales, recs + (b) * rec_bytes, acc)
    if (halves == 1) {  /* block b + 1's products run while block b's epilogue does */
        for (int64_t b = 0; b < nb; b += 2) {
            PRODUCTS(0, 1, 2, SIGNED_TILES(fmt, L), L, bt + b * B_BYTES, recs + b * rec_bytes);
            if (b > 0) FOLD(cb1, b - 1);
            STORE(0, 1, 2, L, cb0);
            if (b + 1 == nb) {
                FOLD(cb0, b);
                break;
            }
            PRODUCTS(3, 4, 5, SIGNED_TILES(fmt, L), L, bt + (b + 1) * B_BYTES, recs + (b + 1) * rec_bytes);
            FOLD(cb0, b);
            STORE(3, 4, 5, L, cb1);
            if (b + 2 == nb) FOLD(cb1, b + 1);
        }
    } else {  /* half h's limbs into tiles 3 h + l, stored as [half][limb] */
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *bb = bt + b * B_BYTES;
            const uint8_t *rb = recs + b * rec_bytes;
            PRODUCTS(0, 1, 2, SIGNED_TILES(fmt, L), L, bb, rb);
            PRODUCTS(3, 4, 5, SIGNED_TILES(fmt, L), L, bb + 256, rb + 16);
            STORE(0, 1, 2, L, cb0);
            STORE(3, 4, 5, L, cb0 + L * MT * NR);
            FOLD(cb0, b);
        }
    }
#undef FOLD
    const __mmask16 keep = (__mmask16)((1u << nvalid) - 1u);
    for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(y + (t * MT + r) * j->N, keep, acc[r]);
}

/* Panels [begin, end) against every activation tile, on thread tid, for format fmt in L limbs. */
static inline __attribute__((always_inline)) void run_panels(const int fmt, const int L, const int8_job *j,
                                                              int64_t begin, int64_t end, int tid) {
    const int halves = FMT_HALVES(fmt);
    const int64_t nb = j->nb, tiles = (j->M + MT - 1) / MT, scales = 16 * halves;
    /* this thread's B tiles [nb][512], scales and mins [nb][halves][16] float, result tiles [2][3][16][16] */
    uint8_t *mine = j->threads + j->per_thread * (size_t)tid;
    int8_t *bt = (int8_t *)mine;
    float *d = (float *)(mine + nb * B_BYTES), *m = d + nb * scales;
    int32_t *cbuf = (int32_t *)(m + nb * scales);
    configure_tiles(halves);
    for (int64_t p = begin; p < end; p++) {
        const rg_panel v = rg_panel_of(fmt, j->w, nb, p);
        for (int64_t b = 0; b < nb; b++) {
            __m512i w[8];
            __m512 db[2], mb[2];
            weights16(fmt, v.qs + b * FMT_BLOCK_BYTES(fmt), w);
            if (SIGNED_TILES(fmt, L))
                for (int g = 0; g < 8; g++) w[g] = _mm512_sub_epi8(w[g], _mm512_set1_epi8((char)xblock_offset(fmt)));
            for (int g = 0; g < 8; g++) _mm512_store_si512(bt + b * B_BYTES + 64 * g, w[g]);
            scales16(fmt, &v, b, db, mb);
            for (int h = 0; h < halves; h++) {
                _mm512_store_ps(d + b * scales + 16 * h, db[h]);
                _mm512_store_ps(m + b * scales + 16 * h, mb[h]);
            }
        }
        const int64_t nvalid = j->N - p * NR < NR ? j->N - p * NR : NR;
        for (int64_t t = 0; t < tiles; t++) panel_tile(fmt, L, j, bt, d, m, cbuf, t, j->y + p * NR, nvalid);
    }
    _tile_release();
}

static void panels_range(void *job, int64_t begin, int64_t end, int tid) {
    const int8_job *j = (const int8_job *)job;
#define FORMAT(F)                                                                          \
    case F:                                                                                \
        if (j->limbs == 1) run_panels(F, 1, j, begin, end, tid);                           \
        else if (j->limbs == 2) run_panels(F, 2, j, begin, end, tid);                      \
        else run_panels(F, 3, j, begin, end, tid);                                         \
        return;
    switch (j->fmt) {
        FORMAT(FMT_U4H) FORMAT(FMT_I8H) FORMAT(FMT_U4F) FORMAT(FMT_U8F) FORMAT(FMT_U8F2) FORMAT(FMT_K4)
        FORMAT(FMT_K6) FORMAT(FMT_U5H) FORMAT(FMT_U5F) FORMAT(FMT_O4H) FORMAT(FMT_O5H)
    }
#undef FORMAT
}

int amx_block_gemm(const rg_block_weight *w, const xblock *xq, int64_t M, int64_t K, int64_t N, float *y, int limbs,
                   int nthreads) {
    const int fmt = rg_block_format(w);
    if (limbs < 1 || limbs > LIMBS || fmt == FMT_BAD || K % QK != 0 || M < 1 || !amx_ready()) return -1;
    const int64_t nb = K / QK, tiles = (M + MT - 1) / MT, panels = (N + NR - 1) / NR;
    const size_t per_thread = (size_t)nb * (B_BYTES + 2 * 4 * 16 * (size_t)FMT_HALVES(fmt)) + 6 * C_BYTES;
    uint8_t *atiles = (uint8_t *)rg_scratch(RG_SCRATCH_AMX_LIMBS,
                                            (size_t)(tiles * nb * RECORD_BYTES(limbs, FMT_HALVES(fmt))));
    const size_t team = (size_t)(nthreads > 1 ? nthreads : 1);
    uint8_t *threads = (uint8_t *)rg_scratch(RG_SCRATCH_AMX_THREADS, per_thread * team);
    if (atiles == NULL || threads == NULL) return -1;
    int8_job job = {fmt, limbs, w, xq, atiles, threads, per_thread, M, nb, N, y};
    rg_parallel(M * K >= 65536 ? nthreads : 1, tiles, RG_STATIC, tile_rows, &job);
    rg_parallel(nthreads, panels, RG_GUIDED, panels_range, &job);
    return 0;
}
#else
int amx_ready(void) { return 0; }

int amx_block_gemm(const rg_block_weight *w, const xblock *xq, int64_t M, int64_t K, int64_t N, float *y, int limbs,
                   int nthreads) {
    (void)w, (void)xq, (void)M, (void)K, (void)N, (void)y, (void)limbs, (void)nthreads;
    return -1;
}
#endif
