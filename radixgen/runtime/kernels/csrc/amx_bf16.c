/* The block GEMM of block_gemm.c in float32's precision on AMX bfloat16 tiles, for the fp16 formats (Q4_0,
 * Q4_1, Q8_0) and many activation rows (wide decode batches, short prompts): y[M, N] = x[M, K] @ W^T, W in
 * GGUF blocks in block_gemm.c's panel layout. Its sums are float32 sums in the tiles' order, within
 * float32's rounding of the integer paths' (amx_gemm.c, block_gemm.c) but not the same bits; for these
 * formats it is the faster (amx_gemm.c's epilogue converts and combines three limbs' int32 sums per block,
 * this one adds one float tile).
 *
 * A tile product multiplies bfloat16 pairs into float32 sums (TDPBF16PS: C[16, 16] += A[16, 32] B[32, 16]).
 * Both factors are made exact in bfloat16:
 * - x is split into three bfloat16 limbs, x = hi + mid + lo exactly (each limb the top 8 significant
 *   bits of what the previous ones left: float32's 24 bits in three 8-bit pieces), and the three
 *   products accumulate into the same tile;
 * - the weights' small integers (Q4: 0..15, Q8: -128..127) are bfloat16 exactly.
 * So each tile holds sum_k q_k x_k for one 32-weight block as a float32 GEMM computes it (products
 * exact, float32 sums); the block's scale and min are applied in AVX-512 after each block
 * (y += d * C + m * sum_k x_k).
 *
 * Work: M in chunks of up to 128 rows (their limb tiles stay in L2); in a chunk, pairs of 16-row
 * weight panels over the kernels' threads (thread_pool.c). A thread unpacks its pair's blocks to bfloat16 B tiles once per
 * chunk (16 rows of k pairs, the panel rows' two values side by side), then for each block and pair
 * of 16-row activation tiles: 2 x 2 result tiles, each limb's 2 activation tiles loaded once for
 * both panels, 12 tile products, 4 tile stores folded into float32 accumulators. Tile rows must be
 * 64-byte aligned (a split row made loads several times slower).
 */
#include "amx_gemm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_format.h"
#include "scratch.h"
#include "simd_math.h"
#include "thread_pool.h"

#ifdef RG_AMX

#define QK 32
#define NR 16
#define MT AMX_TILE_ROWS
#define CHUNK 128       /* activation rows whose limbs stay in cache while the weights pass */
/* Tiles: amx_gemm.h's 2 x 2 blocking, the A tiles holding one limb of the 2 activation tiles. */

/* x [rows, K] float -> limbs as A tiles [rows_pad / 16][K / 32][3][16][32] bfloat16 (rows beyond
 * `rows` zero) and the block sums [rows_pad][K / 32]. hi keeps x's top 16 bits, mid the next 8
 * significant bits of the rest, lo the rest: each subtraction is exact and the last rest fits a
 * bfloat16, so hi + mid + lo == x. */
typedef struct {
    const float *x;
    int64_t rows, K;
    uint16_t *tiles;
    float *sums;
} split_job;

static void split_range(void *job, int64_t begin, int64_t end, int tid) {
    const split_job *j = (const split_job *)job;
    const int64_t K = j->K, nb = K / QK;
    (void)tid;
    for (int64_t i = begin; i < end; i++) {
        for (int64_t b = 0; b < nb; b++) {
            __m512 r[2], s = _mm512_setzero_ps();
            for (int h = 0; h < 2; h++) {
                r[h] = i < j->rows ? _mm512_loadu_ps(j->x + i * K + b * QK + 16 * h) : _mm512_setzero_ps();
                s = _mm512_add_ps(s, r[h]);
            }
            j->sums[i * nb + b] = _mm512_reduce_add_ps(s);
            uint16_t *tile = j->tiles + ((i / MT * nb + b) * 3 * MT + i % MT) * QK;  /* limb l at + l * MT * QK */
            for (int l = 0; l < 3; l++)
                for (int h = 0; h < 2; h++) {
                    const __m512i bits = _mm512_and_si512(_mm512_castps_si512(r[h]), _mm512_set1_epi32((int)0xFFFF0000u));
                    _mm256_storeu_si256((__m256i *)(tile + l * MT * QK + 16 * h),
                                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
                    r[h] = _mm512_sub_ps(r[h], _mm512_castsi512_ps(bits));
                }
        }
    }
}

static void split_rows(const float *x, int64_t rows, int64_t rows_pad, int64_t K, uint16_t *tiles, float *sums,
                       int nthreads) {
    split_job job = {x, rows, K, tiles, sums};
    rg_parallel(rows * K >= 65536 ? nthreads : 1, rows_pad, RG_STATIC, split_range, &job);
}

/* bfloat16 of q = 0..15 (exact), split in bytes for vpshufb lookups */
#define BF16_LO_BYTES 0x00, 0x80, 0x00, 0x40, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70
#define BF16_HI_BYTES 0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41

/* One 16-row panel's blocks as B tiles: out[b][i][c][2] = bf16(q[c][k = 32 b + 2 i + {0, 1}]). The
 * dword lane of row c in a 64-byte group vector holds q at k = 4g .. 4g + 3; tile row 2g takes bytes
 * 0, 1 and row 2g + 1 bytes 2, 3, each widened to a bfloat16 (4-bit: by table lookup; 8-bit: the high
 * half of its float). */
static void unpack_panel(int bits, const uint8_t *qs, int64_t nb, uint16_t *out) {
    const __m512i lut_lo = _mm512_broadcast_i32x4(_mm_setr_epi8(BF16_LO_BYTES));
    const __m512i lut_hi = _mm512_broadcast_i32x4(_mm_setr_epi8(BF16_HI_BYTES));
    /* per dword: bytes (0, 0, 1, 1) for row 2g, (2, 2, 3, 3) for row 2g + 1 */
    const __m512i pick[2] = {
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 1, 1, 4, 4, 5, 5, 8, 8, 9, 9, 12, 12, 13, 13)),
        _mm512_broadcast_i32x4(_mm_setr_epi8(2, 2, 3, 3, 6, 6, 7, 7, 10, 10, 11, 11, 14, 14, 15, 15))};
    for (int64_t b = 0; b < nb; b++) {
        for (int g = 0; g < 8; g++) {
            __m512i v;
            if (bits == 4) {
                const __m512i packed = _mm512_loadu_si512(qs + b * 256 + 64 * (g & 3));
                v = _mm512_and_si512(g < 4 ? packed : _mm512_srli_epi16(packed, 4), _mm512_set1_epi8(15));
            } else {
                v = _mm512_loadu_si512(qs + b * 512 + 64 * g);
            }
            for (int half = 0; half < 2; half++) {
                __m512i pair;
                if (bits == 4) {
                    const __m512i idx = _mm512_shuffle_epi8(v, pick[half]);
                    pair = _mm512_mask_blend_epi8((__mmask64)0xAAAAAAAAAAAAAAAAull, _mm512_shuffle_epi8(lut_lo, idx),
                                                  _mm512_shuffle_epi8(lut_hi, idx));
                } else {  /* bytes 2 half and 2 half + 1, sign-extended, to floats */
                    const __m512i q0 = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 16 * half), 24);
                    const __m512i q1 = _mm512_srai_epi32(_mm512_slli_epi32(v, 16 - 16 * half), 24);
                    const __m512i f0 = _mm512_castps_si512(_mm512_cvtepi32_ps(q0));
                    const __m512i f1 = _mm512_castps_si512(_mm512_cvtepi32_ps(q1));
                    /* low 16 bits: bf16 of q0; high 16 bits: bf16 of q1 (f0 >> 16 | f1 & 0xFFFF0000) */
                    pair = _mm512_ternarylogic_epi32(_mm512_srli_epi32(f0, 16), f1, _mm512_set1_epi32((int)0xFFFF0000u),
                                                     0xF8);
                }
                _mm512_storeu_si512(out + (b * 16 + 2 * g + half) * 32, pair);
            }
        }
    }
}

typedef struct {
    int bits;
    const uint8_t *qs;
    const uint16_t *d16, *m16;
    int64_t nb, panels, panel_bytes, N;
    const uint16_t *limbs;
    const float *sums;
    int64_t rows, rows_pad;
    uint8_t *scratch;
    size_t per_thread;
    float *y;  /* the chunk's first output row */
} pairs_job;

/* Pairs of weight panels [begin, end) against the chunk's activation tiles, on thread tid. */
static void pairs_range(void *job, int64_t begin, int64_t end, int tid) {
    const pairs_job *pj = (const pairs_job *)job;
    const int bits = pj->bits;
    const uint8_t *qs = pj->qs;
    const uint16_t *d16 = pj->d16, *m16 = pj->m16, *limbs = pj->limbs;
    const float *sums = pj->sums;
    const int64_t nb = pj->nb, panels = pj->panels, panel_bytes = pj->panel_bytes, N = pj->N, rows = pj->rows;
    const int64_t rows_pad = pj->rows_pad, tiles = rows_pad / MT;
    uint8_t *mine = pj->scratch + pj->per_thread * (size_t)tid;
    uint16_t *btiles = (uint16_t *)mine;
    float *cbuf = (float *)(mine + 2 * nb * 1024), *acc = cbuf + 4 * 256;  /* cbuf: [tile][panel][16][16] */
    rg_configure_bf16_tiles();
    for (int64_t pair = begin; pair < end; pair++) {
        const int64_t p0 = 2 * pair;
        /* a missing second panel multiplies zeros (its tiles are unpacked from a zero panel) */
        const int np = p0 + 1 < panels ? 2 : 1;
        for (int j = 0; j < np; j++) unpack_panel(bits, qs + (p0 + j) * panel_bytes, nb, btiles + j * nb * 512);
        if (np == 1) memset(btiles + nb * 512, 0, (size_t)nb * 1024);
        memset(acc, 0, sizeof(float) * (size_t)rows_pad * 32);
        /* the next pair's weights, a block of each panel per block here: they arrive while the tiles multiply */
        const int64_t next = pair + 1 < end ? 2 * (pair + 1) : -1, block_bytes = panel_bytes / nb;
        for (int64_t b = 0; b < nb; b++) {
            if (next >= 0)
                for (int64_t p = next; p < next + 2 && p < panels; p++) {
                    const uint8_t *nq = qs + p * panel_bytes + b * block_bytes;
                    for (int64_t off = 0; off < block_bytes; off += 64) __builtin_prefetch(nq + off);
                    if (b % 2 == 0) {
                        __builtin_prefetch(d16 + (p * nb + b) * NR);
                        if (bits == 4) __builtin_prefetch(m16 + (p * nb + b) * NR);
                    }
                }
            _tile_loadd(T_B0, btiles + b * 512, 64);
            _tile_loadd(T_B1, btiles + (nb + b) * 512, 64);
            __m512 d[2], m[2];
            for (int j = 0; j < 2; j++) {
                const int64_t off = ((p0 + (j < np ? j : 0)) * nb + b) * NR;
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d16 + off)));
                m[j] = bits == 4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m16 + off)))
                                 : _mm512_setzero_ps();
            }
            for (int64_t t = 0; t < tiles; t += 2) {
                const int two = t + 1 < tiles;  /* a second activation tile */
                const uint16_t *a0 = limbs + (t * nb + b) * 3 * MT * QK;
                const uint16_t *a1 = a0 + nb * 3 * MT * QK;
                _tile_zero(T_C00);
                _tile_zero(T_C01);
                if (two) {
                    _tile_zero(T_C10);
                    _tile_zero(T_C11);
                }
                for (int l = 0; l < 3; l++) {
                    _tile_loadd(T_A0, a0 + l * MT * QK, 64);
                    _tile_dpbf16ps(T_C00, T_A0, T_B0);
                    _tile_dpbf16ps(T_C01, T_A0, T_B1);
                    if (two) {
                        _tile_loadd(T_A1, a1 + l * MT * QK, 64);
                        _tile_dpbf16ps(T_C10, T_A1, T_B0);
                        _tile_dpbf16ps(T_C11, T_A1, T_B1);
                    }
                }
                _tile_stored(T_C00, cbuf, 64);
                _tile_stored(T_C01, cbuf + 256, 64);
                if (two) {
                    _tile_stored(T_C10, cbuf + 512, 64);
                    _tile_stored(T_C11, cbuf + 768, 64);
                }
                for (int i = 0; i <= two; i++)
                    for (int r = 0; r < MT; r++) {
                        const int64_t row = (t + i) * MT + r;
                        const __m512 s = _mm512_set1_ps(sums[row * nb + b]);
                        for (int j = 0; j < 2; j++) {
                            float *ar = acc + row * 32 + 16 * j;
                            __m512 v = _mm512_fmadd_ps(_mm512_load_ps(cbuf + (2 * i + j) * 256 + 16 * r), d[j],
                                                       _mm512_load_ps(ar));
                            if (bits == 4) v = _mm512_fmadd_ps(m[j], s, v);
                            _mm512_store_ps(ar, v);
                        }
                    }
            }
        }
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < np; j++) {
                const int64_t col = (p0 + j) * NR, cnt = N - col < NR ? N - col : NR;
                memcpy(pj->y + r * N + col, acc + r * 32 + 16 * j, sizeof(float) * (size_t)cnt);
            }
    }
    _tile_release();
}

int amx_bf16_gemm(const rg_block_weight *w, const float *x, int64_t M, int64_t K, int64_t N, float *y, int nthreads) {
    const int bits = (int)w->bits;
    /* fp16 formats (an offset format's min is read as stored) */
    if (K % QK != 0 || (bits != 4 && bits != 8) || (w->flags & ~RG_MIN_OFFSET) != 0 || !amx_ready()) return -1;
    const int64_t nb = K / QK, panels = (N + NR - 1) / NR, pairs = (panels + 1) / 2;
    const int64_t panel_bytes = nb * (bits == 4 ? 256 : 512);
    const int64_t chunk_rows = M < CHUNK ? M : CHUNK, chunk_pad = (chunk_rows + MT - 1) / MT * MT;
    const size_t limb_bytes = (size_t)(3 * chunk_pad * K) * 2;  /* a multiple of 64: K % 32 == 0 */
    uint16_t *limbs = (uint16_t *)rg_scratch(RG_SCRATCH_AMX_LIMBS, limb_bytes + (size_t)(chunk_pad * nb) * 4);
    /* per thread: the pair's B tiles [2][nb][16][32] bf16, four C tiles, accumulators [chunk_pad][32] */
    const size_t per_thread = (size_t)(2 * nb * 1024) + 4 * 1024 + (size_t)chunk_pad * 32 * 4;
    uint8_t *scratch = (uint8_t *)rg_scratch(RG_SCRATCH_AMX_THREADS, per_thread * (size_t)nthreads);
    if (limbs == NULL || scratch == NULL) return -1;
    float *sums = (float *)((uint8_t *)limbs + limb_bytes);
    const uint8_t *qs = (const uint8_t *)w->qs;
    const uint16_t *d16 = (const uint16_t *)w->scale, *m16 = (const uint16_t *)w->minv;
    for (int64_t i0 = 0; i0 < M; i0 += CHUNK) {
        const int64_t rows = M - i0 < CHUNK ? M - i0 : CHUNK, rows_pad = (rows + MT - 1) / MT * MT;
        split_rows(x + i0 * K, rows, rows_pad, K, limbs, sums, nthreads);
        pairs_job job = {bits, qs, d16, m16, nb, panels, panel_bytes, N, limbs, sums, rows, rows_pad, scratch,
                         per_thread, y + i0 * N};
        rg_parallel(nthreads, pairs, RG_STATIC, pairs_range, &job);
    }
    return 0;
}
#else
int amx_bf16_gemm(const rg_block_weight *w, const float *x, int64_t M, int64_t K, int64_t N, float *y, int nthreads) {
    (void)w, (void)x, (void)M, (void)K, (void)N, (void)y, (void)nthreads;
    return -1;
}
#endif
