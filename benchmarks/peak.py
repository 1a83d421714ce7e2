"""The machine's fp32 peak and memory bandwidth, and how close the engine gets.

- Peak: an FMA loop in C (compiled here, at run time, with the system ``cc``
  and ``-O2 -march=native``): 12 independent vector accumulators of the
  widest vectors the CPU has (16 floats with AVX-512, else 8), so the loop
  is bound by FMA throughput, not latency; one thread and N threads.
- Bandwidth: a triad ``a[i] = b[i] + s * c[i]`` over arrays far above the
  last-level cache (counted as 3 x 4 bytes per element; write-allocate
  traffic not counted, like STREAM).
- Engine: a large GEMM (one-node Gemm graph) and a 3x3 convolution, their
  GFLOP/s as a fraction of the measured peak at the same thread count. The
  peak is the best of 5 runs, so the fraction is taken from the kernels'
  best sample too; their median is printed beside it (on a shared machine
  the median also counts the time the CPU was lent to someone else). The
  scaling from one thread to N compares the best samples as well.

The GEMM runs on OpenBLAS's kernels for this CPU, which the first line
names. Where the CPU has AVX-512, aidge_interop asks for OpenBLAS's AVX-512
("SkylakeX") kernels unless ``OPENBLAS_CORETYPE`` is set (see
``aidge_interop/__init__.py``); a machine that sets it to "Haswell" (some do,
for old OpenBLAS builds) gets half the FMA width, so measure with
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/peak.py``.

    python benchmarks/peak.py [--threads 1,2]
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aidge_interop  # noqa: E402
from aidge_interop import Tensor  # noqa: E402
from bench_ops import one_node_model  # noqa: E402
from timing import interleaved_samples  # noqa: E402

C_SOURCE = r"""
#include <pthread.h>
#include <stddef.h>
#include <time.h>

/* the widest vector register -march=native has: 16 floats with AVX-512 (a
   peak measured on 8 lanes of such a CPU is half its peak), else 8 (AVX) */
#ifdef __AVX512F__
#define LANES 16
#define REG "+v"
#else
#define LANES 8
#define REG "+x"
#endif
typedef float vf __attribute__((vector_size(4 * LANES)));

int fma_lanes(void) { return LANES; }

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

typedef struct { long iters; float out; } fma_job;

static void *fma_loop(void *arg)
{
    fma_job *j = arg;
    vf a = (vf){0} + 1.0f, b = a * 0.999999f;
    vf x0 = a, x1 = a, x2 = a, x3 = a, x4 = a, x5 = a, x6 = a, x7 = a, x8 = a, x9 = a,
       x10 = a, x11 = a;
    /* Every accumulator goes through the empty asm: the compiler can neither see
       that the twelve chains hold equal values (and merge them) nor drop any. */
    for (long i = 0; i < j->iters; i++) {
        __asm__ volatile("" : REG(x0), REG(x1), REG(x2), REG(x3), REG(x4), REG(x5),
                              REG(x6), REG(x7), REG(x8), REG(x9), REG(x10), REG(x11));
        x0 = x0 * b + a; x1 = x1 * b + a; x2 = x2 * b + a; x3 = x3 * b + a;
        x4 = x4 * b + a; x5 = x5 * b + a; x6 = x6 * b + a; x7 = x7 * b + a;
        x8 = x8 * b + a; x9 = x9 * b + a; x10 = x10 * b + a; x11 = x11 * b + a;
    }
    vf s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11;
    j->out = s[0] + s[LANES - 1];
    return NULL;
}

/* GFLOP/s of `threads` threads each running the FMA loop (2 flops per lane) */
double fma_gflops(int threads, long iters)
{
    pthread_t tid[64];
    fma_job jobs[64];
    if (threads > 64) threads = 64;
    double t0 = now();
    for (int k = 0; k < threads; k++) {
        jobs[k].iters = iters;
        pthread_create(&tid[k], NULL, fma_loop, &jobs[k]);
    }
    for (int k = 0; k < threads; k++)
        pthread_join(tid[k], NULL);
    double t = now() - t0;
    return threads * (double)iters * 12 * LANES * 2 / t * 1e-9;
}

typedef struct { float *a; const float *b, *c; size_t lo, hi; int reps; } triad_job;

static void *triad(void *arg)
{
    triad_job *j = arg;
    for (int r = 0; r < j->reps; r++)
        for (size_t i = j->lo; i < j->hi; i++)
            j->a[i] = j->b[i] + 3.0f * j->c[i];
    return NULL;
}

/* GB/s of the triad over n floats, split between `threads` threads */
double triad_gbs(float *a, const float *b, const float *c, size_t n, int threads, int reps)
{
    pthread_t tid[64];
    triad_job jobs[64];
    if (threads > 64) threads = 64;
    double t0 = now();
    for (int k = 0; k < threads; k++) {
        jobs[k] = (triad_job){a, b, c, n * k / threads, n * (k + 1) / threads, reps};
        pthread_create(&tid[k], NULL, triad, &jobs[k]);
    }
    for (int k = 0; k < threads; k++)
        pthread_join(tid[k], NULL);
    double t = now() - t0;
    return 3.0 * 4.0 * n * reps / t * 1e-9;
}
"""


def build_library(folder):
    src, lib = os.path.join(folder, "peak.c"), os.path.join(folder, "libpeak.so")
    with open(src, "w") as f:
        f.write(C_SOURCE)
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O2", "-march=native", "-fPIC", "-shared", "-o", lib, src, "-lpthread"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"peak.py: {' '.join(cmd)} failed:\n{res.stderr}")
    so = ctypes.CDLL(lib)
    so.fma_lanes.restype = ctypes.c_int
    so.fma_gflops.restype = ctypes.c_double
    so.fma_gflops.argtypes = [ctypes.c_int, ctypes.c_long]
    so.triad_gbs.restype = ctypes.c_double
    so.triad_gbs.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    return so


def peak_gflops(so, threads):
    return max(so.fma_gflops(threads, 20_000_000) for _ in range(5))


def bandwidth_gbs(so, threads, n=32 * 2**20):
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    return max(so.triad_gbs(a.ctypes.data, b.ctypes.data, c.ctypes.data, n, threads, 2)
               for _ in range(3))


def _graph(op_type, inputs, attrs):
    graph = aidge_interop.load_onnx(one_node_model(op_type, inputs, attrs, {}))._g
    xs = [Tensor(a) for a in inputs.values()]
    return lambda: graph.forward(xs)


def engine_cases():
    r = np.random.default_rng(0)

    def f(*s):
        return r.standard_normal(s).astype(np.float32)

    m = n = k = 1024
    n_img, c_in, c_out, h, w = 8, 64, 64, 56, 56
    return {
        f"GEMM {m}x{n}x{k}": (_graph("Gemm", {"a": f(m, k), "b": f(k, n)}, {}),
                              2.0 * m * n * k),
        f"Conv 3x3 {n_img}x{c_in}x{h}x{w} -> {c_out}": (
            _graph("Conv", {"x": f(n_img, c_in, h, w), "w": f(c_out, c_in, 3, 3)},
                   {"pads": [1, 1, 1, 1]}),
            2.0 * n_img * c_out * h * w * c_in * 9),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    cases = engine_cases()
    print(f"engine GEMM: {aidge_interop._C.gemm_backend()}"
          + (f" (OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} set in the environment)"
             if "OPENBLAS_CORETYPE" in os.environ else ""))
    with tempfile.TemporaryDirectory() as folder:
        so = build_library(folder)
        rows = {}
        for threads in (int(t) for t in args.threads.split(",")):
            aidge_interop.set_num_threads(threads)
            peak, bw = peak_gflops(so, threads), bandwidth_gbs(so, threads)
            print(f"\n{threads} thread(s): fp32 FMA peak {peak:7.1f} GFLOP/s "
                  f"({so.fma_lanes()}-lane vectors), "
                  f"triad bandwidth {bw:6.1f} GB/s")
            samples = interleaved_samples([fn for fn, _ in cases.values()], budget_s=3.0,
                                          max_samples=30)
            for (name, (_, flops)), ts in zip(cases.items(), samples):
                best, med = min(ts), statistics.median(ts)
                gf = flops / best * 1e-9
                rows.setdefault(name, {})[threads] = gf
                print(f"  {name:<34}best {best * 1e3:8.2f} ms {gf:7.1f} GFLOP/s "
                      f"{100 * gf / peak:5.1f}% of peak; median {med * 1e3:8.2f} ms "
                      f"{100 * flops / med * 1e-9 / peak:5.1f}%")
        for name, by_threads in rows.items():
            ts = sorted(by_threads)
            if len(ts) > 1:
                print(f"{name}: {ts[-1]} threads / {ts[0]} thread (best samples): "
                      f"{by_threads[ts[-1]] / by_threads[ts[0]]:.2f}x")


if __name__ == "__main__":
    main()
