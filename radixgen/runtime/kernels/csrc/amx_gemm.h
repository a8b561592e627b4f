/* The AMX paths of the block GEMM (amx_gemm.c, amx_bf16.c), called by block_gemm for many rows. Internal to
 * the kernel library (not part of the Python boundary in radixgen_kernels.h). */
#ifndef RADIXGEN_AMX_GEMM_H
#define RADIXGEN_AMX_GEMM_H
#include <string.h>

#include "activation_blocks.h"
#include "radixgen_kernels.h"
#include "simd_math.h"

#define AMX_TILE_ROWS 16 /* activation rows per tile, in both AMX paths */

/* The 64-byte operand of ldtilecfg (palette 1: per tile register its rows and bytes a row). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} rg_tile_config;

#ifdef RG_AMX
/* Tile numbers of the bfloat16 GEMMs' 2 x 2 blocking (amx_bf16.c, amx_bf16_wide.c): results for 2
 * activation tiles x 2 weight panels, the 2 activation tiles, the 2 weight tiles. The tile intrinsics take
 * literal tile numbers (they stringize their arguments), so these are macros. */
#define T_C00 0
#define T_C01 1
#define T_C10 2
#define T_C11 3
#define T_A0 4
#define T_A1 5
#define T_B0 6
#define T_B1 7

/* Configure all 8 tiles as 16 rows of 64 bytes, the bfloat16 kernels' one shape (A: 16 x 32 bfloat16; B:
 * 16 pairs x 16; results: 16 x 16 float32). */
static inline void rg_configure_bf16_tiles(void) {
    rg_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}
#endif

/* 1 when this build has the AMX path and the OS lends this process the tile state, else 0. */
int amx_ready(void);

/* block_gemm_limbs's result, bit for bit, on AMX int8 tiles for activations already quantized in `limbs` (1..3)
 * limbs (xq: M rows of K / 32 blocks, then zero blocks up to a multiple of 16 rows); -1 when the path is
 * absent or refused, or on bad sizes / memory. */
int amx_block_gemm(const rg_block_weight *w, const xblock *xq, int64_t M, int64_t K, int64_t N, float *y, int limbs,
                   int nthreads);

/* block_gemm's result in float32's precision (3 limbs) on AMX bfloat16 tiles for the fp16 formats (Q4_0, Q4_1,
 * Q8_0: amx_bf16.c), within float32's rounding of amx_block_gemm's; -1 when the path is absent or refused, or
 * on another format, bad sizes or memory. */
int amx_bf16_gemm(const rg_block_weight *w, const float *x, int64_t M, int64_t K, int64_t N, float *y, int nthreads);

#endif
