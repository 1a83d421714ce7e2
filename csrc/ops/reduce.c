/*
 * reduce.c — ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
 * ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp over
 * any set of axes, with keepdims and noop_with_empty_axes; ArgMax, ArgMin,
 * CumSum, CumProd and TopK along one axis (at the end of the file).
 *
 * Axes are an attribute before opset 18 (ReduceSum: 13) and an optional
 * constant input from then on; no axes (or an empty list) means all axes,
 * unless noop_with_empty_axes, which makes the node an identity.
 *
 * The input is walked once in memory order; each element lands on its
 * output element through output strides that are 0 on reduced axes. Sums
 * of float64 accumulate in double with Neumaier compensation, so the error
 * does not grow with the length of the reduction; sums of float32 accumulate
 * in plain double (8 partial sums along a row: vectorised), whose error stays
 * below float32's rounding for any row shorter than 2^26 or so; over an axis
 * before a kept last axis, blocks of up to 16 rows are summed in float (as
 * torch does) before they join the double sums.
 * Integers (int32, int64: shape arithmetic) are summed exactly in int64;
 * Max/Min of bool are any/all.
 *
 * Backward: Sum/Mean broadcast the output gradient (scaled by 1/count for
 * Mean), written over a fresh gradient buffer rather than added to a
 * zeroed one (AI_OP_GRAD_ASSIGN). Max/Min follow torch.amax/amin: the
 * gradient is split evenly among the elements equal to the result,
 * dx = dy / count * (x == y).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/rows.h"
#include "../kernels/simd.h"
#include "../parallel.h"

enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_L1, R_L2, R_SUMSQ, R_LOGSUM, R_LOGSUMEXP };

typedef struct {
    int kind;
} reduce_params;

/* The reduction, as seen by the kernels. */
typedef struct {
    bool noop;                     /* identity (empty axes, noop_with_empty_axes) */
    int nd;                        /* input rank, after merging axes */
    int64_t shape[AI_MAX_DIMS];    /* input shape, after merging axes */
    int64_t ostride[AI_MAX_DIMS];  /* output strides; 0 on reduced axes */
    int64_t count;                 /* input elements per output element */
    int64_t nout;                  /* output elements */
    int out_nd;
    int64_t out_shape[AI_MAX_DIMS];
} reduce_plan;

static ai_status reduce_setup(const ai_ctx *c, reduce_plan *p)
{
    const ai_node *node = c->node;
    const ai_tensor *x = c->in[0];
    const int kind = ((const reduce_params *)node->params)->kind;
    const int since = kind == R_SUM ? 13 : 18; /* axes become an input */
    int64_t keepdims, noop, axes[AI_MAX_DIMS];
    int n = -1;
    memset(p, 0, sizeof *p);
    ai_status st = ai_attr_int(node, "keepdims", 1, &keepdims);
    if (!st)
        st = ai_attr_int(node, "noop_with_empty_axes", 0, &noop);
    if (st)
        return st;
    if (node->opset < since) {
        if (c->n_in > 1 && c->in[1])
            return ai_node_error(node, AI_ERR_VALUE,
                                 "axes are an attribute before opset %d, not an input", since);
        const int64_t *v;
        int64_t len;
        if ((st = ai_attr_ints(node, "axes", &v, &len)))
            return st;
        if (len > AI_MAX_DIMS)
            return ai_node_error(node, AI_ERR_VALUE, "%lld axes for rank %d", (long long)len,
                                 x->ndim);
        for (int64_t i = 0; i < len; i++)
            axes[i] = v[i];
        n = (int)len;
    } else if (c->n_in > 1 && c->in[1]) {
        const ai_tensor *t = ai_ctx_const(c, 1);
        if (!t)
            return ai_node_error(node, AI_ERR_NOT_IMPLEMENTED, "axes input must be a constant");
        if (t->dtype != AI_I64 || t->ndim != 1 || t->shape[0] > AI_MAX_DIMS)
            return ai_node_error(node, AI_ERR_VALUE, "axes must be a 1-D int64 tensor of at "
                                 "most %d values", AI_MAX_DIMS);
        n = (int)t->shape[0];
        for (int i = 0; i < n; i++)
            axes[i] = ((const int64_t *)t->data)[i];
    }
    bool red[AI_MAX_DIMS] = {false};
    for (int i = 0; i < n; i++) {
        int a;
        if ((st = ai_norm_axis(node, axes[i], x->ndim, &a)))
            return st;
        if (red[a])
            return ai_node_error(node, AI_ERR_VALUE, "axis %lld appears twice",
                                 (long long)axes[i]);
        red[a] = true;
    }
    if (n <= 0) {
        p->noop = noop != 0;
        for (int d = 0; d < x->ndim; d++)
            red[d] = !p->noop;
    }
    for (int d = 0; d < x->ndim; d++)
        if (!red[d] || keepdims || p->noop)
            p->out_shape[p->out_nd++] = red[d] ? 1 : x->shape[d];
    int64_t ostr[AI_MAX_DIMS];
    p->count = 1;
    p->nout = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        ostr[d] = red[d] ? 0 : p->nout;
        if (red[d])
            p->count *= x->shape[d];
        else
            p->nout *= x->shape[d];
    }
    /* merge neighbouring axes that are both reduced or both kept (size-1
     * axes dropped): fewer, longer rows */
    for (int d = 0; d < x->ndim; d++) {
        const int k = p->nd - 1;
        if (x->shape[d] == 1)
            continue;
        if (k >= 0 && (ostr[d] == 0) == (p->ostride[k] == 0)) {
            p->shape[k] *= x->shape[d];
        } else {
            p->shape[p->nd++] = x->shape[d];
        }
        p->ostride[p->nd - 1] = ostr[d];
    }
    return AI_OK;
}

/* For each input row: xo, oo (offsets of the row in input and output), L
 * (its length) and os (output stride along it: 0 = reduced, 1 = kept). */
#define FOR_ROWS(P, ...)                                                               \
    do {                                                                               \
        const int nd_ = (P)->nd;                                                       \
        const int64_t L = nd_ ? (P)->shape[nd_ - 1] : 1;                               \
        const int64_t os = nd_ ? (P)->ostride[nd_ - 1] : 0;                            \
        int64_t rows_ = 1, idx_[AI_MAX_DIMS] = {0}, oo = 0;                            \
        for (int d_ = 0; d_ < nd_ - 1; d_++)                                           \
            rows_ *= (P)->shape[d_];                                                   \
        for (int64_t r_ = 0; r_ < rows_ && L > 0; r_++) {                              \
            const int64_t xo = r_ * L;                                                 \
            __VA_ARGS__;                                                               \
            for (int d_ = nd_ - 2; d_ >= 0; d_--) {                                    \
                oo += (P)->ostride[d_];                                                \
                if (++idx_[d_] < (P)->shape[d_])                                       \
                    break;                                                             \
                oo -= (P)->ostride[d_] * (P)->shape[d_];                               \
                idx_[d_] = 0;                                                          \
            }                                                                          \
        }                                                                              \
    } while (0)

/* s + c += v, Neumaier's compensated summation */
static inline void kahan_add(double *s, double *c, double v)
{
    double t = *s + v;
    *c += fabs(*s) >= fabs(v) ? (*s - t) + v : (v - t) + *s;
    *s = t;
}

/* ---------------------------------------------------------------- forward */

/* acc/comp: nout doubles each (workspace) */
#define DEFINE_SUM(NAME, T)                                                            \
    static void NAME(const reduce_plan *p, T *y, const T *x, double scale, double *acc,\
                     double *comp)                                                     \
    {                                                                                  \
        memset(acc, 0, sizeof(double) * (size_t)p->nout);                              \
        memset(comp, 0, sizeof(double) * (size_t)p->nout);                             \
        FOR_ROWS(p, {                                                                  \
            const T *xr = x + xo;                                                      \
            if (os == 0) {                                                             \
                double s = 0, c = 0;                                                   \
                for (int64_t j = 0; j < L; j++)                                        \
                    kahan_add(&s, &c, xr[j]);                                          \
                kahan_add(&acc[oo], &comp[oo], s);                                     \
                comp[oo] += c;                                                         \
            } else {                                                                   \
                for (int64_t j = 0; j < L; j++)                                        \
                    kahan_add(&acc[oo + j], &comp[oo + j], xr[j]);                     \
            }                                                                          \
        });                                                                            \
        for (int64_t o = 0; o < p->nout; o++)                                          \
            y[o] = (T)((acc[o] + comp[o]) * scale);                                    \
    }

DEFINE_SUM(sum_f64, double)

/* sum_f32's share of the input: with split = d (a row axis whose outputs
 * are kept), the rows whose index along d is in [lo, hi); with split =
 * nd - 1 (a kept row axis), the columns [lo, hi) of every row; with -1, all
 * of it. Every output element sums its rows in the same order whatever the
 * split: the same values at any thread count. */
typedef struct {
    const reduce_plan *p;
    const float *x;
    double *acc;
    int split;
} sum_job;

/* x[0] + ... + x[L - 1] in 8 double lanes (a reduced last axis). Blocks of
 * 32 float lanes, as torch sums, and the wide clone measured slower here on
 * rows of 128 (1.08 and 1.16 times). Where AVX-512 runs, the rows of an
 * input whose reduced last axis is its only one or follows its only kept
 * one run kernels/rows.c's ai_sum_rows_v16 (16-lane float blocks: 0.43 of
 * the time), and this is its reference. */
static inline double sum_row_f32(const float *x, int64_t L)
{
    double part[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= L; k += 8)
        for (int l = 0; l < 8; l++)
            part[l] += x[k + l];
    for (; k < L; k++)
        part[k % 8] += x[k];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* acc[c0, c1) += the column sums of the R rows x[r L + c] (a reduced axis
 * before a kept last axis): 32 columns at a time, held in registers over
 * blocks of at most 16 rows summed in float (as torch's float sums), each
 * block added to acc in double; 16-lane vectors (the wide clone) measured
 * 0.67 of the time of the 8-double-lane loop, the AVX2 clone 0.86. The
 * reference, row after row into acc in double: the kept-row loop of
 * sum_f32_range. */
#define SUM_COLUMN_ROWS 16
AI_WIDE_CLONES static void sum_columns_f32(double *acc, const float *x, int64_t R, int64_t L,
                                   int64_t c0, int64_t c1)
{
    for (int64_t r0 = 0; r0 < R; r0 += SUM_COLUMN_ROWS) {
        const int64_t r1 = r0 + SUM_COLUMN_ROWS < R ? r0 + SUM_COLUMN_ROWS : R;
        int64_t c = c0;
        for (; c + 32 <= c1; c += 32) {
            float a[32];
            for (int l = 0; l < 32; l++)
                a[l] = x[r0 * L + c + l];
            for (int64_t r = r0 + 1; r < r1; r++)
                for (int l = 0; l < 32; l++)
                    a[l] += x[r * L + c + l];
            for (int l = 0; l < 32; l++)
                acc[c + l] += a[l];
        }
        for (; c < c1; c++) {
            float a = x[r0 * L + c];
            for (int64_t r = r0 + 1; r < r1; r++)
                a += x[r * L + c];
            acc[c] += a;
        }
    }
}

AI_VECTOR_CLONES static void sum_f32_range(void *ctx, int64_t lo, int64_t hi)
{
    const sum_job *j = ctx;
    const reduce_plan *p = j->p;
    const int nd = p->nd, s = j->split;
    const int64_t L = nd ? p->shape[nd - 1] : 1, os = nd ? p->ostride[nd - 1] : 0;
    const int64_t c0 = s == nd - 1 ? lo : 0, c1 = s == nd - 1 ? hi : L;
    /* kept rows after a reduced axis: that axis's rows go as one block of
     * column sums (sum_columns_f32), the walk stops above it */
    const bool columns = os != 0 && nd >= 2 && p->ostride[nd - 2] == 0;
    const int last = columns ? nd - 3 : nd - 2; /* the innermost axis walked */
    int64_t idx[AI_MAX_DIMS] = {0}, xs[AI_MAX_DIMS], rows = 1, xo = 0, oo = 0, st = L;
    for (int d = nd - 2; d >= 0; d--) { /* input strides (contiguous) */
        xs[d] = st;
        st *= p->shape[d];
    }
    for (int d = 0; d <= last; d++) {
        rows *= d == s ? hi - lo : p->shape[d];
        idx[d] = d == s ? lo : 0;
        xo += idx[d] * xs[d];
        oo += idx[d] * p->ostride[d];
    }
    /* a reduced last axis after at most one kept axis: rows and outputs in a row */
    if (os == 0 && nd <= 2 && ai_sum_rows_v16(j->acc + oo, j->x + xo, rows, L))
        return;
    for (int64_t r = 0; r < rows && L > 0; r++) {
        const float *xr = j->x + xo;
        if (columns) {
            sum_columns_f32(j->acc + oo, xr, p->shape[nd - 2], L, c0, c1);
        } else if (os == 0) {
            j->acc[oo] += sum_row_f32(xr, L);
        } else {
            double *ar = j->acc + oo;
            for (int64_t k = c0; k < c1; k++)
                ar[k] += xr[k];
        }
        for (int d = last; d >= 0; d--) { /* the next row */
            const int64_t first = d == s ? lo : 0, end = d == s ? hi : p->shape[d];
            xo += xs[d];
            oo += p->ostride[d];
            if (++idx[d] < end)
                break;
            xo -= xs[d] * (end - first);
            oo -= p->ostride[d] * (end - first);
            idx[d] = first;
        }
    }
}

/* float32 sums on the pool where the input is large: split along the
 * outermost row axis whose outputs are kept, else along the columns of
 * rows that are kept; a full reduction stays on one thread. */
static void sum_f32(const reduce_plan *p, float *y, const float *x, double scale, double *acc)
{
    memset(acc, 0, sizeof(double) * (size_t)p->nout);
    sum_job j = {p, x, acc, -1};
    int64_t n = 1, numel = p->nd ? p->nout * p->count : 1;
    for (int d = 0; numel >= 2 * AI_GRAIN_ELEMS && d < p->nd && j.split < 0; d++)
        if (p->ostride[d] != 0 && p->shape[d] > 1 && (d < p->nd - 1 || p->shape[d] >= 64))
            j.split = d, n = p->shape[d];
    if (j.split < 0)
        sum_f32_range(&j, 0, 1);
    else
        ai_parallel_for(n, ai_grain_of(numel / n), sum_f32_range, &j);
    for (int64_t o = 0; o < p->nout; o++)
        y[o] = (float)(acc[o] * scale);
}

/* Max (sign 1) or min (sign -1); NaN wins, like torch. */
#define DEFINE_EXTREMUM(NAME, T)                                                       \
    static void NAME(const reduce_plan *p, T *y, const T *x, int sign)                 \
    {                                                                                  \
        for (int64_t o = 0; o < p->nout; o++)                                          \
            y[o] = (T)(sign > 0 ? -INFINITY : INFINITY);                               \
        FOR_ROWS(p, {                                                                  \
            const T *xr = x + xo;                                                      \
            for (int64_t j = 0; j < L; j++) {                                          \
                T v = xr[j], *m = &y[oo + j * os];                                     \
                if ((sign > 0 ? v > *m : v < *m) || v != v)                            \
                    *m = v;                                                            \
            }                                                                          \
        });                                                                            \
    }

DEFINE_EXTREMUM(extremum_f32, float)
DEFINE_EXTREMUM(extremum_f64, double)

/* Prod, L1, L2, SumSquare, LogSum, LogSumExp of floats, in double (acc:
 * nout doubles; LogSumExp first takes each output's max into mx). Empty:
 * Prod 1, the sums 0, LogSum(Exp) -inf. */
#define DEFINE_OTHER(NAME, T)                                                          \
    static void NAME(const reduce_plan *p, int kind, T *y, const T *x, double *acc,    \
                     double *mx)                                                       \
    {                                                                                  \
        for (int64_t o = 0; o < p->nout; o++) {                                        \
            acc[o] = kind == R_PROD;                                                   \
            mx[o] = -INFINITY;                                                         \
        }                                                                              \
        if (kind == R_LOGSUMEXP)                                                       \
            FOR_ROWS(p, {                                                              \
                for (int64_t j = 0; j < L; j++) {                                      \
                    double *m = &mx[oo + j * os];                                      \
                    if (x[xo + j] > *m || x[xo + j] != x[xo + j])                      \
                        *m = x[xo + j];                                                \
                }                                                                      \
            });                                                                        \
        FOR_ROWS(p, {                                                                  \
            for (int64_t j = 0; j < L; j++) {                                          \
                const double v = x[xo + j];                                            \
                double *a = &acc[oo + j * os];                                         \
                switch (kind) {                                                        \
                case R_PROD: *a *= v; break;                                           \
                case R_L1: *a += fabs(v); break;                                       \
                case R_LOGSUM: *a += v; break;                                         \
                case R_LOGSUMEXP: {                                                    \
                    const double m = mx[oo + j * os];                                  \
                    *a += isinf(m) ? (v == m) : exp(v - m);                            \
                    break;                                                             \
                }                                                                      \
                default: *a += v * v; /* L2, SumSquare */                              \
                }                                                                      \
            }                                                                          \
        });                                                                            \
        for (int64_t o = 0; o < p->nout; o++)                                          \
            y[o] = (T)(kind == R_L2 ? sqrt(acc[o])                                     \
                       : kind == R_LOGSUM ? log(acc[o])                                \
                       : kind == R_LOGSUMEXP ? (isinf(mx[o]) ? mx[o] : mx[o] + log(acc[o])) \
                                             : acc[o]);                                \
    }

DEFINE_OTHER(other_f32, float)
DEFINE_OTHER(other_f64, double)

/* Sum/Prod/Max/Min of integers of every width (Max/Min also of bool: any /
 * all) into acc (nout int64, in ai_int_order_key's order for Max/Min),
 * wrapping like torch, then stored. An empty max/min gives the dtype's
 * lowest / highest value. */
static void reduce_int(const reduce_plan *p, int kind, ai_tensor *y, const ai_tensor *x,
                       int64_t *acc)
{
    const ai_dtype dt = x->dtype;
    const int bits = dt == AI_BOOL ? 1 : 8 * (int)ai_dtype_size(dt);
    const bool uns = ai_dtype_is_unsigned(dt);
    /* the extremes as order keys */
    const int64_t lowest = dt == AI_U64 ? INT64_MIN
                           : uns        ? 0
                                        : (int64_t)(UINT64_MAX << (bits - 1));
    const int64_t highest = dt == AI_U64 ? INT64_MAX
                            : uns        ? (int64_t)(UINT64_MAX >> (64 - bits))
                                         : (int64_t)(UINT64_MAX >> (65 - bits));
    const int64_t init = kind == R_MAX ? lowest : (kind == R_MIN ? highest : kind == R_PROD);
    const bool order = kind == R_MAX || kind == R_MIN;
    for (int64_t o = 0; o < p->nout; o++)
        acc[o] = init;
    FOR_ROWS(p, {
        for (int64_t j = 0; j < L; j++) {
            int64_t v = ai_int_at(x, xo + j), *m = &acc[oo + j * os];
            if (dt == AI_BOOL)
                v = v != 0;
            if (kind == R_SUM)
                *m = (int64_t)((uint64_t)*m + (uint64_t)v); /* wraps like torch */
            else if (kind == R_PROD)
                *m = (int64_t)((uint64_t)*m * (uint64_t)v);
            else if (kind == R_MAX ? ai_int_order_key(dt, v) > *m : ai_int_order_key(dt, v) < *m)
                *m = ai_int_order_key(dt, v);
        }
    });
    for (int64_t o = 0; o < p->nout; o++)
        ai_int_set(y, o, order ? ai_int_order_key(dt, acc[o]) : acc[o]);
}

static ai_status reduce_forward(ai_ctx *c)
{
    const int kind = ((const reduce_params *)c->node->params)->kind;
    const ai_tensor *x = c->in[0];
    ai_tensor *y = c->out[0];
    reduce_plan p;
    ai_status st = reduce_setup(c, &p);
    if (st)
        return st;
    if (p.noop) {
        if (ai_tensor_nbytes(x))
            memcpy(y->data, x->data, ai_tensor_nbytes(x));
        return AI_OK;
    }
    if (p.nout == 0)
        return AI_OK;
    double *acc = c->workspace, *comp = acc + p.nout;
    const double scale = kind == R_MEAN ? 1.0 / (double)p.count : 1.0; /* empty: NaN */
    if (!ai_dtype_is_float(x->dtype))
        reduce_int(&p, kind, y, x, c->workspace);
    else if ((kind == R_SUM || kind == R_MEAN) && x->dtype == AI_F32)
        sum_f32(&p, y->data, x->data, scale, acc);
    else if (kind == R_SUM || kind == R_MEAN)
        sum_f64(&p, y->data, x->data, scale, acc, comp);
    else if (kind >= R_PROD && x->dtype == AI_F32)
        other_f32(&p, kind, y->data, x->data, acc, comp);
    else if (kind >= R_PROD)
        other_f64(&p, kind, y->data, x->data, acc, comp);
    else if (x->dtype == AI_F32)
        extremum_f32(&p, y->data, x->data, kind == R_MAX ? 1 : -1);
    else
        extremum_f64(&p, y->data, x->data, kind == R_MAX ? 1 : -1);
    return AI_OK;
}

/* ---------------------------------------------------------------- backward */

/* dx += dy * scale, dy broadcast over the reduced axes: input rows [r0, r1)
 * on the thread pool, each a vectorised add of one dy value (reduced row) or
 * of a dy row (kept row); no product when scale is 1 (Sum). */
typedef struct {
    const reduce_plan *p;
    void *dx;
    const void *dy;
    double scale;
    bool f64, assign; /* assign: dx = (Sum, Mean only), not += */
} sum_back_job;

#define DEFINE_SUM_BACK(NAME, T)                                                       \
    AI_VECTOR_CLONES static void NAME(const reduce_plan *p, T *dx, const T *dy,        \
                                      T scale, bool assign, int64_t r0, int64_t r1)    \
    {                                                                                  \
        const int nd = p->nd;                                                          \
        const int64_t L = nd ? p->shape[nd - 1] : 1, os = nd ? p->ostride[nd - 1] : 0; \
        int64_t idx[AI_MAX_DIMS] = {0}, oo = 0;                                        \
        for (int64_t d = nd - 2, rest = r0; d >= 0; rest /= p->shape[d--]) {          \
            idx[d] = rest % p->shape[d];                                               \
            oo += idx[d] * p->ostride[d];                                              \
        }                                                                              \
        for (int64_t r = r0; r < r1; r++) {                                            \
            T *g = dx + r * L;                                                         \
            const T *d = dy + oo;                                                      \
            if (os == 0) {                                                             \
                const T v = scale == 1 ? d[0] : d[0] * scale;                          \
                if (assign)                                                            \
                    for (int64_t j = 0; j < L; j++)                                    \
                        g[j] = v;                                                      \
                else                                                                   \
                    for (int64_t j = 0; j < L; j++)                                    \
                        g[j] += v;                                                     \
            } else if (scale == 1 && assign) {                                         \
                memcpy(g, d, sizeof(T) * (size_t)L);                                   \
            } else if (scale == 1) {                                                   \
                for (int64_t j = 0; j < L; j++)                                        \
                    g[j] += d[j];                                                      \
            } else if (assign) {                                                       \
                for (int64_t j = 0; j < L; j++)                                        \
                    g[j] = d[j] * scale;                                               \
            } else {                                                                   \
                for (int64_t j = 0; j < L; j++)                                        \
                    g[j] += d[j] * scale;                                              \
            }                                                                          \
            for (int dd = nd - 2; dd >= 0; dd--) {                                     \
                oo += p->ostride[dd];                                                  \
                if (++idx[dd] < p->shape[dd])                                          \
                    break;                                                             \
                oo -= p->ostride[dd] * p->shape[dd];                                   \
                idx[dd] = 0;                                                           \
            }                                                                          \
        }                                                                              \
    }

DEFINE_SUM_BACK(sum_back_f32, float)
DEFINE_SUM_BACK(sum_back_f64, double)

static void sum_back_range(void *ctx, int64_t r0, int64_t r1)
{
    const sum_back_job *j = ctx;
    if (j->f64)
        sum_back_f64(j->p, j->dx, j->dy, j->scale, j->assign, r0, r1);
    else
        sum_back_f32(j->p, j->dx, j->dy, (float)j->scale, j->assign, r0, r1);
}

/* torch.amax/amin: dx += dy / count * (x == y), count = #(x == y) per output
 * (a NaN result matches nothing: 0 * inf gives NaN, as in torch). w: nout T. */
#define DEFINE_EXTREMUM_BACK(NAME, T)                                                  \
    static void NAME(const reduce_plan *p, T *dx, const T *dy, const T *x, const T *y, \
                     T *w)                                                             \
    {                                                                                  \
        if (p->nout == 0)                                                              \
            return; /* an empty output: no workspace either */                         \
        memset(w, 0, sizeof(T) * (size_t)p->nout);                                     \
        FOR_ROWS(p, {                                                                  \
            for (int64_t j = 0; j < L; j++)                                            \
                w[oo + j * os] += (T)(x[xo + j] == y[oo + j * os]);                    \
        });                                                                            \
        for (int64_t o = 0; o < p->nout; o++)                                          \
            w[o] = dy[o] / w[o];                                                       \
        FOR_ROWS(p, {                                                                  \
            for (int64_t j = 0; j < L; j++)                                            \
                dx[xo + j] += w[oo + j * os] * (T)(x[xo + j] == y[oo + j * os]);       \
        });                                                                            \
    }

DEFINE_EXTREMUM_BACK(extremum_back_f32, float)
DEFINE_EXTREMUM_BACK(extremum_back_f64, double)

/* dx += dy * d(y)/d(x), as torch: L1 sign(x) (0 at 0); L2 x / y (0 where
 * y = 0, torch's norm); SumSquare 2x; LogSum 1 / sum (w: the sums, also
 * where the log is NaN); LogSumExp exp(x - y);
 * Prod the product of the others: y / x without zeros, else the product of
 * the nonzero values for the one zero, 0 for the rest (w: zeros per output,
 * nz: the product of the nonzero values; nout doubles each). */
#define DEFINE_OTHER_BACK(NAME, T)                                                     \
    static void NAME(const reduce_plan *p, int kind, T *dx, const T *dy, const T *x,   \
                     const T *y, double *w, double *nz)                                \
    {                                                                                  \
        if (kind == R_PROD || kind == R_LOGSUM) {                                      \
            for (int64_t o = 0; o < p->nout; o++) {                                    \
                w[o] = 0;                                                              \
                nz[o] = 1;                                                             \
            }                                                                          \
            FOR_ROWS(p, {                                                              \
                for (int64_t j = 0; j < L; j++) {                                      \
                    const double v = x[xo + j];                                        \
                    if (kind == R_LOGSUM)                                              \
                        w[oo + j * os] += v;                                           \
                    else if (v == 0)                                                   \
                        w[oo + j * os] += 1;                                           \
                    else                                                               \
                        nz[oo + j * os] *= v;                                          \
                }                                                                      \
            });                                                                        \
        }                                                                              \
        FOR_ROWS(p, {                                                                  \
            for (int64_t j = 0; j < L; j++) {                                          \
                const int64_t o = oo + j * os;                                         \
                const double v = x[xo + j], g = dy[o], r = y[o];                       \
                double d;                                                              \
                switch (kind) {                                                        \
                case R_L1: d = v > 0 ? g : (v < 0 ? -g : 0.0); break;                  \
                case R_L2: d = r == 0 ? 0.0 : g * v / r; break;                        \
                case R_SUMSQ: d = 2 * v * g; break;                                    \
                case R_LOGSUM: d = g / w[o]; break;                                    \
                case R_LOGSUMEXP: d = g * exp(v - r); break;                           \
                default: /* R_PROD */                                                  \
                    d = w[o] == 0 ? g * (r / v)                                        \
                        : (w[o] == 1 && v == 0 ? g * nz[o] : 0.0);                     \
                }                                                                      \
                dx[xo + j] += (T)d;                                                    \
            }                                                                          \
        });                                                                            \
    }

DEFINE_OTHER_BACK(other_back_f32, float)
DEFINE_OTHER_BACK(other_back_f64, double)

static ai_status reduce_backward(ai_ctx *c)
{
    const int kind = ((const reduce_params *)c->node->params)->kind;
    ai_tensor *dx = c->din[0];
    const ai_tensor *dy = c->dout[0];
    reduce_plan p;
    ai_status st = reduce_setup(c, &p);
    if (st)
        return st;
    if (dx->dtype != AI_F32 && dx->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "gradient for %s data is not supported", ai_dtype_name(dx->dtype));
    if (p.noop) {
        ai_accumulate(dx, dy, c->din_assign[0]);
        return AI_OK;
    }
    if (kind == R_SUM || kind == R_MEAN) {
        sum_back_job j = {&p, dx->data, dy->data,
                          kind == R_MEAN ? 1.0 / (double)p.count : 1.0, dx->dtype == AI_F64,
                          c->din_assign[0]};
        const int64_t L = p.nd ? p.shape[p.nd - 1] : 1;
        if (L > 0)
            ai_parallel_for(ai_tensor_numel(dx) / L, ai_grain_of(L), sum_back_range, &j);
    } else if (kind >= R_PROD) {
        double *w = c->workspace;
        if (dx->dtype == AI_F32)
            other_back_f32(&p, kind, dx->data, dy->data, c->in[0]->data, c->out[0]->data, w,
                           w + p.nout);
        else
            other_back_f64(&p, kind, dx->data, dy->data, c->in[0]->data, c->out[0]->data, w,
                           w + p.nout);
    } else if (dx->dtype == AI_F32) {
        extremum_back_f32(&p, dx->data, dy->data, c->in[0]->data, c->out[0]->data,
                          c->workspace);
    } else {
        extremum_back_f64(&p, dx->data, dy->data, c->in[0]->data, c->out[0]->data,
                          c->workspace);
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- shape */

static ai_status reduce_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const int kind = ((const reduce_params *)c->node->params)->kind;
    const ai_dtype dt = c->in[0]->dtype;
    const bool ints = !ai_dtype_is_float(dt) && dt != AI_BOOL && kind <= R_PROD &&
                      kind != R_MEAN;
    const bool bools = dt == AI_BOOL && (kind == R_MAX || kind == R_MIN);
    if (dt != AI_F32 && dt != AI_F64 && !ints && !bools)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; not supported by %s",
                             ai_dtype_name(dt), c->node->op_type);
    reduce_plan p;
    ai_status st = reduce_setup(c, &p);
    if (st)
        return st;
    out[0].dtype = dt;
    out[0].ndim = p.out_nd;
    memcpy(out[0].shape, p.out_shape, sizeof(int64_t) * (size_t)p.out_nd);
    *ws = 2 * sizeof(double) * (size_t)p.nout; /* sums: value and compensation */
    return AI_OK;
}

static ai_status reduce_init(ai_node *n)
{
    static const char *names[] = {"ReduceSum",    "ReduceMean",     "ReduceMax", "ReduceMin",
                                  "ReduceProd",   "ReduceL1",       "ReduceL2",  "ReduceSumSquare",
                                  "ReduceLogSum", "ReduceLogSumExp"};
    reduce_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    for (int k = 0; k <= R_LOGSUMEXP; k++)
        if (strcmp(n->op_type, names[k]) == 0)
            p->kind = k;
    return AI_OK;
}

/* ---------------------------------------------------------------- ArgMax, ArgMin, CumSum, CumProd */

/* X seen as (outer, L, inner) around `axis`. */
static ai_status axis_split(const ai_ctx *c, int64_t axis, int *a, int64_t *outer, int64_t *L,
                            int64_t *inner)
{
    const ai_tensor *x = c->in[0];
    ai_status st = ai_norm_axis(c->node, axis, x->ndim ? x->ndim : 1, a);
    if (st)
        return st;
    *outer = *inner = 1;
    *L = x->ndim ? x->shape[*a] : 1;
    for (int d = 0; d < x->ndim; d++)
        if (d < *a)
            *outer *= x->shape[d];
        else if (d > *a)
            *inner *= x->shape[d];
    return AI_OK;
}

/* The index of the first (select_last_index: last) largest or smallest value
 * along `axis`, int64; NaN counts as the largest and the smallest, like
 * torch.argmax and numpy. No gradient. */
static ai_status arg_setup(const ai_ctx *c, int *a, int64_t *outer, int64_t *L, int64_t *inner,
                           int64_t *keep, int64_t *last)
{
    int64_t axis;
    ai_status st = ai_attr_int(c->node, "axis", 0, &axis);
    if (!st)
        st = ai_attr_int(c->node, "keepdims", 1, keep);
    if (!st)
        st = ai_attr_int(c->node, "select_last_index", 0, last);
    if (!st)
        st = axis_split(c, axis, a, outer, L, inner);
    if (!st && *L == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "axis %d has no elements", *a);
    return st;
}

static ai_status arg_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    if (x->dtype == AI_BOOL || ai_dtype_is_half(x->dtype))
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; not supported",
                             ai_dtype_name(x->dtype));
    int a;
    int64_t outer, L, inner, keep, last;
    ai_status st = arg_setup(c, &a, &outer, &L, &inner, &keep, &last);
    if (st)
        return st;
    out[0].dtype = AI_I64;
    out[0].ndim = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != a || keep)
            out[0].shape[out[0].ndim++] = d == a ? 1 : x->shape[d];
    return AI_OK;
}

static ai_status arg_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    int a;
    int64_t outer, L, inner, keep, last;
    ai_status st = arg_setup(c, &a, &outer, &L, &inner, &keep, &last);
    if (st)
        return st;
    const bool max = strcmp(c->node->op_type, "ArgMax") == 0, flt = ai_dtype_is_float(x->dtype);
    int64_t *y = c->out[0]->data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const int64_t base = o * L * inner + i;
            int64_t best = 0;
            for (int64_t k = 1; k < L; k++) {
                bool better;
                if (flt) {
                    const double v = ai_tensor_get_flat(x, base + k * inner);
                    const double b = ai_tensor_get_flat(x, base + best * inner);
                    better = b != b ? (last && v != v)
                                    : (v != v || (max ? v > b : v < b) || (last && v == b));
                } else {
                    const int64_t v = ai_int_order_key(
                        x->dtype, ai_tensor_get_flat_i64(x, base + k * inner));
                    const int64_t b = ai_int_order_key(
                        x->dtype, ai_tensor_get_flat_i64(x, base + best * inner));
                    better = (max ? v > b : v < b) || (last && v == b);
                }
                if (better)
                    best = k;
            }
            y[o * inner + i] = best;
        }
    return AI_OK;
}

/* CumSum and CumProd (axis: a constant input; exclusive, reverse), in double
 * (int64 for integers, wrapping); an exclusive scan starts at 0 (1).
 * CumSum's backward is the cumulative sum of dy in the other direction, with
 * the same exclusivity. CumProd's backward divides by nothing, so zeros in x
 * give the exact gradient (torch.cumprod's): along the scan order n,
 * dx[n] = (x[0] ... x[n-1]) * S[n] with S[n] = dy[n] + x[n+1] * S[n+1]
 * (inclusive) or S[n] = dy[n+1] + x[n+1] * S[n+1] (exclusive), S past the
 * end 0; the prefix products of a line wait in the workspace. */
static ai_status cum_setup(const ai_ctx *c, int *a, int64_t *outer, int64_t *L, int64_t *inner)
{
    int64_t axis;
    ai_status st = ai_ctx_int_scalar(c, 1, "axis", &axis);
    return st ? st : axis_split(c, axis, a, outer, L, inner);
}

static void set_float(ai_tensor *t, int64_t i, double v)
{
    if (t->dtype == AI_F32)
        ((float *)t->data)[i] = (float)v;
    else
        ((double *)t->data)[i] = v;
}

static bool is_cumprod(const ai_ctx *c)
{
    return strcmp(c->node->op_type, "CumProd") == 0;
}

static void cum_run(const ai_tensor *x, ai_tensor *y, int64_t outer, int64_t L, int64_t inner,
                    bool prod, bool exclusive, bool reverse, bool add)
{
    const bool flt = ai_dtype_is_float(x->dtype);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double s = prod;
            uint64_t si = prod;
            for (int64_t n = 0; n < L; n++) {
                const int64_t k = reverse ? L - 1 - n : n;
                const int64_t at = (o * L + k) * inner + i;
                if (flt) {
                    const double v = ai_tensor_get_flat(x, at);
                    if (!exclusive)
                        s = prod ? s * v : s + v;
                    set_float(y, at, add ? ai_tensor_get_flat(y, at) + s : s);
                    if (exclusive)
                        s = prod ? s * v : s + v;
                } else {
                    const uint64_t v = (uint64_t)ai_tensor_get_flat_i64(x, at);
                    if (!exclusive)
                        si = prod ? si * v : si + v;
                    if (y->dtype == AI_I64)
                        ((int64_t *)y->data)[at] = (int64_t)si;
                    else
                        ((int32_t *)y->data)[at] = (int32_t)(int64_t)si;
                    if (exclusive)
                        si = prod ? si * v : si + v;
                }
            }
        }
}

static void cumprod_grad(const ai_tensor *x, const ai_tensor *dy, ai_tensor *dx, double *pre,
                         int64_t outer, int64_t L, int64_t inner, bool exclusive, bool reverse,
                         bool assign)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
#define AT(n) ((o * L + (reverse ? L - 1 - (n) : (n))) * inner + i)
            pre[0] = 1;
            for (int64_t n = 1; n < L; n++)
                pre[n] = pre[n - 1] * ai_tensor_get_flat(x, AT(n - 1));
            double s = 0;
            for (int64_t n = L - 1; n >= 0; n--) {
                if (n + 1 < L)
                    s = (exclusive ? ai_tensor_get_flat(dy, AT(n + 1)) : 0) +
                        ai_tensor_get_flat(x, AT(n + 1)) * s;
                if (!exclusive)
                    s += ai_tensor_get_flat(dy, AT(n));
                const double g = pre[n] * s;
                set_float(dx, AT(n), assign ? g : ai_tensor_get_flat(dx, AT(n)) + g);
            }
#undef AT
        }
}

static ai_status cum_flags(const ai_ctx *c, int64_t *exclusive, int64_t *reverse)
{
    ai_status st = ai_attr_int(c->node, "exclusive", 0, exclusive);
    return st ? st : ai_attr_int(c->node, "reverse", 0, reverse);
}

static ai_status cum_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const ai_tensor *x = c->in[0];
    const ai_dtype dt = x->dtype;
    if (dt != AI_F32 && dt != AI_F64 && dt != AI_I32 && dt != AI_I64)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; not supported",
                             ai_dtype_name(dt));
    int a;
    int64_t outer, L, inner, e, r;
    ai_status st = cum_setup(c, &a, &outer, &L, &inner);
    if (!st)
        st = cum_flags(c, &e, &r);
    if (!st && is_cumprod(c))
        *ws = (size_t)L * sizeof(double);
    out[0].dtype = dt;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof out[0].shape);
    return st;
}

static ai_status cum_forward(ai_ctx *c)
{
    int a;
    int64_t outer, L, inner, e, r;
    ai_status st = cum_setup(c, &a, &outer, &L, &inner);
    if (!st && !(st = cum_flags(c, &e, &r)))
        cum_run(c->in[0], c->out[0], outer, L, inner, is_cumprod(c), e, r, false);
    return st;
}

static ai_status cum_backward(ai_ctx *c)
{
    if (!c->din[0])
        return AI_OK;
    int a;
    int64_t outer, L, inner, e, r;
    ai_status st = cum_setup(c, &a, &outer, &L, &inner);
    if (st || (st = cum_flags(c, &e, &r)))
        return st;
    if (is_cumprod(c))
        cumprod_grad(c->in[0], c->dout[0], c->din[0], c->workspace, outer, L, inner, e, r,
                     c->din_assign[0]);
    else
        cum_run(c->dout[0], c->din[0], outer, L, inner, false, e, !r, !c->din_assign[0]);
    return AI_OK;
}

/* TopK (K: a constant input; axis, largest, sorted): Values and int64
 * Indices of the K largest (smallest) along axis, in order; equal values by
 * index, NaN the largest (torch.topk). Backward adds dValues at Indices.
 * State: one line of (value, index) pairs to sort. */
typedef struct {
    double v;
    int64_t i;
} topk_item;

static int topk_desc(const void *a, const void *b)
{
    const topk_item *x = a, *y = b;
    const bool xn = x->v != x->v, yn = y->v != y->v;
    if (xn != yn)
        return xn ? -1 : 1;
    if (!xn && x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

static int topk_asc(const void *a, const void *b)
{
    const topk_item *x = a, *y = b;
    const bool xn = x->v != x->v, yn = y->v != y->v;
    if (xn != yn)
        return xn ? 1 : -1;
    if (!xn && x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}

static ai_status topk_setup(const ai_ctx *c, int *a, int64_t *outer, int64_t *L, int64_t *inner,
                            int64_t *k, int64_t *largest)
{
    int64_t axis;
    ai_status st = ai_attr_int(c->node, "axis", -1, &axis);
    if (!st)
        st = ai_attr_int(c->node, "largest", 1, largest);
    if (!st)
        st = axis_split(c, axis, a, outer, L, inner);
    if (!st)
        st = ai_ctx_int_scalar(c, 1, "K", k);
    if (st)
        return st;
    if (*k < 0 || *k > *L)
        return ai_node_error(c->node, AI_ERR_VALUE, "K = %lld for an axis of %lld elements",
                             (long long)*k, (long long)*L);
    return AI_OK;
}

static ai_status topk_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    const ai_tensor *x = c->in[0];
    if (x->dtype == AI_BOOL || x->dtype == AI_F16)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; not supported",
                             ai_dtype_name(x->dtype));
    if (x->ndim == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank 0");
    int a;
    int64_t outer, L, inner, k, largest;
    ai_status st = topk_setup(c, &a, &outer, &L, &inner, &k, &largest);
    if (st)
        return st;
    for (int o = 0; o < 2; o++) {
        out[o].dtype = o ? AI_I64 : x->dtype;
        out[o].ndim = x->ndim;
        memcpy(out[o].shape, x->shape, sizeof out[o].shape);
        out[o].shape[a] = k;
    }
    *state = (size_t)L * sizeof(topk_item);
    return AI_OK;
}

static ai_status topk_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    int a;
    int64_t outer, L, inner, k, largest;
    ai_status st = topk_setup(c, &a, &outer, &L, &inner, &k, &largest);
    if (st)
        return st;
    topk_item *line = c->state;
    ai_tensor *vals = c->out[0];
    int64_t *idx = c->out[1]->data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            for (int64_t n = 0; n < L; n++) {
                const int64_t at = (o * L + n) * inner + i;
                line[n].v = ai_tensor_get_flat(x, at); /* (uint64 by value) */
                line[n].i = n;
            }
            qsort(line, (size_t)L, sizeof *line, largest ? topk_desc : topk_asc);
            for (int64_t n = 0; n < k; n++) {
                const int64_t to = (o * k + n) * inner + i;
                const int64_t from = (o * L + line[n].i) * inner + i;
                const size_t es = ai_dtype_size(x->dtype);
                memcpy((char *)vals->data + to * (int64_t)es,
                       (const char *)x->data + from * (int64_t)es, es);
                idx[to] = line[n].i;
            }
        }
    return AI_OK;
}

static ai_status topk_backward(ai_ctx *c)
{
    ai_tensor *dx = c->din[0];
    if (!dx)
        return AI_OK;
    int a;
    int64_t outer, L, inner, k, largest;
    ai_status st = topk_setup(c, &a, &outer, &L, &inner, &k, &largest);
    if (st)
        return st;
    if (c->din_assign[0] && ai_tensor_nbytes(dx))
        memset(dx->data, 0, ai_tensor_nbytes(dx));
    const int64_t *idx = c->out[1]->data;
    const ai_tensor *dv = c->dout[0];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t n = 0; n < k; n++)
            for (int64_t i = 0; i < inner; i++) {
                const int64_t from = (o * k + n) * inner + i;
                const int64_t to = (o * L + idx[from]) * inner + i;
                set_float(dx, to, ai_tensor_get_flat(dx, to) + ai_tensor_get_flat(dv, from));
            }
    return AI_OK;
}

static const ai_op_def op_topk = {"TopK", "", 2, 2, 2, 2,
                                  AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_X | AI_OP_UNSIGNED,
                                  NULL, topk_shape, topk_forward, topk_backward};
static const ai_op_def op_argmax = {"ArgMax", "", 1, 1, 1, 1, AI_OP_UNSIGNED, NULL, arg_shape,
                                    arg_forward, NULL};
static const ai_op_def op_argmin = {"ArgMin", "", 1, 1, 1, 1, AI_OP_UNSIGNED, NULL, arg_shape,
                                    arg_forward, NULL};
static const ai_op_def op_cumsum = {"CumSum", "", 2, 2, 1, 1,
                                    AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
                                    NULL, cum_shape, cum_forward, cum_backward};
static const ai_op_def op_cumprod = {"CumProd", "", 2, 2, 1, 1,
                                     AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_Y, NULL, cum_shape,
                                     cum_forward, cum_backward};

/* Sum and Mean write a fresh gradient without zeroing it first (din_assign) */
#define REDUCE_OP(VAR, NAME, FLAGS)                                                    \
    static const ai_op_def VAR = {NAME, "", 1, 2, 1, 1, AI_OP_UNSIGNED | (FLAGS),       \
                                  reduce_init, reduce_shape, reduce_forward,            \
                                  reduce_backward};

REDUCE_OP(op_reduce_sum, "ReduceSum", AI_OP_GRAD_ASSIGN(1))
REDUCE_OP(op_reduce_mean, "ReduceMean", AI_OP_GRAD_ASSIGN(1))
REDUCE_OP(op_reduce_max, "ReduceMax", 0)
REDUCE_OP(op_reduce_min, "ReduceMin", 0)
REDUCE_OP(op_reduce_prod, "ReduceProd", 0)
REDUCE_OP(op_reduce_l1, "ReduceL1", 0)
REDUCE_OP(op_reduce_l2, "ReduceL2", 0)
REDUCE_OP(op_reduce_sum_square, "ReduceSumSquare", 0)
REDUCE_OP(op_reduce_log_sum, "ReduceLogSum", 0)
REDUCE_OP(op_reduce_log_sum_exp, "ReduceLogSumExp", 0)

const ai_op_def *const ai_ops_reduce[] = {
    &op_reduce_sum, &op_reduce_mean, &op_reduce_max, &op_reduce_min, &op_reduce_prod,
    &op_reduce_l1, &op_reduce_l2, &op_reduce_sum_square, &op_reduce_log_sum,
    &op_reduce_log_sum_exp, &op_argmax, &op_argmin, &op_cumsum, &op_cumprod, &op_topk,
    NULL,
};
