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
/* for register-tiled products whose rounding may change (like a GEMM's):
 * x86-64-v3 (AVX2 + FMA) with a * b + c contracted into FMAs, or baseline */
#define AI_GEMM_CLONES \
    __attribute__((target_clones("arch=x86-64-v3", "default"), optimize("fp-contract=fast")))
/* AI_AVX512_KERNEL: a kernel written for 16-lane vectors (64-byte GCC
 * vectors), compiled for x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) with a * b + c
 * contracted as in AI_GEMM_CLONES; called only where ai_cpu_avx512().
 * GCC 12 on (__builtin_shufflevector) */
#if __GNUC__ >= 12
#define AI_AVX512_KERNEL \
    __attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast")))
/* their vector: 16 floats, loadable from any float-aligned address */
typedef float ai_vec16_f32 __attribute__((vector_size(64), aligned(sizeof(float)), may_alias));
/* AI_WIDE_CLONES: AI_VECTOR_CLONES and an x86-64-v4 clone (16 lanes) for
 * loops whose lanes do enough arithmetic to pay for the wider vectors (the
 * polynomial activations, softmax's exponentials); the same values in
 * every clone, as there. One-node graphs of 131072 floats, 1 thread, AVX-512
 * Xeon, time against torch: Tanh 4.6 -> 2.7, Exp 3.5 -> 2.5, Sigmoid 2.1
 * -> 1.4, Gelu 2.7 -> 1.4, Softmax 1.8 -> 1.6 */
#define AI_WIDE_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#else
#define AI_VECTOR_CLONES
#define AI_FMA_CLONES
#define AI_GEMM_CLONES
#endif
#ifndef AI_WIDE_CLONES
#define AI_WIDE_CLONES AI_VECTOR_CLONES
#endif

/* Whether the AI_AVX512_KERNEL kernels run: where they are compiled, the
 * CPU has AVX-512 (x86-64-v4) and ai_set_avx512(false) was not called
 * (tests compare the two widths). */
#include <stdbool.h>
bool ai_cpu_avx512(void);
void ai_set_avx512(bool on);

/* AI_SHORT_LOOPS: copy and fill loops of a few elements stay loops (GCC
 * would turn each into a memcpy/memset call, which costs more than the few
 * elements it moves). */
#if defined(__GNUC__) && !defined(__clang__)
#define AI_SHORT_LOOPS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define AI_SHORT_LOOPS
#endif
/* AI_VEC_DECL(name, T) declares `name`: 32 bytes of T as one GCC/Clang
 * vector (arithmetic lane by lane, a scalar operand broadcast), loadable
 * through a pointer from any T-aligned address; AI_VEC_LANES(T) lanes.
 * Elsewhere it is T itself, one lane: code written with it stays portable. */
#if defined(__GNUC__)
#define AI_VEC_DECL(name, T) \
    typedef T name __attribute__((vector_size(32), aligned(sizeof(T)), may_alias))
#define AI_VEC_LANES(T) (32 / (int)sizeof(T))
#else
#define AI_VEC_DECL(name, T) typedef T name
#define AI_VEC_LANES(T) 1
#endif

#endif
