/*
 * gemm.c — matrix products through OpenBLAS (scipy-openblas32 wheel, symbols
 * prefixed scipy_) or the portable reference kernel.
 */
#include "gemm.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../parallel.h"
#include "simd.h"

#ifdef AI_HAVE_OPENBLAS
/* declared here rather than through the wheel's cblas.h, whose symbol
 * prefix depends on how it was configured */
enum { CblasRowMajor = 101 };
enum { CblasNoTrans = 111, CblasTrans = 112 };
void scipy_cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta,
                       float *C, int ldc);
void scipy_cblas_dgemm(int order, int ta, int tb, int M, int N, int K, double alpha,
                       const double *A, int lda, const double *B, int ldb, double beta,
                       double *C, int ldc);
void scipy_cblas_sgemv(int order, int trans, int M, int N, float alpha, const float *A,
                       int lda, const float *x, int incx, float beta, float *y, int incy);
void scipy_openblas_set_num_threads(int n);
char *scipy_openblas_get_corename(void);
int scipy_openblas_get_num_threads(void);
#endif

/* OpenBLAS (LP64) takes int sizes: bigger problems use the reference path. */
#define FITS_INT(x) ((x) <= 0x7fffffff)

#define DEFINE_REF_GEMM(NAME, T)                                                   \
    void NAME(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T *A, \
              int64_t lda, const T *B, int64_t ldb, T beta, T *C, int64_t ldc)     \
    {                                                                              \
        for (int64_t i = 0; i < M; i++) {                                          \
            T *c = C + i * ldc;                                                    \
            if (beta == 0)                                                         \
                for (int64_t j = 0; j < N; j++)                                    \
                    c[j] = 0;                                                      \
            else if (beta != 1)                                                    \
                for (int64_t j = 0; j < N; j++)                                    \
                    c[j] *= beta;                                                  \
            for (int64_t k = 0; k < K; k++) {                                      \
                T a = alpha * (ta ? A[k * lda + i] : A[i * lda + k]);              \
                if (!tb) {                                                         \
                    const T *b = B + k * ldb;                                      \
                    for (int64_t j = 0; j < N; j++)                                \
                        c[j] += a * b[j];                                          \
                } else {                                                           \
                    for (int64_t j = 0; j < N; j++)                                \
                        c[j] += a * B[j * ldb + k];                                \
                }                                                                  \
            }                                                                      \
        }                                                                          \
    }

DEFINE_REF_GEMM(ai_gemm_ref_f32, float)
DEFINE_REF_GEMM(ai_gemm_ref_f64, double)

/*
 * Skinny float32 products, M <= SK_MR rows of C (a Linear on a small batch,
 * its input gradient). The library packs the whole of B, the large operand,
 * at every call, to reuse it over many rows of A that are not there. Here A
 * is copied transposed and scaled by alpha (K x 16, zero rows past M) and B
 * is read in place, once: a register tile of SK_NR columns of C (broadcasts
 * of B) by 16 rows (two vectors of the copy), 12 FMAs per 8 loads. K runs in
 * chunks of SK_KC (the copy lives on the stack), each later chunk adding to
 * C. Measured against OpenBLAS, one thread, 16 x 128 x 640 (M x N x K):
 * 47 -> 34 us with warm caches, 132 -> 85 us with cold ones; Anomaly's eval
 * forward 3-9% faster. Taken for K >= 64 and N K >= 4096 only: with fewer
 * terms per output the tile's scattered stores outweigh its FMAs
 * (MobileNet's pointwise convs, K = 8..32, were 4% slower). Written once
 * in skinny_impl.h: 8 lanes (two vectors per column, tile SK_NR columns),
 * and 16 where the CPU has AVX-512.
 */
#define SK_MR 16
#define SK_NR 6
#define SK_KC 256

/* at[k SK_MR + m] = alpha op(A)[m, k] for k < kc, m < SK_MR (0 for m >= M):
 * A's rows (or, ta, its columns) are read in place. Rows of A go across in
 * 8 x 8 blocks of shuffles (scalar element by element this copy cost a
 * quarter of the product 16 x 128 x 640); alpha's product is exact, so
 * every clone writes the same values. */
AI_VECTOR_CLONES static void sk_copy_a(float *at, bool ta, int64_t M, int64_t kc, float alpha,
                                       const float *A, int64_t lda)
{
    if (ta) { /* op(A)[m, k] = A[k lda + m]: a contiguous row of M per k */
        for (int64_t k = 0; k < kc; k++)
            for (int64_t m = 0; m < SK_MR; m++)
                at[k * SK_MR + m] = m < M ? alpha * A[k * lda + m] : 0.0f;
        return;
    }
    for (int64_t m0 = 0; m0 < SK_MR; m0 += 8) {
        int64_t k = 0;
#ifdef AI_HAVE_TRANSPOSE8
        if (m0 + 8 <= M)
            for (; k + 8 <= kc; k += 8) {
                ai_vec8_f32 r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = *(const ai_vec8_f32 *)(A + (m0 + i) * lda + k);
                ai_transpose8_f32(r);
                for (int i = 0; i < 8; i++)
                    *(ai_vec8_f32 *)(at + (k + i) * SK_MR + m0) = alpha * r[i];
            }
#endif
        for (int64_t m = m0; m < m0 + 8; m++)
            for (int64_t kk = k; kk < kc; kk++)
                at[kk * SK_MR + m] = m < M ? alpha * A[m * lda + kk] : 0.0f;
    }
}
AI_VEC_DECL(sk_vec, float);

#define SK_FN skinny_f32
#define SK_ATTR AI_GEMM_CLONES
#define SK_V sk_vec
#define SK_VL 8
#define SK_TNR SK_NR
#include "skinny_impl.h"
#ifdef AI_AVX512_KERNEL
/* AVX-512: a column of 16 rows is one vector, a tile 8 columns (Anomaly's
 * eval forward 0.75-0.77 of the 8-lane kernel's time, same process; 12
 * columns 0.82-0.87, 16 0.86, 24 spilled: 1.8) */
#define SK_FN skinny_f32_v16
#define SK_ATTR AI_AVX512_KERNEL
#define SK_V ai_vec16_f32
#define SK_VL 16
#define SK_TNR 8
#include "skinny_impl.h"
#endif

/* Whether the product takes the skinny kernel: decided on the whole product,
 * so that its panels on the pool take it too (each element of C is then
 * the same sum at any thread count) */
static bool skinny_of(int64_t M, int64_t N, int64_t K)
{
    return K >= 64 && M <= SK_MR && N >= SK_NR && N * K >= 4096;
}

static void gemm_serial_f32(bool skinny, bool tiles, bool ta, bool tb, int64_t M, int64_t N,
                            int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                            int64_t ldb, float beta, float *C, int64_t ldc)
{
    if (skinny) {
#ifdef AI_AVX512_KERNEL
        if (ai_cpu_avx512()) {
            skinny_f32_v16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
#endif
        skinny_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (tiles && ai_gemm_tiles_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
#ifdef AI_HAVE_OPENBLAS
    if (K > 0 && FITS_INT(M) && FITS_INT(N) && FITS_INT(K) && FITS_INT(lda) &&
        FITS_INT(ldb) && FITS_INT(ldc)) {
        if (M == 1) { /* one row of C: B times A's row, without sgemm's packing */
            if (beta == 0) /* C may be uninitialised: NaN * 0 must not reach it */
                memset(C, 0, (size_t)N * sizeof *C);
            scipy_cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans,
                              tb ? (int)N : (int)K, tb ? (int)K : (int)N, alpha, B, (int)ldb,
                              A, ta ? (int)lda : 1, beta, C, 1);
            return;
        }
        scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                          tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha,
                          A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
        return;
    }
#endif
    ai_gemm_ref_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void gemm_serial_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                            const double *A, int64_t lda, const double *B, int64_t ldb,
                            double beta, double *C, int64_t ldc)
{
#ifdef AI_HAVE_OPENBLAS
    if (K > 0 && FITS_INT(M) && FITS_INT(N) && FITS_INT(K) && FITS_INT(lda) &&
        FITS_INT(ldb) && FITS_INT(ldc)) {
        scipy_cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                          tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha,
                          A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
        return;
    }
#endif
    ai_gemm_ref_f64(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/*
 * Threads: the engine's pool splits C into column panels (N, in units of 16
 * columns) or row panels (M, units of 8 rows), whichever dimension is larger,
 * and each thread runs the library single-threaded on its panel. Each element
 * of C is one sum over the whole K, but the library picks kernels by panel
 * size, so the last bits of a sum may depend on the thread count (as in
 * torch). Products under about 2 MFLOP per thread stay on one thread.
 * Skinny products (the kernel above: its sums do not depend on the panel)
 * split from 0.5 MFLOP per thread: with 2, every layer of Anomaly's
 * autoencoder (batch 16: 0.5 to 2.6 MFLOP each) stayed on one thread, and
 * at 2 threads its eval forward took 0.101 ms against 0.086, its training
 * step 0.76 against 0.59 (AVX-512 Xeon, same build with the threshold from
 * the environment; 0.25 MFLOP: 0.100 and 0.65; LeNet, KWS, MobileNet and
 * ResNet-8 unchanged at 0.5). The library's kernels may change with the
 * panel's size, so its products keep the 2 MFLOP rule, and one part per
 * thread: each part packs all of A (a column split) or of B (1024^3 at 2
 * threads: 140 GFLOP/s in 2 parts, 133 in 8).
 *
 * gemm_tiles.c's products (decided on the whole product, as the skinny
 * kernel is: their sums do not depend on the panel) are split otherwise:
 * op(B), and op(A) where it is A^T, are packed whole first, pieces of the
 * packing side by side on the pool, and then C in parts of whole tiles
 * that read the one packing: rows of 6 (A read in place) or, for A^T B,
 * columns of 64; up to the pool's 4 parts per thread, so that a thread
 * slowed by another program (a virtual CPU whose core is busy) hands its
 * last parts to the others instead of holding the product.
 */
#define SPLIT_N_UNIT 16
#define SPLIT_M_UNIT 8
#define MIN_FLOPS_PER_THREAD (INT64_C(1) << 21)
#define SKINNY_MIN_FLOPS_PER_THREAD (INT64_C(1) << 19)

typedef struct {
    bool ta, tb, f64, split_n, skinny, tiles;
    int64_t M, N, K, lda, ldb, ldc;
    double alpha, beta;
    const void *A, *B;
    const float *bp; /* op(B) packed whole (ai_gemm_tiles_pack), else NULL */
    const float *ap; /* op(A) = A^T packed whole (ai_gemm_tiles_pack_at), else NULL */
    void *C;
} gemm_job;

static int64_t split_unit(const gemm_job *j)
{
    if (j->bp)
        return j->split_n ? AI_GEMM_TILE_COLS : AI_GEMM_TILE_ROWS;
    return j->split_n ? SPLIT_N_UNIT : SPLIT_M_UNIT;
}

static void gemm_range(void *ctx, int64_t lo, int64_t hi)
{
    const gemm_job *j = ctx;
    const size_t es = j->f64 ? sizeof(double) : sizeof(float);
    const char *A = j->A, *B = j->B;
    char *C = j->C;
    int64_t M = j->M, N = j->N, c0 = 0;
    const int64_t unit = split_unit(j);
    if (j->split_n) {
        c0 = lo * unit;
        const int64_t c1 = hi * unit < N ? hi * unit : N;
        B += (size_t)(j->tb ? c0 * j->ldb : c0) * es;
        C += (size_t)c0 * es;
        N = c1 - c0;
    } else {
        int64_t r0 = lo * unit, r1 = hi * unit < M ? hi * unit : M;
        A += (size_t)(j->ta ? r0 : r0 * j->lda) * es;
        C += (size_t)(r0 * j->ldc) * es;
        M = r1 - r0;
    }
    if (j->ap)
        ai_gemm_tiles_packed_at_f32(M, N, j->K, (float)j->alpha, j->ap, j->bp, j->N, c0,
                                    (float)j->beta, (float *)C, j->ldc);
    else if (j->bp)
        ai_gemm_tiles_packed_f32(M, N, j->K, (float)j->alpha, (const float *)A, j->lda, j->bp,
                                 j->N, c0, (float)j->beta, (float *)C, j->ldc);
    else if (j->f64)
        gemm_serial_f64(j->ta, j->tb, M, N, j->K, j->alpha, (const double *)A, j->lda,
                        (const double *)B, j->ldb, j->beta, (double *)C, j->ldc);
    else
        gemm_serial_f32(j->skinny, j->tiles, j->ta, j->tb, M, N, j->K, (float)j->alpha,
                        (const float *)A, j->lda,
                        (const float *)B, j->ldb, (float)j->beta, (float *)C, j->ldc);
}

static void gemm_parallel(gemm_job *j)
{
    /* packed: A^T B by columns (N >= 2 M), A op(B) by rows (A's rows in place) */
    j->split_n = j->bp ? j->ap != NULL : j->N >= j->M;
    const int64_t unit = split_unit(j);
    int64_t units = ((j->split_n ? j->N : j->M) + unit - 1) / unit;
    int64_t other = j->split_n ? j->M : j->N;
    /* flops of one unit, saturated: only the grain depends on it */
    int64_t unit_flops = 2 * unit * (j->K < INT64_C(1) << 20 ? j->K : INT64_C(1) << 20) *
                         (other < INT64_C(1) << 20 ? other : INT64_C(1) << 20);
    const int64_t min_flops = j->skinny ? SKINNY_MIN_FLOPS_PER_THREAD : MIN_FLOPS_PER_THREAD;
    int64_t grain = unit_flops > 0 ? (min_flops + unit_flops - 1) / unit_flops : units;
    if (!j->bp) { /* one part per thread: each packs its own operand (above) */
        const int64_t per_thread = units / ai_get_num_threads();
        grain = grain > per_thread ? grain : per_thread;
    }
    ai_parallel_for(units, grain, gemm_range, j);
}

bool ai_gemm_splits(int64_t M, int64_t N, int64_t K)
{
    const double flops = 2.0 * (double)M * (double)N * (double)K;
    const int64_t min_flops = skinny_of(M, N, K) ? SKINNY_MIN_FLOPS_PER_THREAD
                                                 : MIN_FLOPS_PER_THREAD;
    return ai_get_num_threads() > 1 && flops >= 2.0 * (double)min_flops;
}

/* The packing of a split tiles product: op(B)'s panels, then A^T's columns
 * in pieces of about a panel's size (whole groups of 16: gemm_tiles.c
 * copies 16 at a time) */
typedef struct {
    const gemm_job *j;
    float *bp, *ap;
    int64_t panels, k_step;
} pack_job;

static void pack_range(void *ctx, int64_t lo, int64_t hi)
{
    const pack_job *p = ctx;
    const gemm_job *j = p->j;
    if (lo < p->panels)
        ai_gemm_tiles_pack_panels(j->tb, j->N, j->K, j->B, j->ldb, p->bp, lo,
                                  hi < p->panels ? hi : p->panels);
    if (hi > p->panels) {
        const int64_t k_lo = (lo > p->panels ? lo - p->panels : 0) * p->k_step;
        const int64_t k_hi = (hi - p->panels) * p->k_step;
        ai_gemm_tiles_pack_at(j->M, j->K, j->A, j->lda, p->ap, k_lo, k_hi < j->K ? k_hi : j->K);
    }
}

/* A tiles product on the pool: packed whole, then split (above); false
 * (nothing written) where the packing could not be allocated */
static bool tiles_split(gemm_job *j)
{
    pack_job p = {.j = j, .panels = (j->N + AI_GEMM_TILE_COLS - 1) / AI_GEMM_TILE_COLS};
    p.bp = aligned_alloc(64, sizeof(float) * (size_t)ai_gemm_tiles_packed_size(j->N, j->K));
    p.ap = j->ta ? aligned_alloc(64, sizeof(float) *
                                         (size_t)ai_gemm_tiles_packed_at_size(j->M, j->K))
                 : NULL;
    if (!p.bp || (j->ta && !p.ap)) {
        free(p.bp);
        free(p.ap);
        return false;
    }
    int64_t items = p.panels;
    if (j->ta) {
        const int64_t rows = (j->M + AI_GEMM_TILE_ROWS - 1) / AI_GEMM_TILE_ROWS * AI_GEMM_TILE_ROWS;
        p.k_step = j->K * AI_GEMM_TILE_COLS / rows / 16 * 16;
        p.k_step = p.k_step > 16 ? p.k_step : 16;
        items += (j->K + p.k_step - 1) / p.k_step;
    }
    ai_parallel_for(items, 1, pack_range, &p);
    j->bp = p.bp;
    j->ap = p.ap;
    gemm_parallel(j);
    free(p.bp);
    free(p.ap);
    return true;
}

void ai_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                 float *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
    gemm_job j = {.ta = ta, .tb = tb, .f64 = false, .skinny = skinny_of(M, N, K),
                  .tiles = ai_gemm_tiles_take(ta, tb, M, N, K), .M = M,
                  .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha,
                  .beta = beta, .A = A, .B = B, .C = C};
    if (j.tiles && ai_gemm_splits(M, N, K) && tiles_split(&j))
        return;
    gemm_parallel(&j);
}

/*
 * Packed weights. gemm_tiles.c packs B per block at every call, as
 * OpenBLAS does; ONNX Runtime's MLAS packs a constant weight once per
 * session. The engine keeps a packed copy of a weight that its products
 * read as op(B) (packed.c) and calls these: the same
 * kernel without its packing, so the same sums bit for bit, split
 * between threads by rows, as a split product is (above).
 */
bool ai_gemm_packs(int64_t M, int64_t N, int64_t K)
{
    return ai_gemm_tiles_take(false, false, M, N, K);
}

void ai_gemm_packed_f32(int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                        int64_t lda, const float *bp, float beta, float *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
    gemm_job j = {.tiles = true, .M = M, .N = N, .K = K, .lda = lda, .ldc = ldc,
                  .alpha = alpha, .beta = beta, .A = A, .bp = bp, .C = C};
    gemm_parallel(&j);
}

void ai_gemm_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                 const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                 double *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
    gemm_job j = {.ta = ta, .tb = tb, .f64 = true, .M = M, .N = N, .K = K, .lda = lda,
                  .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta, .A = A, .B = B,
                  .C = C};
    gemm_parallel(&j);
}

/* "openblas (SkylakeX)": the library and, for OpenBLAS, the kernels it chose for
 * this CPU (see aidge_interop/__init__.py). */
const char *ai_gemm_backend(void)
{
#ifdef AI_HAVE_OPENBLAS
    static char name[64];
    if (!name[0])
        snprintf(name, sizeof name, "openblas (%s)", scipy_openblas_get_corename());
    return name;
#else
    return "reference";
#endif
}

void ai_gemm_set_threads(int n)
{
#ifdef AI_HAVE_OPENBLAS
    scipy_openblas_set_num_threads(n);
#else
    (void)n;
#endif
}

int ai_gemm_get_threads(void)
{
#ifdef AI_HAVE_OPENBLAS
    return scipy_openblas_get_num_threads();
#else
    return 1;
#endif
}
