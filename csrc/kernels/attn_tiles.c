/*
 * attn_tiles.c — the attention node's float32 products (attn_tiles.h):
 * register tiles reading A (or A^T) and B in place, B's rows in vectors,
 * a broadcast of A's element per row. AVX-512: 6 rows x 4 vectors of 16
 * (24 of the 32 registers, the head dim 64 in one tile row); AVX2 with
 * FMA: 6 rows x 2 vectors of 8 (12 of 16), which also take the
 * 16-lane path's last 8 columns where N is an odd multiple of 8 (the
 * scores of ViT-256's 65 keys: 72 computed, not 80). The node's products are small
 * (56-145 rows, K or N = the head dim or the keys): OpenBLAS packed both
 * operands at every call (19% of the node's samples), these pack nothing;
 * the node transposes K (and V in the backward) once per plane for the
 * products whose B is K^T (V^T).
 */
#include "attn_tiles.h"

#include "simd.h"

#if defined(AI_AVX512_KERNEL) && defined(AI_HAVE_TRANSPOSE8)
#define AT_HAVE 1

#define AT_CASES_4 AT_CASE(1, 1) AT_CASE(1, 2) AT_CASE(1, 3) AT_CASE(1, 4) \
    AT_CASE(2, 1) AT_CASE(2, 2) AT_CASE(2, 3) AT_CASE(2, 4) \
    AT_CASE(3, 1) AT_CASE(3, 2) AT_CASE(3, 3) AT_CASE(3, 4) \
    AT_CASE(4, 1) AT_CASE(4, 2) AT_CASE(4, 3) AT_CASE(4, 4) \
    AT_CASE(5, 1) AT_CASE(5, 2) AT_CASE(5, 3) AT_CASE(5, 4) \
    AT_CASE(6, 1) AT_CASE(6, 2) AT_CASE(6, 3) AT_CASE(6, 4)
#define AT_CASES_2 AT_CASE(1, 1) AT_CASE(1, 2) AT_CASE(2, 1) AT_CASE(2, 2) \
    AT_CASE(3, 1) AT_CASE(3, 2) AT_CASE(4, 1) AT_CASE(4, 2) \
    AT_CASE(5, 1) AT_CASE(5, 2) AT_CASE(6, 1) AT_CASE(6, 2)

#define AT_W 16
#define AT_VEC ai_vec16_f32
#define AT_MR 6
#define AT_NV 4
#define AT_CASES AT_CASES_4
#define AT_TGT AI_AVX512_KERNEL
#define SFX(name) name##_v16
#include "attn_tiles_impl.h"
#undef AT_W
#undef AT_VEC
#undef AT_MR
#undef AT_NV
#undef AT_CASES
#undef AT_TGT
#undef SFX

#define AT_W 8
#define AT_VEC ai_vec8_f32
#define AT_MR 6
#define AT_NV 2
#define AT_CASES AT_CASES_2
#define AT_TGT __attribute__((target("arch=x86-64-v3"), optimize("fp-contract=fast")))
#define SFX(name) name##_v8
#include "attn_tiles_impl.h"
#endif

int ai_attn_lanes(void)
{
#ifdef AT_HAVE
    if (!ai_fast_kernels())
        return 0;
    if (ai_cpu_avx512())
        return 16;
    if (__builtin_cpu_supports("avx2") && ai_cpu_fma())
        return 8;
#endif
    return 0;
}

void ai_attn_mm_f32(int lanes, int64_t m, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t rsa, int64_t csa, const float *B, int64_t ldb, bool acc, float *C,
                    int64_t ldc)
{
#ifdef AT_HAVE
    const int64_t n16 = lanes == 16 ? N / 16 * 16 : 0;
    if (n16)
        at_mm_v16(m, n16, K, alpha, A, rsa, csa, B, ldb, acc, C, ldc);
    if (N > n16) /* (with 16 lanes: the last 8 columns, on half the FMA work) */
        at_mm_v8(m, N - n16, K, alpha, A, rsa, csa, B + n16, ldb, acc, C + n16, ldc);
#else
    (void)lanes, (void)m, (void)N, (void)K, (void)alpha, (void)A, (void)rsa, (void)csa;
    (void)B, (void)ldb, (void)acc, (void)C, (void)ldc;
#endif
}

void ai_attn_transpose_f32(int lanes, int64_t rows, int64_t cols, const float *src, int64_t lds,
                           float *dst, int64_t ldd)
{
#ifdef AT_HAVE
    if (lanes == 16)
        at_transpose_v16(rows, cols, src, lds, dst, ldd);
    else
        at_transpose_v8(rows, cols, src, lds, dst, ldd);
#else
    (void)lanes, (void)rows, (void)cols, (void)src, (void)lds, (void)dst, (void)ldd;
#endif
}
