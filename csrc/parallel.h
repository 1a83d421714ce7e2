/*
 * parallel.h — the engine's thread pool.
 *
 * ai_parallel_for(n, grain, fn, ctx) calls fn(ctx, lo, hi) on contiguous
 * parts that cover [0, n) exactly once, each at least `grain` long (but the
 * last): up to AI_PARTS_PER_THREAD parts per thread, run by at most
 * ai_get_num_threads() threads (the calling thread and the pool workers).
 * Each thread runs its own consecutive parts first, then takes parts not
 * yet started from the others: a thread that runs slower (its core shared
 * with another program) or not at all holds nothing up. It returns when
 * all are done. The split depends only on n, grain and the thread count,
 * never on timing: which thread runs a part does not change what the part
 * computes.
 *
 * It runs fn(ctx, 0, n) on the calling thread alone when one thread is set,
 * when n < 2 * grain, when called from inside a range (nested), or when
 * another thread is using the pool (two graphs run from two Python threads:
 * each still computes, one of them serially).
 *
 * Workers are started on first use, spin for 0.3 ms after a job (the next
 * operator's job usually follows at once), then sleep on a condition
 * variable. A forked child starts with an empty pool.
 *
 * ai_set_num_threads also sets the GEMM library to one thread: the engine
 * splits matrix products itself (kernels/gemm.c), so that one pool, with one
 * policy, is all the threads the engine runs.
 */
#ifndef AI_PARALLEL_H
#define AI_PARALLEL_H

#include <stdint.h>

#define AI_MAX_THREADS 256

typedef void (*ai_range_fn)(void *ctx, int64_t lo, int64_t hi);

void ai_parallel_for(int64_t n, int64_t grain, ai_range_fn fn, void *ctx);

/* Parts per thread of a job with enough items. With 2 threads, one at half
 * speed: a static halving takes as long as the slow thread's half, the
 * whole job at full speed; with 8 parts the job ends at most a part (an
 * eighth) after the ideal two thirds. */
#define AI_PARTS_PER_THREAD 4

/* The most parts of one job: 1 at one thread. Kernels that split their
 * work into slots of their own (a workspace each) make this many. */
int ai_parallel_parts(void);

/* n in [1, AI_MAX_THREADS] (clamped). The default is the GEMM library's
 * thread count at load time (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / the
 * number of CPUs), 1 without it. */
void ai_set_num_threads(int n);
int ai_get_num_threads(void);

/* Grain of the memory-bound kernels (elementwise, normalisations, pooling):
 * ranges of at least this many elements (torch's GRAIN_SIZE), so that a
 * tensor under twice as many stays on one thread: handing out a job costs
 * microseconds, more when a worker has gone to sleep. */
#define AI_GRAIN_ELEMS INT64_C(32768)

/* The grain in items of `per_item` elements each (planes, rows, channels). */
static inline int64_t ai_grain_of(int64_t per_item)
{
    if (per_item >= AI_GRAIN_ELEMS)
        return 1;
    return per_item > 0 ? AI_GRAIN_ELEMS / per_item : AI_GRAIN_ELEMS;
}

/* A monotonic clock in seconds (the per-node profile). */
double ai_seconds(void);

#endif
