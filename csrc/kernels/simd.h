/*
 * simd.h — AI_VECTOR_CLONES: compile a hot loop nest twice, for AVX2 and for
 * the baseline x86-64 (SSE2), and pick one at load time (GCC's
 * target_clones, an ELF ifunc). Both clones compute the same values: C11
 * mode keeps -ffp-contract=off, so no FMA contraction changes rounding.
 * Elsewhere (other compilers, architectures) it is empty.
 */
#ifndef AI_SIMD_H
#define AI_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__) && \
    !defined(AI_NO_VECTOR_CLONES)
#define AI_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
/* for loops written with explicit fma()/fmaf() calls (exact in every clone):
 * the FMA unit (with AVX) instead of a libm call per element */
#define AI_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define AI_VECTOR_CLONES
#define AI_FMA_CLONES
#endif

#endif
