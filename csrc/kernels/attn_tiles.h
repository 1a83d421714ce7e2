/*
 * attn_tiles.h — the float32 products of the attention node (ops/attention.c)
 * in register tiles of its own, without packing (attn_tiles.c).
 *
 * ai_attn_mm_f32: C (m x N) = alpha * sum_k a(i, k) B[k, 0:N] (+ C when acc),
 * with a(i, k) = A[i rsa + k csa] (A or A^T in place: no copy) and B, C
 * row-major (ldb, ldc). N a multiple of 8. Each element of C is the
 * sum over k in order by FMAs, whatever m and the tiles: the same bits for
 * a row whatever block it is computed in.
 *
 * ai_attn_transpose_f32: dst (cols x ldd) = src (rows x cols, lds)
 * transposed, columns rows .. ldd of dst zero. cols a multiple of 8.
 */
#ifndef AI_ATTN_TILES_H
#define AI_ATTN_TILES_H

#include <stdbool.h>
#include <stdint.h>

/* The lanes of the tiles that run: 16 (AVX-512), 8 (AVX2 with FMA), or 0
 * where none does (another CPU or build, ai_set_fast_kernels(false): the
 * node then runs its reference, GEMMs of kernels/gemm.h). */
int ai_attn_lanes(void);

void ai_attn_mm_f32(int lanes, int64_t m, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t rsa, int64_t csa, const float *B, int64_t ldb, bool acc, float *C,
                    int64_t ldc);
void ai_attn_transpose_f32(int lanes, int64_t rows, int64_t cols, const float *src, int64_t lds,
                           float *dst, int64_t ldd);

#endif
