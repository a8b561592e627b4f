/* The kernels' own worker threads, instead of torch's OpenMP runtime.
 *
 * With OpenMP, every thread that runs a parallel region owns a team for its life, and once a
 * process has more OpenMP threads than cores, libgomp stops spinning between regions: each region
 * then pays a futex wake-up per worker. An idle team on the user's main thread (any torch work
 * there, e.g. HF transformers run first) thus made every small region of our decode step slow, and
 * batch-1 decoding ~2x slower. These workers belong to the kernel library alone: between regions
 * a worker polls for the next one for SPIN_NS (a decode step's regions follow each other within
 * microseconds), then sleeps on a futex until the caller's next region (one wake-up per step, after
 * the step's Python work). The caller runs a share of each region itself.
 *
 * Items are claimed from a shared counter, and a worker joins a region only while it is open: the
 * caller closes it once every item is claimed and waits only for the workers inside. So a worker
 * the OS has not scheduled costs nothing: the caller runs its share. A worker the OS takes the CPU
 * from while it holds items does cost (the caller waits for the OS to give it back). So the caller
 * keeps a window of its regions (WINDOW_NS of its own work plus waits): a region takes its own
 * share plus its wait, and alone it would take about twice its share, so when the window's waits
 * exceed its own work (decided early once MISSES regions waited), or the caller itself waited for
 * a CPU for over DELAY_SHARE of the window (its run delay: the cores are oversubscribed, and its own
 * share stretched), regions run on the caller alone for SOLO_NS, then the workers are tried again
 * (batch-1 decode, 2 threads on 2 cores shared with another ~1.5 cores of load: 28 tok/s waiting on
 * the worker, 110-130 on one thread). One wait alone does not decide: a VM's vCPU misses ~20
 * slices of 0.1-0.5 ms a second and a few of 5-13 ms, and going solo on each (as this pool once
 * did, for 512 regions) left batch-1 decode on one thread ~70% of the time. Nor does a delay of
 * 1/8: the engine's own scheduler thread, running beside the forward on 2 cores, delays the caller
 * by 5-25% of some windows, and each solo spell then cost 500 ms at half speed.
 * One region runs at a time: a caller that finds the pool busy (another thread's region, or a
 * nested call from inside a region) runs its region alone, so nothing waits on anything else.
 * After fork() the child starts with no workers.
 */
#include "thread_pool.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ volatile("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_WORKERS 255
#define SPIN_NS 100000 /* how long an idle worker polls for the next region before sleeping */
#define WINDOW_NS 50000000 /* own work + waits over which waits are weighed against own work */
#define WAIT_NS 50000      /* a wait this long counts as a miss... */
#define MISSES 8           /* ...and this many in a window with waits over own work decide at once */
#define SOLO_NS 500000000  /* how long regions run on the caller alone once waits outweighed own work */
#define DELAY_SHARE 0.25   /* ...or once the caller waited for a CPU this share of the window */
#define CLOSED (1ull << 31)         /* in `state`: the region takes no more workers */
#define ACTIVE_MASK (CLOSED - 1)    /* in `state`: workers inside the region */

typedef struct {
    pthread_mutex_t lock;        /* held by the caller whose region runs */
    int workers;                 /* started worker threads (tids 1 .. workers) */
    _Atomic uint32_t generation; /* bumped per region; the futex word sleeping workers wait on */
    _Atomic uint64_t state;      /* generation << 32 | CLOSED | workers inside the region */
    _Atomic int sleepers;        /* workers in futex wait */
    _Atomic int64_t next;        /* the next unclaimed item */
    rg_range_fn fn;              /* the current region (written before `generation` is bumped) */
    void *ctx;
    int64_t n;
    int nthreads, schedule;
    uint64_t solo_until;         /* regions start before this (CLOCK_MONOTONIC ns) run on the caller alone */
    uint64_t window_own, window_wait; /* the current window's own work and waits for workers (ns) */
    int window_misses;           /* the current window's waits of WAIT_NS or more */
    pid_t window_caller;         /* the thread whose regions the window holds */
    uint64_t window_start, window_delay; /* when the window began, and its caller's run delay then */
} pool_t;

static pool_t pool = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Claim and run runs of items until none are left (thread_pool.h: the schedules). */
static void run_items(int tid) {
    int64_t begin = atomic_load_explicit(&pool.next, memory_order_relaxed);
    while (begin < pool.n) {
        int64_t run = pool.schedule == RG_STATIC ? (pool.n + 4 * pool.nthreads - 1) / (4 * pool.nthreads)
                      : pool.schedule == RG_GUIDED ? (pool.n - begin) / (2 * pool.nthreads) : 1;
        if (run < 1) run = 1;
        if (run > pool.n - begin) run = pool.n - begin;
        if (atomic_compare_exchange_weak_explicit(&pool.next, &begin, begin + run, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            pool.fn(pool.ctx, begin, begin + run, tid);
            begin = atomic_load_explicit(&pool.next, memory_order_relaxed);
        }
    }
}

/* Wait until `generation` differs from `seen` (poll, then sleep); returns the new value. */
static uint32_t next_generation(uint32_t seen) {
    uint64_t start = now_ns();
    for (unsigned spins = 1;; spins++) {
        const uint32_t g = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (g != seen) return g;
        if (spins % 64 == 0 && now_ns() - start > SPIN_NS) {
            atomic_fetch_add(&pool.sleepers, 1);  /* announced before the futex re-checks the word */
            syscall(SYS_futex, &pool.generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_fetch_sub(&pool.sleepers, 1);
            start = now_ns();
        } else {
            CPU_RELAX();
        }
    }
}

/* Enter region g unless it is over or closed; then the caller waits for this worker to leave. */
static int join(uint32_t g) {
    uint64_t st = atomic_load(&pool.state);
    while ((uint32_t)(st >> 32) == g && !(st & CLOSED))
        if (atomic_compare_exchange_weak(&pool.state, &st, st + 1)) return 1;
    return 0;
}

static void *worker(void *arg) {
    const intptr_t packed = (intptr_t)arg;
    const int tid = (int)(packed & 0xFF);
    uint32_t seen = (uint32_t)(packed >> 8);  /* the generation before this worker's first region */
    for (;;) {
        seen = next_generation(seen);
        if (!join(seen)) continue;  /* too late: the caller ran it */
        if (tid < pool.nthreads) run_items(tid);
        atomic_fetch_sub(&pool.state, 1);
    }
    return NULL;
}

static void forget_workers(void) {  /* in a forked child: the workers did not come along */
    pthread_mutex_init(&pool.lock, NULL);
    pool.workers = 0;
    atomic_store(&pool.sleepers, 0);
}

/* The calling thread's time spent runnable but not running, from the scheduler's statistics
 * (/proc/thread-self/schedstat: run time, run delay, slices, in ns); 0 where the kernel has none. */
static uint64_t run_delay_ns(void) {
    char buf[96];
    const int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    const ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0) return 0;
    buf[got] = 0;
    unsigned long long run = 0, delay = 0;
    return sscanf(buf, "%llu %llu", &run, &delay) == 2 ? (uint64_t)delay : 0;
}

static pid_t caller_tid(void) {
    static __thread pid_t tid;
    if (tid == 0) tid = (pid_t)syscall(SYS_gettid);
    return tid;
}

/* Start a window of the calling thread's regions at `now`. */
static void open_window(uint64_t now) {
    pool.window_own = pool.window_wait = 0;
    pool.window_misses = 0;
    pool.window_caller = caller_tid();
    pool.window_start = now;
    pool.window_delay = run_delay_ns();
}

static void install_atfork(void) { pthread_atfork(NULL, NULL, forget_workers); }

/* Start workers up to `want` (the lock held); fewer if threads cannot be created. */
static void grow(int want) {
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    while (pool.workers < want) {
        const uint32_t g = atomic_load(&pool.generation);
        const intptr_t packed = ((intptr_t)g << 8) | (intptr_t)(pool.workers + 1);
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&thread, &attr, worker, (void *)packed);
        pthread_attr_destroy(&attr);
        if (rc != 0) return;
        pool.workers++;
    }
}

void rg_parallel(int nthreads, int64_t n, int schedule, rg_range_fn fn, void *ctx) {
    if (nthreads > n) nthreads = (int)n;
    if (nthreads <= 1 || pthread_mutex_trylock(&pool.lock) != 0) {
        if (n > 0) fn(ctx, 0, n, 0);
        return;
    }
    const uint64_t start = now_ns();
    if (start < pool.solo_until) {
        pthread_mutex_unlock(&pool.lock);
        fn(ctx, 0, n, 0);
        return;
    }
    if (pool.window_caller != caller_tid()) open_window(start);
    pthread_once(&atfork_once, install_atfork);
    grow(nthreads - 1);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.nthreads = nthreads;
    pool.schedule = schedule;
    atomic_store_explicit(&pool.next, 0, memory_order_relaxed);
    const uint32_t g = atomic_load(&pool.generation) + 1;
    atomic_store(&pool.state, (uint64_t)g << 32);
    atomic_store(&pool.generation, g);  /* publishes the region (sequentially consistent) */
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    run_items(0);
    atomic_fetch_or(&pool.state, CLOSED);  /* no worker may enter now; wait for those inside */
    const uint64_t own = now_ns();
    for (unsigned spins = 1; atomic_load_explicit(&pool.state, memory_order_acquire) & ACTIVE_MASK; spins++) {
        if (spins % 1024 == 0) sched_yield();  /* a worker inside may wait for this core */
        else CPU_RELAX();
    }
    const uint64_t end = now_ns();
    pool.window_own += own - start;
    pool.window_wait += end - own;
    pool.window_misses += end - own >= WAIT_NS;
    const int losing = pool.window_wait > pool.window_own;
    if ((losing && pool.window_misses >= MISSES) || pool.window_own + pool.window_wait >= WINDOW_NS) {
        const uint64_t delayed = run_delay_ns() - pool.window_delay;
        if (losing || delayed > (uint64_t)((double)(end - pool.window_start) * DELAY_SHARE)) {
            pool.solo_until = end + SOLO_NS;
            pool.window_caller = 0;  /* the first region after opens a new window */
        } else {
            open_window(end);
        }
    }
    pthread_mutex_unlock(&pool.lock);
}
