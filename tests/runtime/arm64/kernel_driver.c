/* Runs one kernel case on generated inputs and writes its float32 outputs to stdout, so that a
 * cross-compiled Arm64 build of the kernels can be diffed against the Arm64 scalar build under an
 * emulator (tests/runtime/test_arm64_kernels.py). Inputs come from a seeded xorshift generator, so
 * both builds see the same ones.
 *
 *   kernel_driver level                               rg_simd_level() as text
 *   kernel_driver gemm FMT M K N SEED                 y [M, N] of block_gemm (FMT 0..6: block_format.h)
 *   kernel_driver attention KV B H HKV D LEN SEED     out [B, H, D] of decode_attention, request b's
 *                                                     keys LEN - b at scattered slots (KV: 0 f32,
 *                                                     1 bf16, 2 f16, 3 int8 rows with a float scale)
 *   kernel_driver norm T N SEED                       h [T, N] then out [T, N] of add_rms_norm (with delta)
 *   kernel_driver silu T INTER SEED                   out [T, INTER] of silu_mul
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "radixgen_kernels.h"
#include "simd_math.h"

static uint64_t rng_state;

static float uniform(float lo, float hi) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    const uint64_t r = rng_state * 2685821657736338717ull;
    return lo + (hi - lo) * (float)(r >> 40) / (float)(1ull << 24);
}

static void *alloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static int emit(const float *y, size_t n) { return fwrite(y, sizeof(float), n, stdout) == n ? 0 : 1; }

/* FMT: block_format.h's FMT_U4H, FMT_I8H, FMT_U4F, FMT_U8F, FMT_U8F2, FMT_K4, FMT_K6 (0 .. 6), or 7 for
 * FMT_O4H (U4H whose min is -8 d); K must be a multiple of 256 for K4 and K6. `limbs`: block_gemm_limbs'. */
static int gemm(int fmt, int64_t M, int64_t K, int64_t N, int limbs) {
    static const int64_t bits_of[] = {4, 8, 4, 8, 8, 4, 6, 4}, flags_of[] = {0, 0, 1, 3, 7, 8, 12, 16};
    static const int64_t block_bytes_of[] = {256, 512, 256, 512, 512, 256, 384, 256};
    const int64_t halves = fmt == 4 || fmt == 6 ? 2 : 1, f32 = fmt >= 2 && fmt <= 4, k_quant = fmt >= 5;
    const int64_t panels = (N + 15) / 16, nb = K / 32, block_bytes = block_bytes_of[fmt];
    const int64_t scales = panels * nb * halves * 16;
    uint8_t *qs = alloc((size_t)(panels * nb * block_bytes));
    const float qmax = fmt == 3 || fmt == 4 ? 64.0f : 256.0f;  /* unsigned 8-bit q are at most 63 */
    for (int64_t i = 0; i < panels * nb * block_bytes; i++) qs[i] = (uint8_t)(uniform(0.0f, qmax));
    uint16_t *d16 = alloc(sizeof(uint16_t) * (size_t)scales), *m16 = alloc(sizeof(uint16_t) * (size_t)scales);
    float *d32 = alloc(sizeof(float) * (size_t)scales), *m32 = alloc(sizeof(float) * (size_t)scales);
    uint8_t *sc = alloc((size_t)scales), *mn = alloc((size_t)scales);  /* K-quants' integer scales and mins */
    uint16_t *sup = alloc(sizeof(uint16_t) * (size_t)(panels * (nb / 8 + 1) * 32));
    for (int64_t i = 0; i < scales; i++) {
        d32[i] = uniform(0.001f, 0.02f), m32[i] = uniform(-0.15f, 0.0f);
        d16[i] = rg_float_to_half(d32[i]), m16[i] = rg_float_to_half(fmt == 7 ? -8.0f * rg_half_to_float(d16[i]) : m32[i]);
        sc[i] = (uint8_t)uniform(fmt == 6 ? 0.0f : 1.0f, fmt == 6 ? 256.0f : 64.0f), mn[i] = (uint8_t)uniform(0.0f, 64.0f);
    }
    for (int64_t i = 0; i < panels * (nb / 8 + 1) * 32; i++) sup[i] = rg_float_to_half(uniform(0.0001f, 0.001f));
    float *x = alloc(sizeof(float) * (size_t)(M * K)), *y = alloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = uniform(-2.0f, 2.0f);
    const void *d = k_quant ? (const void *)sc : f32 ? (const void *)d32 : (const void *)d16;
    const void *m = fmt == 1 || fmt == 6 ? NULL : k_quant ? (const void *)mn : f32 ? (const void *)m32 : (const void *)m16;
    const rg_block_weight w = {bits_of[fmt], flags_of[fmt], qs, d, m, k_quant ? sup : NULL};
    if (block_gemm_limbs(&w, x, M, K, N, y, limbs, 2) != 0) return 1;
    return emit(y, (size_t)(M * N));
}

static int attention(int kv, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t len) {
    const int64_t slots = B * len + 7, row = kv == 3 ? D + 4 : D, elems = slots * Hkv * row;
    const size_t width = kv == 0 ? 4 : kv == 3 ? 1 : 2;
    uint8_t *k = alloc(width * (size_t)elems), *v = alloc(width * (size_t)elems);
    for (int64_t i = 0; i < elems; i++) {
        for (int side = 0; side < 2; side++) {
            uint8_t *buf = side ? v : k;
            const float a = uniform(-2.0f, 2.0f);
            uint32_t bits;
            memcpy(&bits, &a, 4);
            if (kv == 0) memcpy(buf + 4 * i, &a, 4);
            if (kv == 1) buf[2 * i] = (uint8_t)(bits >> 16), buf[2 * i + 1] = (uint8_t)(bits >> 24);  /* bfloat16 */
            if (kv == 2) {
                const uint16_t h = rg_float_to_half(a);
                memcpy(buf + 2 * i, &h, 2);
            }
            if (kv == 3) {  /* D int8 values, then the row's float scale */
                const float scale = 0.01f + 0.001f * (float)(i % 7);
                if (i % row < D) buf[i] = (uint8_t)(int8_t)(a * 60.0f);
                else if (i % row == D) memcpy(buf + i, &scale, 4);
            }
        }
    }
    int64_t *table = alloc(sizeof(int64_t) * (size_t)(B * len)), *rows = alloc(sizeof(int64_t) * (size_t)B);
    int64_t *lens = alloc(sizeof(int64_t) * (size_t)B);
    for (int64_t b = 0; b < B; b++) {
        rows[b] = B - 1 - b;
        lens[b] = len - b;
        for (int64_t j = 0; j < len; j++) table[rows[b] * len + j] = (j * 7919 + b * len) % slots;  /* scattered */
    }
    float *q = alloc(sizeof(float) * (size_t)(B * H * D)), *out = alloc(sizeof(float) * (size_t)(B * H * D));
    for (int64_t i = 0; i < B * H * D; i++) q[i] = uniform(-1.0f, 1.0f);
    if (decode_attention(q, k, v, kv, table, len, rows, lens, 0, B, H, Hkv, D, 0.125f, out, NULL, 2) != 0) return 1;
    return emit(out, (size_t)(B * H * D));
}

static int norm(int64_t T, int64_t n) {
    float *h = alloc(sizeof(float) * (size_t)(2 * T * n)), *delta = alloc(sizeof(float) * (size_t)(T * n));
    float *w = alloc(sizeof(float) * (size_t)n), *out = h + T * n;
    for (int64_t i = 0; i < T * n; i++) h[i] = uniform(-3.0f, 3.0f), delta[i] = uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; i++) w[i] = uniform(0.5f, 1.5f);
    add_rms_norm(h, delta, w, T, n, 1e-5f, out, 2);
    return emit(h, (size_t)(2 * T * n));
}

static int silu(int64_t T, int64_t inter) {
    float *gu = alloc(sizeof(float) * (size_t)(2 * T * inter)), *out = alloc(sizeof(float) * (size_t)(T * inter));
    for (int64_t i = 0; i < 2 * T * inter; i++) gu[i] = uniform(-12.0f, 12.0f);
    silu_mul(gu, T, inter, out, 2);
    return emit(out, (size_t)(T * inter));
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "level") == 0) return printf("%d\n", rg_simd_level()) < 0;
    if (argc == 8 && strcmp(argv[1], "gemm") == 0) {
        rng_state = strtoull(argv[6], NULL, 10) * 2 + 1;
        return gemm(atoi(argv[2]), atoll(argv[3]), atoll(argv[4]), atoll(argv[5]), atoi(argv[7]));
    }
    if (argc == 9 && strcmp(argv[1], "attention") == 0) {
        rng_state = strtoull(argv[8], NULL, 10) * 2 + 1;
        return attention(atoi(argv[2]), atoll(argv[3]), atoll(argv[4]), atoll(argv[5]), atoll(argv[6]), atoll(argv[7]));
    }
    if (argc == 5 && (strcmp(argv[1], "norm") == 0 || strcmp(argv[1], "silu") == 0)) {
        rng_state = strtoull(argv[4], NULL, 10) * 2 + 1;
        return (argv[1][0] == 'n' ? norm : silu)(atoll(argv[2]), atoll(argv[3]));
    }
    fprintf(stderr, "usage: see the comment at the top of kernel_driver.c\n");
    return 2;
}
