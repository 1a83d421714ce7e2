/*
 * parallel.c — the thread pool of parallel.h.
 *
 * One job at a time: the thread that takes `owner` (trylock) publishes the
 * job and a new generation number under `lock`; the owner and the workers
 * then claim the job's ranges one at a time, and the last range to finish
 * wakes the owner. Range k of a job is [n * k / parts, n * (k + 1) / parts):
 * a static split (the values never depend on which thread runs a range),
 * but whoever is running takes the next unclaimed range, so a worker that
 * is not scheduled (the other CPU busy, say with another library's spinning
 * threads) delays nothing: the owner runs its range. A claim is a CAS on
 * (generation, next range): a worker that wakes late, for a job that is
 * over, claims nothing of the next one.
 */
#define _POSIX_C_SOURCE 200809L
#include "parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "kernels/gemm.h"

#define SPIN_ROUNDS 20000 /* polls of the generation before sleeping: ~20-50 us */

static struct {
    pthread_mutex_t owner; /* held by the thread whose job is running */
    pthread_mutex_t lock;  /* guards job, gen and the condition variables */
    pthread_cond_t wake, done;
    int threads;           /* set count, caller included */
    int started;           /* workers running */
    atomic_uint gen;       /* job number; workers watch it */
    atomic_uint_least64_t claim; /* (gen << 32) | the next range to claim */
    atomic_int pending;    /* ranges of the current job not finished */
    ai_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 1, 0, 0, 0, 0, NULL, NULL, 0, 0};

static unsigned start_gen[AI_MAX_THREADS]; /* gen when worker i was created */
static _Thread_local bool in_range; /* this thread is running a range: nest serially */
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* One poll of a spin-wait (round i): a pause, and every 64th round the CPU
 * for another thread. On a loaded machine the thread waited for may not be
 * running at all; without the yield, the spinner holds the core it needs. */
static inline void cpu_relax(int i)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("pause");
#endif
    if ((i & 63) == 63)
        sched_yield();
}

static void run_range(ai_range_fn fn, void *ctx, int64_t n, int parts, int k)
{
    in_range = true;
    fn(ctx, n * k / parts, n * (k + 1) / parts);
    in_range = false;
    if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_signal(&pool.done);
        pthread_mutex_unlock(&pool.lock);
    }
}

/* The next unclaimed range of job `gen` (of `parts`), or -1 when none is
 * left or the job is no longer `gen`. */
static int claim_range(unsigned gen, int parts)
{
    uint_least64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        const unsigned k = (unsigned)(c & 0xffffffffu);
        if ((unsigned)(c >> 32) != gen || k >= (unsigned)parts)
            return -1;
        if (atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1,
                                                  memory_order_acq_rel, memory_order_acquire))
            return (int)k;
    }
}

static void *worker(void *arg)
{
    const int index = (int)(intptr_t)arg;
    unsigned seen = start_gen[index]; /* not a load here: the first job may be out */
    for (;;) {
        for (int i = 0; i < SPIN_ROUNDS && atomic_load_explicit(&pool.gen, memory_order_acquire)
                                               == seen; i++)
            cpu_relax(i);
        pthread_mutex_lock(&pool.lock);
        while (atomic_load(&pool.gen) == seen)
            pthread_cond_wait(&pool.wake, &pool.lock);
        seen = atomic_load(&pool.gen);
        ai_range_fn fn = pool.fn;
        void *ctx = pool.ctx;
        int64_t n = pool.n;
        int parts = pool.parts;
        pthread_mutex_unlock(&pool.lock);
        for (int k; (k = claim_range(seen, parts)) >= 0;)
            run_range(fn, ctx, n, parts, k);
    }
    return NULL;
}

/* A forked child has the parent's pool state but none of its workers. */
static void after_fork_child(void)
{
    pthread_mutex_init(&pool.owner, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.started = 0;
    atomic_store(&pool.pending, 0);
}

static void init(void)
{
    int n = ai_gemm_get_threads();
    pool.threads = n < 1 ? 1 : n > AI_MAX_THREADS ? AI_MAX_THREADS : n;
    ai_gemm_set_threads(1);
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* Starts workers up to `threads - 1`; the count actually running. */
static int start_workers(int threads)
{
    while (pool.started < threads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        start_gen[pool.started + 1] = atomic_load(&pool.gen);
        int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)(pool.started + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break; /* fewer threads than asked: still correct */
        pool.started++;
    }
    return pool.started + 1;
}

void ai_parallel_for(int64_t n, int64_t grain, ai_range_fn fn, void *ctx)
{
    pthread_once(&once, init);
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int64_t most = n / grain;
    int parts = pool.threads < most ? pool.threads : (int)most;
    if (parts < 2 || in_range || pthread_mutex_trylock(&pool.owner) != 0) {
        fn(ctx, 0, n);
        return;
    }
    int running = start_workers(parts);
    parts = parts < running ? parts : running;
    if (parts < 2) {
        pthread_mutex_unlock(&pool.owner);
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.parts = parts;
    atomic_store(&pool.pending, parts);
    const unsigned gen = atomic_load(&pool.gen) + 1;
    atomic_store(&pool.claim, (uint_least64_t)gen << 32);
    atomic_store_explicit(&pool.gen, gen, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    for (int k; (k = claim_range(gen, parts)) >= 0;)
        run_range(fn, ctx, n, parts, k);
    for (int i = 0; i < SPIN_ROUNDS && atomic_load(&pool.pending) > 0; i++)
        cpu_relax(i);
    pthread_mutex_lock(&pool.lock);
    while (atomic_load(&pool.pending) > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.owner);
}

void ai_set_num_threads(int n)
{
    pthread_once(&once, init);
    n = n < 1 ? 1 : n > AI_MAX_THREADS ? AI_MAX_THREADS : n;
    pthread_mutex_lock(&pool.owner); /* not while a job runs */
    pool.threads = n;
    pthread_mutex_unlock(&pool.owner);
}

int ai_get_num_threads(void)
{
    pthread_once(&once, init);
    return pool.threads;
}

double ai_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
