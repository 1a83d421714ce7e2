/*
 * simd.c — whether the AVX-512 kernels and the fast row kernels run, whether
 * the CPU has FMA (simd.h).
 */
#include "simd.h"

#include <stdatomic.h>

/* -1: not known yet; 0 or 1 */
static atomic_int avx512_on = -1;

static bool cpu_has_avx512(void)
{
#ifdef AI_AVX512_KERNEL
    /* x86-64-v4's AVX-512 subsets; GCC's checks include the OS's saving of
     * the 512-bit registers (XCR0) */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512cd");
#else
    return false;
#endif
}

bool ai_cpu_avx512(void)
{
    int on = atomic_load_explicit(&avx512_on, memory_order_relaxed);
    if (on < 0) {
        on = cpu_has_avx512();
        atomic_store_explicit(&avx512_on, on, memory_order_relaxed);
    }
    return on;
}

void ai_set_avx512(bool on)
{
    atomic_store_explicit(&avx512_on, on && cpu_has_avx512(), memory_order_relaxed);
}

bool ai_cpu_fma(void)
{
#if defined(__GNUC__) && defined(__x86_64__)
    return __builtin_cpu_supports("fma");
#else
    return true;
#endif
}

static atomic_bool fast_on = true;

bool ai_fast_kernels(void)
{
    return atomic_load_explicit(&fast_on, memory_order_relaxed);
}

void ai_set_fast_kernels(bool on)
{
    atomic_store_explicit(&fast_on, on, memory_order_relaxed);
}
