/*
 * gemm.h — C = alpha * op(A) @ op(B) + beta * C, row-major, for float32 and
 * float64. op(X) is X or its transpose. A is (M,K) after op, B is (K,N), C is
 * (M,N); lda/ldb/ldc are row strides in elements.
 *
 * ai_gemm_* goes to OpenBLAS when the build has it (AI_HAVE_OPENBLAS), else
 * to the portable reference kernel ai_gemm_ref_*, which is also what the C
 * export ships; float32 products of a few rows, and on AVX-512 CPUs those
 * of gemm_tiles.c, to kernels of the engine's own (gemm.c says which). beta == 0 overwrites C without reading it (NaN-safe).
 */
#ifndef AI_GEMM_H
#define AI_GEMM_H

#include <stdbool.h>
#include <stdint.h>

void ai_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 float alpha, const float *A, int64_t lda, const float *B,
                 int64_t ldb, float beta, float *C, int64_t ldc);
void ai_gemm_f64(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 double alpha, const double *A, int64_t lda, const double *B,
                 int64_t ldb, double beta, double *C, int64_t ldc);

void ai_gemm_ref_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     float alpha, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float beta, float *C, int64_t ldc);
void ai_gemm_ref_f64(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     double alpha, const double *A, int64_t lda, const double *B,
                     int64_t ldb, double beta, double *C, int64_t ldc);

/* gemm_tiles.c, for gemm.c: whether a float32 product takes its AVX-512
 * kernel (decided on the whole product), and the product itself, false
 * (nothing written) where it could not allocate its packing buffer. */
bool ai_gemm_tiles_take(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);
bool ai_gemm_tiles_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc);
/* op(B) (K,N) packed whole for gemm_tiles.c's products (ai_gemm_packed_f32),
 * in ai_gemm_tiles_packed_size(N, K) floats (64-byte aligned), all at once
 * or its panels of AI_GEMM_TILE_COLS columns p0 .. p1 (pieces that threads
 * may pack side by side); the product over such a packing of op(B) with Nw
 * columns, writing columns n0 .. n0 + N (n0 a multiple of
 * AI_GEMM_TILE_COLS) into C, which points at column n0: the same sums as
 * ai_gemm_tiles_f32, bit for bit. op(A) = A^T (M,K) packed whole likewise,
 * in ai_gemm_tiles_packed_at_size(M, K) floats, its columns k_lo .. k_hi
 * at a time, and the weight-gradient product over both packings (columns
 * n0 .. n0 + N of C, all M rows). */
#define AI_GEMM_TILE_ROWS 6
#define AI_GEMM_TILE_COLS 64
int64_t ai_gemm_tiles_packed_size(int64_t N, int64_t K);
void ai_gemm_tiles_pack(bool trans_b, int64_t N, int64_t K, const float *B, int64_t ldb,
                        float *bp);
void ai_gemm_tiles_pack_panels(bool trans_b, int64_t N, int64_t K, const float *B, int64_t ldb,
                               float *bp, int64_t p0, int64_t p1);
void ai_gemm_tiles_packed_f32(int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                              int64_t lda, const float *bp, int64_t Nw, int64_t n0,
                              float beta, float *C, int64_t ldc);
int64_t ai_gemm_tiles_packed_at_size(int64_t M, int64_t K);
void ai_gemm_tiles_pack_at(int64_t M, int64_t K, const float *A, int64_t lda, float *ap,
                           int64_t k_lo, int64_t k_hi);
void ai_gemm_tiles_packed_at_f32(int64_t M, int64_t N, int64_t K, float alpha, const float *ap,
                                 const float *bp, int64_t Nw, int64_t n0, float beta, float *C,
                                 int64_t ldc);

/* A product op(A) = A (M,K) times a weight op(B) (K,N) packed ahead by
 * ai_gemm_tiles_pack, for a weight that many products read: whether a
 * product of these sizes takes the packed weight (else ai_gemm_f32 on B as
 * it is), and the product on the engine's threads, the same sums bit for
 * bit as ai_gemm_f32's at any thread count */
bool ai_gemm_packs(int64_t M, int64_t N, int64_t K);
void ai_gemm_packed_f32(int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                        int64_t lda, const float *bp, float beta, float *C, int64_t ldc);

/* Whether ai_gemm_f32/f64 splits a product of these sizes between the
 * engine's threads at the current thread count (else it runs on one: a
 * batch of such products may go to the pool whole, one per part) */
bool ai_gemm_splits(int64_t M, int64_t N, int64_t K);

/* Name of the GEMM backend in use ("openblas" or "reference"). */
const char *ai_gemm_backend(void);
/* Threads used by the GEMM library (no-op for the reference kernel). */
void ai_gemm_set_threads(int n);
int ai_gemm_get_threads(void);

#endif
