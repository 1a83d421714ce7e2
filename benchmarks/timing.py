"""Interleaved timing: the contenders of one measurement run turn by turn.

On a shared or noisy machine, timing engine and torch in separate blocks
lets a burst of load favour one of them; alternating them sample by sample
and keeping medians spreads the noise over both.

A sample is at least ``sample_s`` (1 ms) of calls in a row. The first call
after the other contender's runs with cold caches and branch predictors,
and that penalty is not the library's own: the Perceptron's training step
(batch 16, 1 thread) took 83 us in a loop of its own and 115 us right
after a torch step; torch's 202 us and 222 us right after ours (a 4 MB
cache sweep between steps: +17 us and +21 us). With 0.2 ms samples (one or
two steps each) every sample timed that switch, and the ratio read
0.45-0.51; with 1 ms samples (about ten steps) it reads 0.41-0.42, the
ratio of the two loops run alone (0.41).

A call longer than ``sample_s`` is one call per sample, and there the
switch is not a few percent: KWS's training step (batch 16, 1 thread, the
engine's activations ~10 MB, torch's ~22 MB against a 32 MB L3) took
2.7 ms in a loop of its own and 3.8-4.0 ms right after a torch step (+40%),
torch's 7.5-7.9 ms and 8.8 ms right after ours (+12%): the ratio read 0.46
where the loops run alone give 0.36. So each sample starts with one call
that is not timed (``warm`` calls), after which the sample times the
library as a training loop runs it, step after step; both contenders get
the same.
"""
import os
import statistics
import threading
import time


def _sample(fn, inner):
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def interleaved_medians(fns, budget_s=0.3, min_samples=5, max_samples=200, sample_s=1e-3,
                        warm=1):
    """Median seconds per call of each callable of ``fns``, sampled in turn.

    Each sample runs a callable ``warm`` times untimed, then ``inner`` times
    timed (enough for ``sample_s``: so microsecond calls are not timer
    noise, and a sample times the library in a steady state, not the switch
    from the other, see above); the number of samples fills ``budget_s`` for
    all callables together, within [min_samples, max_samples].
    """
    return [statistics.median(s)
            for s in interleaved_samples(fns, budget_s, min_samples, max_samples, sample_s,
                                         warm)]


def interleaved_samples(fns, budget_s=0.3, min_samples=5, max_samples=200, sample_s=1e-3,
                        warm=1):
    """The samples (seconds per call) behind :func:`interleaved_medians`, one
    list per callable."""
    inners = []
    for fn in fns:  # warm-up, and the size of one sample
        fn()
        t = _sample(fn, 1)
        inners.append(max(1, min(1000, int(sample_s / max(t, 1e-9)))))
    per_round = sum(_sample(fn, k) * (k + warm) for fn, k in zip(fns, inners))
    rounds = int(min(max_samples, max(min_samples, budget_s / max(per_round, 1e-9))))
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for fn, k, out in zip(fns, inners, samples):
            for _ in range(warm):
                fn()
            out.append(_sample(fn, k))
    return samples


def _others_running():
    """How many of this process's threads other than the calling one are
    running or runnable (state R in Linux's /proc/self/task/*/stat), or None
    where not readable. A spinning worker is R; one asleep on a futex or a
    condition variable is S. (Their CPU time is no measure over a short
    window: a thread running on another CPU has it updated only at the
    scheduler's tick, every 4 ms here, so a 1 ms window read zero while
    torch's worker spun.)"""
    me = threading.get_native_id()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    running = 0
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
        running += state == "R"
    return running


def wait_idle(least_s, most_s=0.25, poll_s=5e-4):
    """Sleep ``least_s``, then until no other thread of the process runs
    (two polls ``poll_s`` apart in a row), ``most_s`` at most.

    With several threads, a library's idle workers keep spinning after its
    last call and take a core from the next contender. Measured here (CPU
    time of the other threads in the 50 ms after one 2-thread Relu): torch's
    OpenMP workers (GNU libgomp, default wait policy) 7.4-8.6 ms, 8-10 ms
    after a 5 ms run of calls; the engine's 0.3 ms. With a fixed 2 ms pause
    the engine's 2-thread block began with torch's worker still spinning on
    the second vCPU, and ran at its 1-thread speed, while torch's block never
    met the engine's spin. A pause that lasts until nothing else of the
    process runs gives each contender the machine as it finds it when it
    runs alone, whatever its and the other's spin policy; each library's own
    workers still spin between its own calls within its block (no library
    setting is changed). Where the threads cannot be read (not Linux), only
    ``least_s``.
    """
    time.sleep(least_s)
    end = time.perf_counter() + most_s
    quiet = 0
    while quiet < 2 and time.perf_counter() < end:
        running = _others_running()
        if running is None:
            return
        quiet = quiet + 1 if running == 0 else 0
        time.sleep(poll_s)
