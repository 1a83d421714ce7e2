/*
 * test_parallel.c — the thread pool (parallel.h): every item of [0, n) run
 * exactly once, in parts of at least `grain` and at most
 * AI_PARTS_PER_THREAD per thread, at 1 to 4 threads; a thread stalled in
 * its first part leaves its other parts to the other threads; a call from
 * inside a part runs serially.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../parallel.h"
#include "ctest.h"

#define MAX_ITEMS 1000

typedef struct {
    atomic_int runs[MAX_ITEMS];
    atomic_int calls, short_parts;
    int64_t grain, n;
} cover_job;

static void cover_range(void *ctx, int64_t lo, int64_t hi)
{
    cover_job *j = ctx;
    atomic_fetch_add(&j->calls, 1);
    if (hi - lo < j->grain && hi != j->n)
        atomic_fetch_add(&j->short_parts, 1);
    for (int64_t i = lo; i < hi; i++)
        atomic_fetch_add(&j->runs[i], 1);
}

TEST(parallel_for_runs_each_item_once_in_bounded_parts)
{
    static cover_job j;
    const int64_t ns[] = {1, 2, 3, 7, 8, 9, 31, 64, 1000};
    const int64_t grains[] = {1, 3, 100};
    for (int threads = 1; threads <= 4; threads++) {
        ai_set_num_threads(threads);
        CHECK(ai_parallel_parts() == (threads == 1 ? 1 : threads * AI_PARTS_PER_THREAD));
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof grains / sizeof grains[0]; b++)
                for (int rep = 0; rep < 20; rep++) {
                    memset(&j, 0, sizeof j);
                    j.n = ns[a];
                    j.grain = grains[b];
                    ai_parallel_for(j.n, j.grain, cover_range, &j);
                    int bad = 0;
                    for (int64_t i = 0; i < j.n; i++)
                        bad += atomic_load(&j.runs[i]) != 1;
                    CHECK(bad == 0);
                    CHECK(atomic_load(&j.short_parts) == 0);
                    const int64_t most = j.n / j.grain > 1 ? j.n / j.grain : 1;
                    const int64_t cap = threads == 1 ? 1 : threads * AI_PARTS_PER_THREAD;
                    CHECK(atomic_load(&j.calls) <= (most < cap ? most : cap));
                }
    }
    ai_set_num_threads(1);
}

/* Part 0 (the calling thread's first) waits until every other part is
 * done: they can only be, in time, if the other thread takes them. */
typedef struct {
    atomic_int done;
    int parts;
    atomic_bool timed_out;
} stall_job;

static void stall_range(void *ctx, int64_t lo, int64_t hi)
{
    stall_job *j = ctx;
    if (lo == 0) {
        const double t0 = ai_seconds();
        while (atomic_load(&j->done) < j->parts - 1) {
            if (ai_seconds() - t0 > 10.0) {
                atomic_store(&j->timed_out, true);
                break;
            }
        }
    }
    (void)hi;
    atomic_fetch_add(&j->done, 1);
}

TEST(parallel_for_parts_of_a_stalled_thread_go_to_the_others)
{
    ai_set_num_threads(2);
    for (int rep = 0; rep < 5; rep++) {
        stall_job j = {0, 2 * AI_PARTS_PER_THREAD, false};
        ai_parallel_for(j.parts, 1, stall_range, &j);
        CHECK(!atomic_load(&j.timed_out));
        CHECK(atomic_load(&j.done) == j.parts);
    }
    ai_set_num_threads(1);
}

static void nested_range(void *ctx, int64_t lo, int64_t hi)
{
    cover_job *inner = ctx;
    for (int64_t i = lo; i < hi; i++)
        ai_parallel_for(10, 1, cover_range, &inner[i]);
}

TEST(parallel_for_nested_calls_run_serially)
{
    static cover_job inner[4];
    memset(inner, 0, sizeof inner);
    for (int i = 0; i < 4; i++)
        inner[i].n = 10, inner[i].grain = 1;
    ai_set_num_threads(2);
    ai_parallel_for(4, 1, nested_range, inner);
    for (int i = 0; i < 4; i++) {
        CHECK(atomic_load(&inner[i].calls) == 1); /* one serial call: [0, 10) */
        for (int k = 0; k < 10; k++)
            CHECK(atomic_load(&inner[i].runs[k]) == 1);
    }
    ai_set_num_threads(1);
}

const ctest_case parallel_cases[] = {
    CASE(parallel_for_runs_each_item_once_in_bounded_parts),
    CASE(parallel_for_parts_of_a_stalled_thread_go_to_the_others),
    CASE(parallel_for_nested_calls_run_serially),
    {NULL, NULL},
};
