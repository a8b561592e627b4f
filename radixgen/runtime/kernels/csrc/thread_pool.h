/* The kernels' own worker threads (thread_pool.c). Internal to the kernel library. */
#ifndef RADIXGEN_THREAD_POOL_H
#define RADIXGEN_THREAD_POOL_H
#include <stdint.h>

/* Runs items [begin, end) on thread `tid` (0 is the caller, 1 .. nthreads - 1 the pool's workers). */
typedef void (*rg_range_fn)(void *ctx, int64_t begin, int64_t end, int tid);

enum { RG_STATIC, RG_GUIDED, RG_DYNAMIC };

/* fn over items [0, n) on up to nthreads threads, the calling thread one of them; returns when all
 * are done. Threads claim contiguous runs of items, so a late or busy thread's share is taken by the
 * others: RG_STATIC four runs per thread (cheap items: few claims, each a contended cache line);
 * RG_GUIDED runs that shrink as the items run out (each the items left / (2 nthreads), down to one),
 * so the threads finish within an item of each other (costly items: a GEMM's panels over many rows);
 * RG_DYNAMIC one item at a time. Which thread runs which items varies, so fn's results must not depend
 * on it (tid only picks per-thread scratch). With nthreads <= 1, n <= 1, or the pool busy with another caller's
 * region (another thread's, or a nested call), everything runs on the calling thread as tid 0. */
void rg_parallel(int nthreads, int64_t n, int schedule, rg_range_fn fn, void *ctx);

#endif
