/* Working memory the kernels reuse from call to call (scratch.c). Internal to the kernel library. */
#ifndef RADIXGEN_SCRATCH_H
#define RADIXGEN_SCRATCH_H
#include <stddef.h>

/* One buffer per slot and calling thread; a kernel that calls another uses a different slot. */
enum {
    RG_SCRATCH_ACTIVATIONS,  /* block_gemm: activation limbs */
    RG_SCRATCH_AMX_LIMBS,    /* amx_gemm: the activations' records (limb tiles, scales, sums) */
    RG_SCRATCH_AMX_THREADS,  /* amx_gemm: each thread's weight tiles, scales and result tiles */
    RG_SCRATCH_ATTENTION,    /* decode_attention: each thread's scores */
    RG_SCRATCH_SHARED,       /* shared_prefix_attention: each thread's scores and transposes */
    RG_SCRATCH_STEP,         /* decode_layers: the step's activations */
    RG_SCRATCH_EXTEND,       /* extend_attention_bf16: the packed K/V and work maps */
    RG_SCRATCH_ARGMAX,       /* argmax_rows: each chunk's largest value and its position */
    RG_SCRATCH_DRAW,         /* sample_draw: each thread's scaled logits, weights and candidates */
    RG_SCRATCH_SLOTS
};

/* A 64-byte aligned buffer of at least `bytes` for `slot`, valid until this thread asks for the
 * same slot again (its contents are not kept when it grows), or NULL when memory runs out. */
void *rg_scratch(int slot, size_t bytes);

#endif
