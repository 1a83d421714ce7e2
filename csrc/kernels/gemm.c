/*
 * gemm.c — matrix products through OpenBLAS (scipy-openblas32 wheel, symbols
 * prefixed scipy_) or the portable reference kernel.
 */
#include "gemm.h"

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
void scipy_openblas_set_num_threads(int n);
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

void ai_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                 float *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
#ifdef AI_HAVE_OPENBLAS
    if (K > 0 && FITS_INT(M) && FITS_INT(N) && FITS_INT(K) && FITS_INT(lda) &&
        FITS_INT(ldb) && FITS_INT(ldc)) {
        scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                          tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha,
                          A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
        return;
    }
#endif
    ai_gemm_ref_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void ai_gemm_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                 const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                 double *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
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

const char *ai_gemm_backend(void)
{
#ifdef AI_HAVE_OPENBLAS
    return "openblas";
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
