/*
 * matmul.c — matrix products: Gemm and MatMul, float32 and float64.
 *
 * Every product goes through ai_gemm_f32/f64 (kernels/gemm.h); a batched
 * MatMul is a loop of GEMMs over strided matrices, or a single GEMM when B
 * has no batch dimensions (A's batch folds into its rows). In a forward, a
 * float32 B that is a weight of the graph (an initializer) is read from the
 * graph's packed copy where ai_gemm_packs takes the product (packed.c).
 *
 * Gemm    Y = alpha * op(A) @ op(B) + beta * C, C broadcast to (M,N).
 *         dA = alpha * dY @ op(B)^T (transposed back when transA),
 *         dB = alpha * op(A)^T @ dY (transposed back when transB),
 *         dC = beta * dY summed over C's broadcast axes.
 * MatMul  numpy matmul: a 1-D A is a (1,K) row, a 1-D B a (K,1) column, the
 *         promoted axis is dropped from Y; batch dimensions broadcast.
 *         dA_b += dY_b @ B_b^T, dB_b += A_b^T @ dY_b; a matrix shared by
 *         several batches (broadcast) accumulates all their gradients.
 * FusedMatMul (domain aidge_interop, recipe fuse_linear) a Linear as one
 *         node: Y = A @ op(B) [+ bias], B a 2-D weight, op(B) = B^T when
 *         transB (the weight read in place: no Transpose node, forward or
 *         backward), A of any rank with its leading axes folded into rows
 *         (Y: A's shape with N last), bias (N,) added after the product as
 *         the Add it replaces did. dA += dY @ op(B)^T, dB += op(A)^T @ dY in
 *         B's own layout, dbias = dY summed over its rows (as Add's backward).
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/gemm.h"
#include "../parallel.h"
#include "matmul.h"

/* One GEMM on float32 or float64 pointers (dtype of the operands). */
static void gemm(ai_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                 const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
                 int64_t ldc)
{
    if (dt == AI_F32)
        ai_gemm_f32(ta, tb, M, N, K, (float)alpha, A, lda, B, ldb, (float)beta, C, ldc);
    else
        ai_gemm_f64(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static ai_status float_operands(const ai_ctx *c, int n)
{
    ai_dtype dt = c->in[0]->dtype;
    if (dt != AI_F32 && dt != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(dt));
    for (int k = 1; k < n; k++)
        if (c->in[k] && c->in[k]->dtype != dt)
            return ai_node_error(c->node, AI_ERR_TYPE, "input %d is %s, input 0 is %s", k,
                                 ai_dtype_name(c->in[k]->dtype), ai_dtype_name(dt));
    return AI_OK;
}

/* ---------------------------------------------------------------- Gemm */

typedef struct {
    double alpha, beta;
    bool ta, tb;
} gemm_params;

static ai_status gemm_init(ai_node *n)
{
    gemm_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    int64_t ta, tb;
    ai_status st;
    if ((st = ai_attr_float(n, "alpha", 1.0, &p->alpha)) ||
        (st = ai_attr_float(n, "beta", 1.0, &p->beta)) ||
        (st = ai_attr_int(n, "transA", 0, &ta)) || (st = ai_attr_int(n, "transB", 0, &tb)))
        return st;
    p->ta = ta != 0;
    p->tb = tb != 0;
    return AI_OK;
}

/* op(A) is (M,K), op(B) is (K,N); shape() checks that their K agree. */
static void gemm_sizes(const ai_ctx *c, int64_t *M, int64_t *N, int64_t *K)
{
    const gemm_params *p = c->node->params;
    *M = c->in[0]->shape[p->ta ? 1 : 0];
    *K = c->in[0]->shape[p->ta ? 0 : 1];
    *N = c->in[1]->shape[p->tb ? 0 : 1];
}

static const ai_tensor *gemm_c(const ai_ctx *c)
{
    return c->n_in > 2 ? c->in[2] : NULL;
}

static ai_status gemm_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    ai_status st = float_operands(c, c->n_in);
    if (st)
        return st;
    if (c->in[0]->ndim != 2 || c->in[1]->ndim != 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "A and B must be 2-D, got ranks %d and %d",
                             c->in[0]->ndim, c->in[1]->ndim);
    int64_t M, N, K;
    gemm_sizes(c, &M, &N, &K);
    const int64_t Kb = c->in[1]->shape[((const gemm_params *)c->node->params)->tb ? 1 : 0];
    if (K != Kb)
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "inner dimensions differ: op(A) is (%lld, %lld), op(B) is "
                             "(%lld, %lld)", (long long)M, (long long)K, (long long)Kb,
                             (long long)N);
    const ai_tensor *C = gemm_c(c);
    const int64_t mn[2] = {M, N};
    if (C) {
        int nd;
        int64_t bs[AI_MAX_DIMS];
        if (C->ndim > 2 || ai_broadcast_shape(c->node, C->ndim, C->shape, 2, mn, &nd, bs) ||
            bs[0] != M || bs[1] != N)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "C (rank %d) cannot be broadcast to (%lld, %lld)", C->ndim,
                                 (long long)M, (long long)N);
        *ws = (size_t)(M * N) * ai_dtype_size(C->dtype); /* backward: beta * dY */
    }
    out[0].dtype = c->in[0]->dtype;
    out[0].ndim = 2;
    out[0].shape[0] = M;
    out[0].shape[1] = N;
    return AI_OK;
}

#define DEFINE_FILL_C(NAME, T)                                                       \
    /* rows [r0, r1) of y (M,N) = C read with strides s0, s1 (0 on broadcast axes) */ \
    static void NAME(T *y, const T *C, int64_t r0, int64_t r1, int64_t N, int64_t s0, \
                     int64_t s1)                                                     \
    {                                                                                \
        for (int64_t i = r0; i < r1; i++)                                            \
            if (s1 == 1) /* rows in place (a bias: s0 = 0): copies, vectorised */    \
                memcpy(y + i * N, C + i * s0, (size_t)N * sizeof(T));                \
            else                                                                     \
                for (int64_t j = 0; j < N; j++)                                      \
                    y[i * N + j] = C[i * s0 + j * s1];                               \
    }

DEFINE_FILL_C(fill_c_f32, float)
DEFINE_FILL_C(fill_c_f64, double)

/* A row-wise pass over an (R,N) output on the thread pool: Gemm's fill of
 * C, FusedMatMul's bias (rows are independent: the same values at any
 * thread count). */
typedef struct {
    bool f64;
    void *y;
    const void *src;
    int64_t N, s0, s1;
} rows_job;

static void fill_c_range(void *ctx, int64_t lo, int64_t hi)
{
    const rows_job *j = ctx;
    if (j->f64)
        fill_c_f64(j->y, j->src, lo, hi, j->N, j->s0, j->s1);
    else
        fill_c_f32(j->y, j->src, lo, hi, j->N, j->s0, j->s1);
}

static ai_status gemm_forward(ai_ctx *c)
{
    const gemm_params *p = c->node->params;
    const ai_tensor *a = c->in[0], *b = c->in[1], *C = gemm_c(c);
    ai_tensor *y = c->out[0];
    int64_t M, N, K;
    gemm_sizes(c, &M, &N, &K);
    double beta = 0;
    if (C && p->beta != 0) {
        int64_t s[2];
        ai_broadcast_strides(C->ndim, C->shape, 2, y->shape, s);
        rows_job j = {y->dtype == AI_F64, y->data, C->data, N, s[0], s[1]};
        ai_parallel_for(M, ai_grain_of(N), fill_c_range, &j);
        beta = p->beta;
    }
    const float *bp = y->dtype == AI_F32 && !p->ta && ai_gemm_packs(M, N, K)
                          ? ai_packed_weight(c, 1, p->tb, N, K) : NULL;
    if (bp) /* a constant weight, packed once (packed.c) */
        ai_gemm_packed_f32(M, N, K, (float)p->alpha, a->data, a->shape[1], bp, (float)beta,
                           y->data, N);
    else
        gemm(y->dtype, p->ta, p->tb, M, N, K, p->alpha, a->data, a->shape[1], b->data,
             b->shape[1], beta, y->data, N);
    return AI_OK;
}

static ai_status gemm_backward(ai_ctx *c)
{
    const gemm_params *p = c->node->params;
    const ai_tensor *a = c->in[0], *b = c->in[1], *dy = c->dout[0];
    const ai_dtype dt = a->dtype;
    int64_t M, N, K;
    gemm_sizes(c, &M, &N, &K);
    const int64_t lda = a->shape[1], ldb = b->shape[1];
    /* GEMM beta 0 on a first write (assign), 1 to accumulate */
    const double beta_a = c->din_assign[0] ? 0.0 : 1.0, beta_b = c->din_assign[1] ? 0.0 : 1.0;
    if (c->din[0]) {
        if (!p->ta) /* dA (M,K) += alpha * dY @ op(B)^T */
            gemm(dt, false, !p->tb, M, K, N, p->alpha, dy->data, N, b->data, ldb, beta_a,
                 c->din[0]->data, K);
        else /* dA (K,M) += alpha * op(B) @ dY^T */
            gemm(dt, p->tb, true, K, M, N, p->alpha, b->data, ldb, dy->data, N, beta_a,
                 c->din[0]->data, M);
    }
    if (c->din[1]) {
        if (!p->tb) /* dB (K,N) += alpha * op(A)^T @ dY */
            gemm(dt, !p->ta, false, K, N, M, p->alpha, a->data, lda, dy->data, N, beta_b,
                 c->din[1]->data, N);
        else /* dB (N,K) += alpha * dY^T @ op(A) */
            gemm(dt, true, p->ta, N, K, M, p->alpha, dy->data, N, a->data, lda, beta_b,
                 c->din[1]->data, K);
    }
    if (c->n_in > 2 && c->din[2] && p->beta == 1) { /* dC: dY summed (a Linear's bias) */
        ai_reduce_to(c->din[2], dy, c->din_assign[2]);
    } else if (c->n_in > 2 && c->din[2]) {
        ai_tensor g = *dy;
        g.data = c->workspace;
        int64_t n = M * N;
        if (dt == AI_F32) {
            const float *s = dy->data, beta = (float)p->beta;
            float *d = g.data;
            for (int64_t i = 0; i < n; i++)
                d[i] = beta * s[i];
        } else {
            const double *s = dy->data;
            double *d = g.data;
            for (int64_t i = 0; i < n; i++)
                d[i] = p->beta * s[i];
        }
        ai_reduce_to(c->din[2], &g, c->din_assign[2]);
    }
    return AI_OK;
}

/* backward reads the operands, not the output */
static const ai_op_def op_gemm = {"Gemm", "", 2, 3, 1, 1, AI_OP_GRAD_ASSIGN(3) | AI_OP_BWD_NO_Y,
                                  gemm_init, gemm_shape, gemm_forward, gemm_backward};

/* ---------------------------------------------------------------- MatMul */

ai_status ai_matmul_dims(const ai_node *node, const ai_tensor *a, const ai_tensor *b,
                         ai_mm_dims *d)
{
    if (a->ndim < 1 || b->ndim < 1)
        return ai_node_error(node, AI_ERR_VALUE, "inputs must have rank >= 1, got %d and %d",
                             a->ndim, b->ndim);
    const int bna = a->ndim > 2 ? a->ndim - 2 : 0, bnb = b->ndim > 2 ? b->ndim - 2 : 0;
    d->M = a->ndim >= 2 ? a->shape[a->ndim - 2] : 1;
    d->K = a->shape[a->ndim - 1];
    int64_t kb = b->ndim >= 2 ? b->shape[b->ndim - 2] : b->shape[0];
    d->N = b->ndim >= 2 ? b->shape[b->ndim - 1] : 1;
    if (kb != d->K)
        return ai_node_error(node, AI_ERR_VALUE,
                             "inner dimensions differ: A has %lld columns, B has %lld rows",
                             (long long)d->K, (long long)kb);
    ai_status st = ai_broadcast_shape(node, bna, a->shape, bnb, b->shape, &d->nb, d->batch);
    if (st)
        return st;
    ai_broadcast_strides(bna, a->shape, d->nb, d->batch, d->sa);
    ai_broadcast_strides(bnb, b->shape, d->nb, d->batch, d->sb);
    d->count = 1;
    int64_t count_b = 1;
    for (int i = 0; i < d->nb; i++)
        d->count *= d->batch[i];
    for (int i = 0; i < bnb; i++)
        count_b *= b->shape[i];
    d->b_shared = count_b == 1;
    return AI_OK;
}

void ai_matmul_batch(const ai_mm_dims *d, int64_t i, int64_t *ia, int64_t *ib)
{
    *ia = *ib = 0;
    for (int k = d->nb - 1; k >= 0; k--) {
        int64_t idx = i % d->batch[k];
        i /= d->batch[k];
        *ia += idx * d->sa[k];
        *ib += idx * d->sb[k];
    }
}

static ai_status matmul_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    ai_status st = float_operands(c, 2);
    ai_mm_dims d;
    if (st || (st = ai_matmul_dims(c->node, c->in[0], c->in[1], &d)))
        return st;
    out[0].dtype = c->in[0]->dtype;
    out[0].ndim = d.nb;
    memcpy(out[0].shape, d.batch, sizeof(int64_t) * (size_t)d.nb);
    if (c->in[0]->ndim >= 2)
        out[0].shape[out[0].ndim++] = d.M;
    if (c->in[1]->ndim >= 2)
        out[0].shape[out[0].ndim++] = d.N;
    return AI_OK;
}

/* A batched MatMul's products (B with batch dimensions): on the pool, whole
 * products per part, where each product is too small for ai_gemm to split
 * between threads (8 heads of 64 x 128 x 64 ran one after the other on one
 * thread), else one after the other, each split. A product is the same
 * call whichever thread runs it: the same bits. */
typedef struct {
    const ai_mm_dims *d;
    ai_dtype dt;
    const char *A, *B, *Y; /* Y: the output, or in a backward dY */
    char *dA, *dB;
    double beta_a, beta_b;
} mm_batch;

static void mm_forward_range(void *ctx, int64_t lo, int64_t hi)
{
    const mm_batch *j = ctx;
    const int64_t M = j->d->M, N = j->d->N, K = j->d->K;
    const size_t es = ai_dtype_size(j->dt);
    for (int64_t i = lo; i < hi; i++) {
        int64_t ia, ib;
        ai_matmul_batch(j->d, i, &ia, &ib);
        gemm(j->dt, false, false, M, N, K, 1.0, j->A + ia * M * K * es, K,
             j->B + ib * K * N * es, N, 0.0, (char *)j->Y + i * M * N * es, N);
    }
}

/* dA_i += dY_i B_i^T, dB_i += A_i^T dY_i */
static void mm_backward_range(void *ctx, int64_t lo, int64_t hi)
{
    const mm_batch *j = ctx;
    const int64_t M = j->d->M, N = j->d->N, K = j->d->K;
    const size_t es = ai_dtype_size(j->dt);
    for (int64_t i = lo; i < hi; i++) {
        int64_t ia, ib;
        ai_matmul_batch(j->d, i, &ia, &ib);
        const char *dy = j->Y + i * M * N * es;
        if (j->dA)
            gemm(j->dt, false, true, M, K, N, 1.0, dy, N, j->B + ib * K * N * es, N, j->beta_a,
                 j->dA + ia * M * K * es, K);
        if (j->dB)
            gemm(j->dt, true, false, K, N, M, 1.0, j->A + ia * M * K * es, K, dy, N, j->beta_b,
                 j->dB + ib * K * N * es, N);
    }
}

/* fn over the batch: on the pool where ai_gemm would not split a product,
 * parts of at least 0.5 MFLOP */
static void mm_run(mm_batch *j, ai_range_fn fn)
{
    const ai_mm_dims *d = j->d;
    const int64_t part = INT64_C(1) << 19, flops = 2 * d->M * d->N * d->K + 1;
    if (d->count > 1 && !ai_gemm_splits(d->M, d->N, d->K))
        ai_parallel_for(d->count, (part + flops - 1) / flops, fn, j);
    else
        fn(j, 0, d->count);
}

static ai_status matmul_forward(ai_ctx *c)
{
    ai_mm_dims d;
    ai_status st = ai_matmul_dims(c->node, c->in[0], c->in[1], &d);
    if (st)
        return st;
    const ai_dtype dt = c->out[0]->dtype;
    const char *A = c->in[0]->data, *B = c->in[1]->data;
    char *Y = c->out[0]->data;
    const int64_t M = d.M, N = d.N, K = d.K;
    if (d.b_shared) { /* (count*M, K) @ (K, N) */
        const int64_t R = d.count * M;
        const float *bp = dt == AI_F32 && ai_gemm_packs(R, N, K)
                              ? ai_packed_weight(c, 1, false, N, K) : NULL;
        if (bp) /* a constant weight, packed once (packed.c) */
            ai_gemm_packed_f32(R, N, K, 1.0f, (const float *)A, K, bp, 0.0f, (float *)Y, N);
        else
            gemm(dt, false, false, R, N, K, 1.0, A, K, B, N, 0.0, Y, N);
        return AI_OK;
    }
    mm_batch j = {.d = &d, .dt = dt, .A = A, .B = B, .Y = Y};
    mm_run(&j, mm_forward_range);
    return AI_OK;
}

static ai_status matmul_backward(ai_ctx *c)
{
    ai_mm_dims d;
    ai_status st = ai_matmul_dims(c->node, c->in[0], c->in[1], &d);
    if (st)
        return st;
    const ai_dtype dt = c->out[0]->dtype;
    const char *A = c->in[0]->data, *B = c->in[1]->data, *dY = c->dout[0]->data;
    char *dA = c->din[0] ? c->din[0]->data : NULL, *dB = c->din[1] ? c->din[1]->data : NULL;
    const int64_t M = d.M, N = d.N, K = d.K;
    /* GEMM beta 0 on a first write (assign), 1 to accumulate */
    double beta_a = c->din_assign[0] ? 0.0 : 1.0, beta_b = c->din_assign[1] ? 0.0 : 1.0;
    if (d.b_shared) {
        const int64_t R = d.count * M; /* A's rows, all batches */
        if (dA) /* dA (R,K) += dY (R,N) @ B^T */
            gemm(dt, false, true, R, K, N, 1.0, dY, N, B, N, beta_a, dA, K);
        if (dB) /* dB (K,N) += A^T (K,R) @ dY (R,N) */
            gemm(dt, true, false, K, N, R, 1.0, A, K, dY, N, beta_b, dB, N);
        return AI_OK;
    }
    /* a broadcast operand's gradient sums several products: zero it, then add,
     * product after product in batch order */
    bool shared = false;
    for (int k = 0; k < 2; k++)
        if (c->din[k] && ai_tensor_numel(c->din[k]) < d.count * (k ? K * N : M * K)) {
            shared = true;
            if (c->din_assign[k]) {
                memset(c->din[k]->data, 0, ai_tensor_nbytes(c->din[k]));
                *(k ? &beta_b : &beta_a) = 1.0;
            }
        }
    mm_batch j = {.d = &d, .dt = dt, .A = A, .B = B, .Y = dY, .dA = dA, .dB = dB,
                  .beta_a = beta_a, .beta_b = beta_b};
    if (shared)
        mm_backward_range(&j, 0, d.count);
    else
        mm_run(&j, mm_backward_range);
    return AI_OK;
}

static const ai_op_def op_matmul = {"MatMul", "", 2, 2, 1, 1,
                                    AI_OP_GRAD_ASSIGN(2) | AI_OP_BWD_NO_Y, NULL,
                                    matmul_shape, matmul_forward, matmul_backward};

/* ---------------------------------------------------------------- FusedMatMul */

static ai_status fused_matmul_init(ai_node *n)
{
    int64_t tb;
    ai_status st = ai_attr_int(n, "transB", 0, &tb);
    if (st)
        return st;
    if (tb != 0 && tb != 1)
        return ai_node_error(n, AI_ERR_VALUE, "transB must be 0 or 1, got %lld", (long long)tb);
    bool *p = malloc(sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    *p = tb != 0;
    n->params = p;
    return AI_OK;
}

/* A's rows (its leading axes folded), K, N. */
static void fused_matmul_sizes(const ai_ctx *c, int64_t *R, int64_t *K, int64_t *N)
{
    const ai_tensor *a = c->in[0], *b = c->in[1];
    const bool tb = *(const bool *)c->node->params;
    *R = 1;
    for (int d = 0; d + 1 < a->ndim; d++)
        *R *= a->shape[d];
    *K = a->shape[a->ndim - 1];
    *N = b->shape[tb ? 0 : 1];
}

static ai_status fused_matmul_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    ai_status st = float_operands(c, c->n_in);
    if (st)
        return st;
    const ai_tensor *a = c->in[0], *b = c->in[1], *bias = c->n_in > 2 ? c->in[2] : NULL;
    const bool tb = *(const bool *)c->node->params;
    if (a->ndim < 1 || b->ndim != 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "A must have rank >= 1 and B rank 2, got "
                             "ranks %d and %d", a->ndim, b->ndim);
    int64_t R, K, N;
    fused_matmul_sizes(c, &R, &K, &N);
    if (b->shape[tb ? 1 : 0] != K)
        return ai_node_error(c->node, AI_ERR_VALUE, "inner dimensions differ: A has %lld "
                             "columns, op(B) has %lld rows", (long long)K,
                             (long long)b->shape[tb ? 1 : 0]);
    if (bias && (bias->ndim != 1 || bias->shape[0] != N))
        return ai_node_error(c->node, AI_ERR_VALUE, "the bias must have shape (%lld,), one "
                             "value per output column", (long long)N);
    out[0].dtype = a->dtype;
    out[0].ndim = a->ndim;
    memcpy(out[0].shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    out[0].shape[a->ndim - 1] = N;
    return AI_OK;
}

#define DEFINE_ADD_BIAS(NAME, T)                                       \
    /* rows [r0, r1) of y (R,N) += bias (N,) */                        \
    static void NAME(T *y, const T *bias, int64_t r0, int64_t r1, int64_t N) \
    {                                                                  \
        for (int64_t r = r0; r < r1; r++)                              \
            for (int64_t j = 0; j < N; j++)                            \
                y[r * N + j] += bias[j];                               \
    }

DEFINE_ADD_BIAS(add_bias_f32, float)
DEFINE_ADD_BIAS(add_bias_f64, double)

static void add_bias_range(void *ctx, int64_t lo, int64_t hi)
{
    const rows_job *j = ctx;
    if (j->f64)
        add_bias_f64(j->y, j->src, lo, hi, j->N);
    else
        add_bias_f32(j->y, j->src, lo, hi, j->N);
}

static ai_status fused_matmul_forward(ai_ctx *c)
{
    const bool tb = *(const bool *)c->node->params;
    const ai_tensor *a = c->in[0], *b = c->in[1], *bias = c->n_in > 2 ? c->in[2] : NULL;
    ai_tensor *y = c->out[0];
    int64_t R, K, N;
    fused_matmul_sizes(c, &R, &K, &N);
    const float *bp = y->dtype == AI_F32 && ai_gemm_packs(R, N, K)
                          ? ai_packed_weight(c, 1, tb, N, K) : NULL;
    if (bp) /* a constant weight, packed once (packed.c) */
        ai_gemm_packed_f32(R, N, K, 1.0f, a->data, K, bp, 0.0f, y->data, N);
    else
        gemm(y->dtype, false, tb, R, N, K, 1.0, a->data, K, b->data, b->shape[1], 0.0,
             y->data, N);
    if (bias) {
        rows_job j = {y->dtype == AI_F64, y->data, bias->data, N, 0, 1};
        ai_parallel_for(R, ai_grain_of(N), add_bias_range, &j);
    }
    return AI_OK;
}

static ai_status fused_matmul_backward(ai_ctx *c)
{
    const bool tb = *(const bool *)c->node->params;
    const ai_tensor *a = c->in[0], *b = c->in[1], *dy = c->dout[0];
    const ai_dtype dt = a->dtype;
    int64_t R, K, N;
    fused_matmul_sizes(c, &R, &K, &N);
    /* GEMM beta 0 on a first write (assign), 1 to accumulate */
    const double beta_a = c->din_assign[0] ? 0.0 : 1.0, beta_b = c->din_assign[1] ? 0.0 : 1.0;
    if (c->din[0]) /* dA (R,K) += dY (R,N) @ op(B)^T */
        gemm(dt, false, !tb, R, K, N, 1.0, dy->data, N, b->data, b->shape[1], beta_a,
             c->din[0]->data, K);
    if (c->din[1] && tb) /* dB (N,K) += dY^T @ A */
        gemm(dt, true, false, N, K, R, 1.0, dy->data, N, a->data, K, beta_b, c->din[1]->data, K);
    else if (c->din[1]) /* dB (K,N) += A^T @ dY */
        gemm(dt, true, false, K, N, R, 1.0, a->data, K, dy->data, N, beta_b, c->din[1]->data, N);
    if (c->n_in > 2 && c->din[2])
        ai_reduce_to(c->din[2], dy, c->din_assign[2]);
    return AI_OK;
}

/* backward reads the operands, not the output */
static const ai_op_def op_fused_matmul = {"FusedMatMul", "aidge_interop", 2, 3, 1, 1,
                                          AI_OP_GRAD_ASSIGN(3) | AI_OP_BWD_NO_Y,
                                          fused_matmul_init, fused_matmul_shape,
                                          fused_matmul_forward, fused_matmul_backward};

const ai_op_def *const ai_ops_matmul[] = {&op_gemm, &op_matmul, &op_fused_matmul, NULL};
