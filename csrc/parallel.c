/*
 * parallel.c — the thread pool of parallel.h.
 *
 * One job at a time: the thread that takes `owner` (trylock) writes the job,
 * then a new generation number, which the spinning workers watch (no lock
 * on that path: a worker blocked on a lock the owner held had to be woken,
 * tens of microseconds on a virtual machine); only sleeping workers are
 * woken, under `lock`. The owner and the workers then claim the job's parts
 * one at a time, and the last part to finish wakes the owner if it sleeps. Part k of a job is [n * k / parts, n * (k + 1) / parts):
 * a static split (the values never depend on which thread runs a part).
 * Each taking thread has a block of consecutive parts (the owner the first,
 * worker i the (i + 1)-th): it claims its own from the front, in order, and
 * when they are gone takes the others' from their back. With threads of
 * equal speed each runs exactly its block, as a static split would (and
 * the same items as in the previous job, still in its cache); a slower
 * thread (a virtual CPU whose physical core is busy with someone else's
 * work, here up to half the speed) or a descheduled one gives its parts
 * up to the others. A claim is a CAS on the block's (generation, next,
 * end): a worker that wakes late, for a job that is over, claims nothing
 * of the next one.
 */
#define _POSIX_C_SOURCE 200809L
#include "parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "kernels/gemm.h"

/* How long an idle worker polls for the next job before it sleeps, and the
 * owner for the last parts before it waits: the next operator's job usually
 * follows within microseconds, and a sleeping worker takes a wake-up (tens
 * of microseconds on a virtual machine) to start. */
#define SPIN_SECONDS 3e-4

/* One block's claim word, (gen << 32) | (next << 16) | end, on its own
 * cache line: a thread claiming its own parts shares it with nobody. */
typedef struct {
    _Alignas(64) atomic_uint_least64_t w;
} block_claim;

static struct {
    pthread_mutex_t owner; /* held by the thread whose job is running */
    pthread_mutex_t lock;  /* guards the condition variables */
    pthread_cond_t wake, done;
    int threads;           /* set count, caller included */
    int started;           /* workers running */
    atomic_uint gen;       /* job number; workers watch it */
    atomic_int pending;    /* parts of the current job not finished */
    atomic_int sleepers;   /* workers waiting on `wake` */
    atomic_bool owner_waits; /* the owner waits on `done` */
    /* the job: written before gen is, read after it (a worker that reads a
     * later job's fields claims nothing: its gen is over) */
    _Atomic(ai_range_fn) fn;
    _Atomic(void *) ctx;
    atomic_int_least64_t n;
    atomic_int parts, blocks;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 1, 0, 0, 0, 0, false, NULL, NULL, 0, 0, 0};

static block_claim claims[AI_MAX_THREADS];
static unsigned start_gen[AI_MAX_THREADS]; /* gen when worker i was created */
static _Thread_local bool in_range; /* this thread is running a part: nest serially */
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

/* Whether a spin that started at t0 has lasted SPIN_SECONDS (the clock read
 * every 64 rounds). */
static inline bool spun_out(int i, double t0)
{
    return (i & 63) == 63 && ai_seconds() - t0 > SPIN_SECONDS;
}

static void run_part(ai_range_fn fn, void *ctx, int64_t n, int parts, int k)
{
    in_range = true;
    fn(ctx, n * k / parts, n * (k + 1) / parts);
    in_range = false;
    if (atomic_fetch_sub(&pool.pending, 1) == 1 && atomic_load(&pool.owner_waits)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_signal(&pool.done);
        pthread_mutex_unlock(&pool.lock);
    }
}

/* The next part of job `gen` for thread `self`: the front of its own block
 * (when it has one), else the back of the next block that has parts left;
 * -1 when none is left or the job is no longer `gen`. */
static int claim_part(unsigned gen, int self, int blocks)
{
    for (int i = 0; i < blocks; i++) {
        const int b = (self + i) % blocks;
        const bool own = i == 0 && self < blocks;
        uint_least64_t c = atomic_load_explicit(&claims[b].w, memory_order_acquire);
        for (;;) {
            const unsigned next = (unsigned)(c >> 16) & 0xffffu, end = (unsigned)c & 0xffffu;
            if ((unsigned)(c >> 32) != gen || next >= end)
                break;
            const uint_least64_t d = own ? c + (UINT64_C(1) << 16) : c - 1;
            if (atomic_compare_exchange_weak_explicit(&claims[b].w, &c, d, memory_order_acq_rel,
                                                      memory_order_acquire))
                return own ? (int)next : (int)end - 1;
        }
    }
    return -1;
}

static void *worker(void *arg)
{
    const int index = (int)(intptr_t)arg;
    unsigned seen = start_gen[index]; /* not a load here: the first job may be out */
    for (;;) {
        const double t0 = ai_seconds();
        unsigned gen;
        for (int i = 0; (gen = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen &&
                        !spun_out(i, t0);
             i++)
            cpu_relax(i);
        if (gen == seen) { /* sleep; the owner wakes sleepers (sleepers > 0) */
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleepers, 1);
            while ((gen = atomic_load(&pool.gen)) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = gen;
        const ai_range_fn fn = atomic_load_explicit(&pool.fn, memory_order_relaxed);
        void *const ctx = atomic_load_explicit(&pool.ctx, memory_order_relaxed);
        const int64_t n = atomic_load_explicit(&pool.n, memory_order_relaxed);
        const int parts = atomic_load_explicit(&pool.parts, memory_order_relaxed);
        const int blocks = atomic_load_explicit(&pool.blocks, memory_order_relaxed);
        for (int k; (k = claim_part(seen, index, blocks)) >= 0;)
            run_part(fn, ctx, n, parts, k);
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
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.owner_waits, false);
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

int ai_parallel_parts(void)
{
    pthread_once(&once, init);
    return pool.threads == 1 ? 1 : pool.threads * AI_PARTS_PER_THREAD;
}

void ai_parallel_for(int64_t n, int64_t grain, ai_range_fn fn, void *ctx)
{
    pthread_once(&once, init);
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    const int64_t most = n / grain;
    const int threads = pool.threads < most ? pool.threads : (int)most;
    if (threads < 2 || in_range || pthread_mutex_trylock(&pool.owner) != 0) {
        fn(ctx, 0, n);
        return;
    }
    const int running = start_workers(threads);
    const int blocks = threads < running ? threads : running;
    if (blocks < 2) {
        pthread_mutex_unlock(&pool.owner);
        fn(ctx, 0, n);
        return;
    }
    const int64_t most_parts = (int64_t)pool.threads * AI_PARTS_PER_THREAD;
    const int parts = (int)(most < most_parts ? most : most_parts);
    atomic_store_explicit(&pool.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&pool.ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&pool.n, n, memory_order_relaxed);
    atomic_store_explicit(&pool.parts, parts, memory_order_relaxed);
    atomic_store_explicit(&pool.blocks, blocks, memory_order_relaxed);
    atomic_store_explicit(&pool.pending, parts, memory_order_relaxed);
    const unsigned gen = atomic_load(&pool.gen) + 1;
    for (int b = 0; b < blocks; b++)
        atomic_store_explicit(&claims[b].w,
                              (uint_least64_t)gen << 32 |
                                  (uint_least64_t)(parts * b / blocks) << 16 |
                                  (uint_least64_t)(parts * (b + 1) / blocks),
                              memory_order_relaxed);
    atomic_store(&pool.gen, gen); /* publishes the above; then wake the sleepers */
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }

    for (int k; (k = claim_part(gen, 0, blocks)) >= 0;)
        run_part(fn, ctx, n, parts, k);
    const double t0 = ai_seconds();
    for (int i = 0; atomic_load(&pool.pending) > 0 && !spun_out(i, t0); i++)
        cpu_relax(i);
    if (atomic_load(&pool.pending) > 0) {
        pthread_mutex_lock(&pool.lock);
        atomic_store(&pool.owner_waits, true);
        while (atomic_load(&pool.pending) > 0)
            pthread_cond_wait(&pool.done, &pool.lock);
        atomic_store(&pool.owner_waits, false);
        pthread_mutex_unlock(&pool.lock);
    }
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
