/* Prompt (extend) attention in bfloat16 on CPU: each request's new queries attend causally to its
 * cached prefix and to its own new keys, K/V read in place through its req_to_token row.
 *
 * For long prompt chunks, whose GEMMs run in bfloat16 too (EngineConfig.wide_matmul_dtype): the
 * queries (times the scale), keys, values and softmax weights are rounded to bfloat16 and their
 * products summed in float32 by vdpbf16ps (AVX512-BF16: 32 multiply-adds per instruction, twice a
 * float32 FMA's); scores, softmax statistics and the output stay float32. Long prefill is mostly
 * attention (7,000 tokens of SmolLM2: 1.7 TFLOP of it against 1.5 of GEMMs).
 *
 * Per request, K and V are packed per KV head in the dot-product layout first (32-bit lanes holding
 * two bfloat16: K by blocks of 16 keys, a lane per key and a word per dimension pair; V by key pairs,
 * a lane per dimension). Then each work item (QT positions x the G query heads of one KV head) runs
 * flash attention over blocks of KB keys up to its causal limit: scores for 4 rows x 64 keys in
 * registers, the online softmax, and the weighted values for 4 rows x 64 dimensions in registers.
 * On AMX (head sizes a multiple of 32) the two products run on bfloat16 tiles instead, 16 rows at a time:
 * the packed K and V are already the tiles' B operands, the scores and the output pass through memory
 * (the softmax between them stays in AVX-512). Same roundings, float32 sums in another order.
 * A request's result depends on its own lengths alone, not on its batch-mates or the thread count.
 *
 * Sliding-window layers (window > 0) see only the `window` latest keys up to each query: a request's
 * keys are packed from the KB block holding the first key its first query sees (key_base), each tile
 * starts at the block holding its own first visible key, and keys before a row's window are masked.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "amx_gemm.h"
#include "radixgen_kernels.h"
#include "scratch.h"
#include "simd_math.h"
#include "thread_pool.h"

#ifdef RG_AVX512BF16
#define QT 8     /* query positions per work item */
#define KB 64    /* keys per block of the flash loop (4 vectors of scores per row) */
#define RB 4     /* query rows per register block */
#define MAX_D 256
#define MAX_G 16
#define TR 16    /* query rows per AMX tile */

typedef struct {
    const float *q;  /* [T, H, D]: the requests' rows in order, rows q_stride floats apart */
    int64_t q_stride;
    const void *k_buf, *v_buf;
    int kv;
    const int64_t *req_to_token, *rows, *prefix_lens, *extend_lens;
    int64_t table_stride, B, H, Hkv, D, window; /* window 0: every earlier key */
    float scale;
    const int64_t *q_first;    /* [B] each request's first row in q / out */
    const int64_t *pack_first; /* [B] each request's first packed word */
    const int64_t *key_base;   /* [B] each request's first packed key (a multiple of KB) */
    const int64_t *item_first; /* [B + 1] each request's first work item (of the running phase) */
    int amx;                   /* products on AMX bfloat16 tiles (else vdpbf16ps) */
    uint32_t *pack;
    float *out; /* [T, H, D] */
} extend_job;

static inline int64_t padded_keys(int64_t S) { return (S + KB - 1) / KB * KB; }

/* The first key position `pos` sees (0 without a window). */
static inline int64_t first_key(int64_t pos, int64_t window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* The first key packed for a request of prefix P: the KB block holding its first query's first key. */
static inline int64_t packed_from(int64_t P, int64_t window) { return first_key(P, window) / KB * KB; }

/* The request of work item `item` (item_first is ascending). */
static inline int64_t request_of(const extend_job *j, int64_t item) {
    int64_t b = 0;
    while (j->item_first[b + 1] <= item) b++;
    return b;
}

/* dst[0 .. D) = bfloat16 of the K or V head row at element base. */
static inline void row_bf16(const void *buf, int64_t base, int64_t D, int kv, uint16_t *dst) {
    for (int64_t d = 0; d < D; d += 16)
        _mm256_storeu_si256((__m256i *)(dst + d), (__m256i)_mm512_cvtneps_pbh(rg_kv_load16(buf, base + d, kv)));
}

/* Pack items (request, KV head, block of 16 keys from key_base): the block's K words [D/2][16] and V
 * words [8 key pairs][D/16][16]; keys past the request's end are zeros (their scores are masked). */
static void pack_items(void *job, int64_t begin, int64_t end, int tid) {
    const extend_job *j = (const extend_job *)job;
    const int64_t D = j->D, Hkv = j->Hkv, DP = D / 2, DB = D / 16, row = Hkv * D;
    uint16_t kr[16][MAX_D], vr[16][MAX_D];
    (void)tid;
    for (int64_t item = begin; item < end; item++) {
        const int64_t b = request_of(j, item), local = item - j->item_first[b];
        const int64_t S = j->prefix_lens[b] + j->extend_lens[b], base = j->key_base[b];
        const int64_t blocks = padded_keys(S - base) / 16, hkv = local / blocks, jb = local % blocks;
        const int64_t *slots = j->req_to_token + j->rows[b] * j->table_stride;
        for (int64_t l = 0; l < 16; l++) {
            const int64_t key = base + jb * 16 + l;
            if (key < S) {
                row_bf16(j->k_buf, slots[key] * row + hkv * D, D, j->kv, kr[l]);
                row_bf16(j->v_buf, slots[key] * row + hkv * D, D, j->kv, vr[l]);
            } else {
                memset(kr[l], 0, sizeof(uint16_t) * (size_t)D);
                memset(vr[l], 0, sizeof(uint16_t) * (size_t)D);
            }
        }
        uint32_t *kp = j->pack + j->pack_first[b] + (hkv * blocks + jb) * DP * 16;
        uint32_t *vp = j->pack + j->pack_first[b] + (Hkv + hkv) * blocks * DP * 16 + jb * DP * 16;
        for (int64_t p = 0; p < DP; p++)
            for (int64_t l = 0; l < 16; l++) kp[p * 16 + l] = kr[l][2 * p] | (uint32_t)kr[l][2 * p + 1] << 16;
        for (int64_t jp = 0; jp < 8; jp++)
            for (int64_t d = 0; d < D; d++)
                vp[(jp * DB + d / 16) * 16 + d % 16] = vr[2 * jp][d] | (uint32_t)vr[2 * jp + 1][d] << 16;
    }
}

static inline __m512bh pair_bcast(uint32_t w) { return (__m512bh)_mm512_set1_epi32((int)w); }

/* sc[r][0 .. KB) = scores of rows r < R4 (a multiple of RB) against one block of KB packed keys. */
static void block_scores(const uint32_t *qp, int64_t R4, const uint32_t *kp, int64_t DP, float *sc) {
    for (int64_t r0 = 0; r0 < R4; r0 += RB) {
        __m512 acc[RB][KB / 16];
        for (int i = 0; i < RB; i++)
            for (int c = 0; c < KB / 16; c++) acc[i][c] = _mm512_setzero_ps();
        for (int64_t p = 0; p < DP; p++) {
            __m512bh k[KB / 16];
            for (int c = 0; c < KB / 16; c++) k[c] = (__m512bh)_mm512_loadu_si512(kp + (c * DP + p) * 16);
            for (int i = 0; i < RB; i++) {
                const __m512bh qb = pair_bcast(qp[(r0 + i) * DP + p]);
                for (int c = 0; c < KB / 16; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], qb, k[c]);
            }
        }
        for (int i = 0; i < RB; i++)
            for (int c = 0; c < KB / 16; c++) _mm512_storeu_ps(sc + (r0 + i) * KB + c * 16, acc[i][c]);
    }
}

/* o[r][d0*16 ..] += sum over the block's keys of weights pw[r] x V, NC vectors of dims from d0. */
static inline __attribute__((always_inline)) void block_values_dims(const int NC, const uint32_t *pw, int64_t r0,
                                                                    const uint32_t *vp, int64_t DB, int64_t d0,
                                                                    int64_t D, float *o) {
    __m512 acc[RB][4];
    for (int i = 0; i < RB; i++)
        for (int c = 0; c < NC; c++) acc[i][c] = _mm512_loadu_ps(o + (r0 + i) * D + (d0 + c) * 16);
    for (int64_t jp = 0; jp < KB / 2; jp++) {
        __m512bh v[4];
        for (int c = 0; c < NC; c++) v[c] = (__m512bh)_mm512_loadu_si512(vp + (jp * DB + d0 + c) * 16);
        for (int i = 0; i < RB; i++) {
            const __m512bh pb = pair_bcast(pw[(r0 + i) * (KB / 2) + jp]);
            for (int c = 0; c < NC; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], pb, v[c]);
        }
    }
    for (int i = 0; i < RB; i++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(o + (r0 + i) * D + (d0 + c) * 16, acc[i][c]);
}

static void block_values(const uint32_t *pw, int64_t R4, const uint32_t *vp, int64_t DB, int64_t D, float *o) {
    for (int64_t r0 = 0; r0 < R4; r0 += RB) {
        int64_t d0 = 0;
        for (; d0 + 4 <= DB; d0 += 4) block_values_dims(4, pw, r0, vp, DB, d0, D, o);
        for (; d0 < DB; d0++) block_values_dims(1, pw, r0, vp, DB, d0, D, o);
    }
}

#ifdef RG_AMX
/* The same two products on AMX bfloat16 tiles (TDPBF16PS: C[16, 16] += A[16, 32 bfloat16] B[16 pairs, 16]),
 * every tile 16 rows of 64 bytes. The packed K and V are B tiles as they lie: a K block's 16 dimension
 * pairs of 16 keys, a V block's 16 key pairs of 16 dimensions (rows DB * 64 bytes apart). Tiles (configured
 * by rg_configure_bf16_tiles) by literal number: results 0-3, A 4-5, B 6-7. */
_Static_assert(KB == 64, "the tile products take a key block as 4 result tiles of 16 keys, 2 A tiles of 32");

/* sc[r][0 .. KB) = scores of rows r < R16 (a multiple of TR): per row tile, 4 result tiles of 16 keys over
 * D / 32 steps (the q tile loaded once a step). */
static void block_scores_amx(const uint32_t *qp, int64_t R16, const uint32_t *kp, int64_t DP, float *sc) {
    for (int64_t r0 = 0; r0 < R16; r0 += TR) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t p = 0; p < DP; p += 16) {
            _tile_loadd(4, qp + r0 * DP + p, DP * 4);
            _tile_loadd(6, kp + (0 * DP + p) * 16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, kp + (1 * DP + p) * 16, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(6, kp + (2 * DP + p) * 16, 64);
            _tile_dpbf16ps(2, 4, 6);
            _tile_loadd(7, kp + (3 * DP + p) * 16, 64);
            _tile_dpbf16ps(3, 4, 7);
        }
        _tile_stored(0, sc + r0 * KB + 0, KB * 4);
        _tile_stored(1, sc + r0 * KB + 16, KB * 4);
        _tile_stored(2, sc + r0 * KB + 32, KB * 4);
        _tile_stored(3, sc + r0 * KB + 48, KB * 4);
    }
}

/* o[r] += pw[r] x V over one block of KB keys, rows r < R16: per row tile the weights of keys 0-31 and 32-63
 * as two A tiles, then 2 result tiles of 16 dimensions at a time (loaded from o, 2 products each, stored). */
static void block_values_amx(const uint16_t *pw, int64_t R16, const uint32_t *vp, int64_t DB, int64_t D, float *o) {
    const int64_t vrow = DB * 64;  /* bytes from one key pair's row of a V tile to the next */
    const uint32_t *v_hi = vp + 16 * DB * 16;  /* key pairs 16 .. 31 */
    for (int64_t r0 = 0; r0 < R16; r0 += TR) {
        float *orow = o + r0 * D;
        _tile_loadd(4, pw + r0 * KB, KB * 2);
        _tile_loadd(5, pw + r0 * KB + 32, KB * 2);
        for (int64_t e = 0; e < DB; e += 2) {
            _tile_loadd(0, orow + e * 16, D * 4);
            _tile_loadd(1, orow + e * 16 + 16, D * 4);
            _tile_loadd(6, vp + e * 16, vrow);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, vp + (e + 1) * 16, vrow);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(6, v_hi + e * 16, vrow);
            _tile_dpbf16ps(0, 5, 6);
            _tile_loadd(7, v_hi + (e + 1) * 16, vrow);
            _tile_dpbf16ps(1, 5, 7);
            _tile_stored(0, orow + e * 16, D * 4);
            _tile_stored(1, orow + e * 16 + 16, D * 4);
        }
    }
}
#endif

/* Attend items (request, tile of QT positions, KV head), the last tiles (the most keys) first. */
static void attend_items(void *job, int64_t begin, int64_t end, int tid) {
    const extend_job *j = (const extend_job *)job;
    const int64_t H = j->H, Hkv = j->Hkv, D = j->D, G = H / Hkv, DP = D / 2, DB = D / 16;
    const int64_t rows_max = (QT * G + TR - 1) / TR * TR, pad = j->amx ? TR : RB;  /* rows: a multiple of pad */
    uint32_t qp[rows_max * DP] __attribute__((aligned(64)));  /* [rows, D/2] bfloat16 pairs of q * scale */
    float o[rows_max * D] __attribute__((aligned(64)));       /* [rows, D] output */
    float sc[rows_max * KB] __attribute__((aligned(64)));     /* [rows, KB] scores */
    float m[rows_max], l[rows_max];                           /* softmax max and sum */
    uint16_t pw[rows_max * KB] __attribute__((aligned(64)));  /* [rows, KB] bfloat16 softmax weights */
    (void)tid;
#ifdef RG_AMX
    if (j->amx) rg_configure_bf16_tiles();
#endif
    for (int64_t item = begin; item < end; item++) {
        const int64_t b = request_of(j, item), local = item - j->item_first[b];
        const int64_t P = j->prefix_lens[b], E = j->extend_lens[b], W = j->window, base = j->key_base[b];
        const int64_t blocks = padded_keys(P + E - base) / 16;
        const int64_t tiles = (E + QT - 1) / QT, tile = tiles - 1 - local / Hkv, hkv = local % Hkv;
        const int64_t t0 = tile * QT, nt = E - t0 < QT ? E - t0 : QT, R = nt * G, R4 = (R + pad - 1) / pad * pad;
        const uint32_t *kpack = j->pack + j->pack_first[b] + hkv * blocks * DP * 16;
        const uint32_t *vpack = j->pack + j->pack_first[b] + (Hkv + hkv) * blocks * DP * 16;
        for (int64_t r = 0; r < R4; r++) {  /* row r: position t0 + r / G, head hkv * G + r % G */
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(o + r * D, 0, sizeof(float) * (size_t)D);
            if (r >= R) {
                memset(qp + r * DP, 0, sizeof(uint32_t) * (size_t)DP);
                continue;
            }
            const float *qr = j->q + (j->q_first[b] + t0 + r / G) * j->q_stride + (hkv * G + r % G) * D;
            for (int64_t p = 0; p < DP; p++)
                qp[r * DP + p] = rg_float_to_bf16(qr[2 * p] * j->scale) |
                                 (uint32_t)rg_float_to_bf16(qr[2 * p + 1] * j->scale) << 16;
        }
        const int64_t kend = P + t0 + nt;  /* keys this tile's last position sees */
        const int64_t kfirst = first_key(P + t0 + nt - 1, W);  /* the first key this tile's last position sees */
        for (int64_t j0 = first_key(P + t0, W) / KB * KB; j0 < kend; j0 += KB) {
#ifdef RG_AMX
            if (j->amx)
                block_scores_amx(qp, R4, kpack + (j0 - base) * DP, DP, sc);
            else
#endif
                block_scores(qp, R4, kpack + (j0 - base) * DP, DP, sc);
            /* key j0 + k is visible to the row at position p iff first_key(p) <= j0 + k <= p */
            if (j0 + KB - 1 > P + t0 || j0 < kfirst)
                for (int64_t r = 0; r < R4; r++) {
                    const int64_t pos = P + t0 + (r < R ? r / G : 0), lo = first_key(pos, W) - j0;
                    for (int64_t k = 0; k < (lo < KB ? lo : KB); k++) sc[r * KB + k] = -INFINITY;
                    for (int64_t k = pos + 1 - j0 < 0 ? 0 : pos + 1 - j0; k < KB; k++) sc[r * KB + k] = -INFINITY;
                }
            for (int64_t r = 0; r < R4; r++) {  /* online softmax */
                float *s = sc + r * KB;
                __m512 mx = _mm512_loadu_ps(s);
                for (int c = 1; c < KB / 16; c++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + c * 16));
                const float top = fmaxf(m[r], _mm512_reduce_max_ps(mx));
                if (top == -INFINITY) {  /* no key of the row's window yet (a window's edge in a later block) */
                    memset(pw + r * KB, 0, sizeof(uint16_t) * KB);
                    continue;
                }
                const float alpha = expf(m[r] - top);
                const __m512 t = _mm512_set1_ps(top);
                __m512 sum = _mm512_setzero_ps();
                for (int c = 0; c < KB / 16; c++) {
                    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c * 16), t));
                    sum = _mm512_add_ps(sum, e);
                    _mm256_storeu_si256((__m256i *)(pw + r * KB + c * 16), (__m256i)_mm512_cvtneps_pbh(e));
                }
                l[r] = l[r] * alpha + _mm512_reduce_add_ps(sum);
                m[r] = top;
                if (alpha != 1.0f) {
                    const __m512 a = _mm512_set1_ps(alpha);
                    for (int64_t d = 0; d < D; d += 16)
                        _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(a, _mm512_loadu_ps(o + r * D + d)));
                }
            }
#ifdef RG_AMX
            if (j->amx)
                block_values_amx(pw, R4, vpack + (j0 - base) * DP, DB, D, o);
            else
#endif
                block_values((const uint32_t *)pw, R4, vpack + (j0 - base) * DP, DB, D, o);
        }
        for (int64_t r = 0; r < R; r++) {
            float *dst = j->out + ((j->q_first[b] + t0 + r / G) * H + hkv * G + r % G) * D;
            const float inv = 1.0f / l[r];
            for (int64_t d = 0; d < D; d++) dst[d] = o[r * D + d] * inv;
        }
    }
#ifdef RG_AMX
    if (j->amx) _tile_release();
#endif
}

int extend_attention_bf16_available(void) { return 1; }

int extend_attention_bf16(const float *q, int64_t q_stride, const void *k_buf, const void *v_buf, int kv,
                          const int64_t *req_to_token, int64_t table_stride, const int64_t *rows,
                          const int64_t *prefix_lens, const int64_t *extend_lens, int64_t B, int64_t H, int64_t Hkv,
                          int64_t D, int64_t window, float scale, float *out, int nthreads) {
    if (B < 1 || Hkv <= 0 || H % Hkv != 0 || H / Hkv > MAX_G || D % 16 != 0 || D > MAX_D || window < 0 ||
        q_stride < H * D || nthreads < 1 || kv == RG_KV_I8)
        return -1;
    int64_t words = 0, pack_items_n = 0, attend_items_n = 0;
    for (int64_t b = 0; b < B; b++) {
        if (extend_lens[b] < 1 || prefix_lens[b] < 0 || prefix_lens[b] + extend_lens[b] > table_stride) return -1;
        const int64_t Sp = padded_keys(prefix_lens[b] + extend_lens[b] - packed_from(prefix_lens[b], window));
        words += 2 * Hkv * Sp * D / 2;
        pack_items_n += Hkv * Sp / 16;
        attend_items_n += Hkv * ((extend_lens[b] + QT - 1) / QT);
    }
    const size_t map_bytes = ((size_t)(5 * B + 2) * 8 + 63) / 64 * 64;
    uint8_t *mem = (uint8_t *)rg_scratch(RG_SCRATCH_EXTEND, map_bytes + sizeof(uint32_t) * (size_t)words);
    if (mem == NULL) return -1;
    int64_t *q_first = (int64_t *)mem, *pack_first = q_first + B, *pack_items_first = pack_first + B;
    int64_t *attend_first = pack_items_first + B + 1, *key_base = attend_first + B + 1;
    for (int64_t b = 0, t = 0, w = 0, items = 0; b < B; b++) {
        key_base[b] = packed_from(prefix_lens[b], window);
        const int64_t Sp = padded_keys(prefix_lens[b] + extend_lens[b] - key_base[b]);
        q_first[b] = t;
        pack_first[b] = w;
        pack_items_first[b] = items;
        items += Hkv * Sp / 16;
        attend_first[b] = b ? attend_first[b - 1] + Hkv * ((extend_lens[b - 1] + QT - 1) / QT) : 0;
        t += extend_lens[b];
        w += Hkv * Sp * D;
    }
    pack_items_first[B] = pack_items_n;
    attend_first[B] = attend_items_n;
    const int amx = D % 32 == 0 && amx_ready();  /* whole tiles of 32 dimensions */
    extend_job job = {q, q_stride, k_buf, v_buf, kv, req_to_token, rows, prefix_lens, extend_lens, table_stride,
                      B, H, Hkv, D, window, scale, q_first, pack_first, key_base, pack_items_first, amx,
                      (uint32_t *)(mem + map_bytes), out};
    rg_parallel(nthreads, pack_items_n, RG_STATIC, pack_items, &job);
    job.item_first = attend_first;
    rg_parallel(nthreads, attend_items_n, RG_DYNAMIC, attend_items, &job);
    return 0;
}
#else
int extend_attention_bf16_available(void) { return 0; }

int extend_attention_bf16(const float *q, int64_t q_stride, const void *k_buf, const void *v_buf, int kv,
                          const int64_t *req_to_token, int64_t table_stride, const int64_t *rows,
                          const int64_t *prefix_lens, const int64_t *extend_lens, int64_t B, int64_t H, int64_t Hkv,
                          int64_t D, int64_t window, float scale, float *out, int nthreads) {
    (void)q_stride, (void)window, (void)q, (void)k_buf, (void)v_buf, (void)kv, (void)req_to_token, (void)table_stride, (void)rows;
    (void)prefix_lens, (void)extend_lens, (void)B, (void)H, (void)Hkv, (void)D, (void)scale, (void)out, (void)nthreads;
    return -1;
}
#endif
