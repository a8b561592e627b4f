/* Working memory the kernels keep between calls, per calling thread.
 *
 * A kernel's buffers (activation limbs, attention scores, a decode step's activations) are large
 * enough that malloc maps them freshly on every call, and the kernel then faults every page in
 * again: ~4 KiB zeroed by the OS per fault, 15% of a batch-64 decode step in one profile. Each slot
 * instead keeps its largest buffer so far for the thread that asked, freed when the thread exits.
 */
#include "scratch.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    void *ptr;
    size_t size;
} buffer;

static __thread buffer slots[RG_SCRATCH_SLOTS];
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void free_slots(void *unused) {
    (void)unused;
    for (int s = 0; s < RG_SCRATCH_SLOTS; s++) {
        free(slots[s].ptr);
        slots[s].ptr = NULL;
        slots[s].size = 0;
    }
}

static void make_key(void) { pthread_key_create(&exit_key, free_slots); }

void *rg_scratch(int slot, size_t bytes) {
    buffer *b = &slots[slot];
    if (bytes == 0) bytes = 1;  /* a valid pointer even for an empty batch (NULL means out of memory) */
    if (bytes <= b->size) return b->ptr;
    pthread_once(&key_once, make_key);
    pthread_setspecific(exit_key, slots);  /* non-NULL, so free_slots runs at thread exit */
    free(b->ptr);
    const size_t size = (bytes + bytes / 4 + 63) / 64 * 64;  /* a little headroom for growing batches */
    b->ptr = aligned_alloc(64, size);
    b->size = b->ptr == NULL ? 0 : size;
    return b->ptr;
}
