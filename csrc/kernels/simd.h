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
/* AI_WIDE_FMA_CLONES: the same for loops written with explicit fmaf() calls
 * (polynomials): x86-64-v4 and x86-64-v3 (AVX2 with FMA) run them on the FMA
 * unit; the same values in every clone (the default calls libm's fmaf) */
#define AI_WIDE_FMA_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#else
#define AI_VECTOR_CLONES
#define AI_FMA_CLONES
#define AI_GEMM_CLONES
#endif
#ifndef AI_WIDE_CLONES
#define AI_WIDE_CLONES AI_VECTOR_CLONES
#define AI_WIDE_FMA_CLONES AI_FMA_CLONES
#endif

/* Whether the AI_AVX512_KERNEL kernels run: where they are compiled, the
 * CPU has AVX-512 (x86-64-v4) and ai_set_avx512(false) was not called
 * (tests compare the two widths). */
#include <stdbool.h>
bool ai_cpu_avx512(void);
void ai_set_avx512(bool on);

/* Whether the CPU has FMA (x86; elsewhere true): kernels of
 * AI_WIDE_FMA_CLONES run on the FMA unit there, and call libm's fmaf per
 * value without it, where their callers take another kernel. */
bool ai_cpu_fma(void);

/* Whether the fast row kernels run (float32 LayerNormalization backward's
 * fused pass, ...) or their portable reference twins: on unless
 * ai_set_fast_kernels(false) (tests compare the two). */
bool ai_fast_kernels(void);
void ai_set_fast_kernels(bool on);

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

/* AI_HAVE_TRANSPOSE8 where GCC's vector shuffles exist:
 * ai_transpose8_f32(r) makes r[i] column i of the 8 x 8 block of floats
 * whose rows are r[] (24 shuffles; exact, so the same in every clone). */
#if defined(__GNUC__) && !defined(__clang__)
#include <stdint.h>
#define AI_HAVE_TRANSPOSE8
typedef float ai_vec8_f32 __attribute__((vector_size(32), aligned(sizeof(float)), may_alias));
typedef int32_t ai_idx8 __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void ai_transpose8_f32(ai_vec8_f32 r[8])
{
    const ai_idx8 lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
    const ai_idx8 ev = {0, 1, 8, 9, 4, 5, 12, 13}, od = {2, 3, 10, 11, 6, 7, 14, 15};
    const ai_idx8 h0 = {0, 1, 2, 3, 8, 9, 10, 11}, h1 = {4, 5, 6, 7, 12, 13, 14, 15};
    ai_vec8_f32 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], lo);
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            u[i + 2 * h] = __builtin_shuffle(t[i + h], t[i + h + 2], ev);
            u[i + 2 * h + 1] = __builtin_shuffle(t[i + h], t[i + h + 2], od);
        }
    for (int i = 0; i < 4; i++) {
        r[i] = __builtin_shuffle(u[i], u[i + 4], h0);
        r[i + 4] = __builtin_shuffle(u[i], u[i + 4], h1);
    }
}
#endif

#endif
