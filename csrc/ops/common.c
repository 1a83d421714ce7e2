/*
 * common.c — helpers shared by operators: numpy broadcasting (shapes,
 * strides, and the reduction of a gradient back to a broadcast operand) and
 * gradient accumulation.
 */
#include <string.h>

#include "../graph.h"
#include "../kernels/simd.h"
#include "../parallel.h"

ai_status ai_broadcast_shape(const ai_node *n, int na, const int64_t *a, int nb,
                             const int64_t *b, int *nout, int64_t *out)
{
    int nd = na > nb ? na : nb;
    for (int i = 0; i < nd; i++) {
        int64_t da = i < nd - na ? 1 : a[i - (nd - na)];
        int64_t db = i < nd - nb ? 1 : b[i - (nd - nb)];
        if (da != db && da != 1 && db != 1)
            return ai_node_error(n, AI_ERR_VALUE,
                                 "shapes cannot be broadcast: dimension %d is %lld on one "
                                 "side and %lld on the other", i, (long long)da,
                                 (long long)db);
        out[i] = da == 1 ? db : da;
    }
    *nout = nd;
    return AI_OK;
}

void ai_broadcast_strides(int nin, const int64_t *in, int nout, const int64_t *out,
                          int64_t *strides)
{
    int64_t s = 1;
    for (int i = nout - 1; i >= 0; i--) {
        int j = i - (nout - nin);
        if (j < 0 || (in[j] == 1 && out[i] != 1)) {
            strides[i] = 0;
        } else {
            strides[i] = s;
        }
        if (j >= 0)
            s *= in[j];
    }
}

#define DEFINE_REDUCE_TO(NAME, T)                                                   \
    static void NAME(T *dst, const int64_t *dstrides, const T *src, int nd,         \
                     const int64_t *shape)                                          \
    {                                                                               \
        int64_t idx[AI_MAX_DIMS] = {0}, n = 1, off = 0;                             \
        for (int d = 0; d < nd; d++)                                                \
            n *= shape[d];                                                          \
        const int64_t inner = nd ? shape[nd - 1] : 1;                               \
        const int64_t is = nd ? dstrides[nd - 1] : 0;                               \
        for (int64_t k = 0; k < n; k += inner) {                                    \
            T *d0 = dst + off;                                                      \
            const T *s0 = src + k;                                                  \
            if (is == 0) {                                                          \
                T acc = 0;                                                          \
                for (int64_t j = 0; j < inner; j++)                                 \
                    acc += s0[j];                                                   \
                *d0 += acc;                                                         \
            } else {                                                                \
                for (int64_t j = 0; j < inner; j++)                                 \
                    d0[j] += s0[j];                                                 \
            }                                                                       \
            for (int d = nd - 2; d >= 0; d--) {                                     \
                off += dstrides[d];                                                 \
                if (++idx[d] < shape[d])                                            \
                    break;                                                          \
                off -= dstrides[d] * shape[d];                                      \
                idx[d] = 0;                                                         \
            }                                                                       \
        }                                                                           \
    }

DEFINE_REDUCE_TO(reduce_to_f32, float)
DEFINE_REDUCE_TO(reduce_to_f64, double)

/* dst (N) += the R rows of src (R, N) (a bias's or a position embedding's
 * gradient): column blocks on the pool, each column added row after row as
 * reduce_to_* adds it (the same sums at any thread count). */
typedef struct {
    bool f64;
    void *dst;
    const void *src;
    int64_t R, N;
} sum_rows_job;

#define DEFINE_SUM_ROWS(NAME, T)                                                    \
    AI_VECTOR_CLONES static void NAME(T *dst, const T *src, int64_t R, int64_t N,   \
                                      int64_t lo, int64_t hi)                       \
    {                                                                               \
        for (int64_t r = 0; r < R; r++) {                                           \
            const T *row = src + r * N;                                             \
            for (int64_t j = lo; j < hi; j++)                                       \
                dst[j] += row[j];                                                   \
        }                                                                           \
    }

DEFINE_SUM_ROWS(sum_rows_f32, float)
DEFINE_SUM_ROWS(sum_rows_f64, double)

static void sum_rows_range(void *ctx, int64_t lo, int64_t hi)
{
    const sum_rows_job *j = ctx;
    if (j->f64)
        sum_rows_f64(j->dst, j->src, j->R, j->N, lo, hi);
    else
        sum_rows_f32(j->dst, j->src, j->R, j->N, lo, hi);
}

void ai_reduce_to(ai_tensor *dst, const ai_tensor *src, bool assign)
{
    int64_t strides[AI_MAX_DIMS];
    if (assign && ai_tensor_numel(dst)) /* dst elements are sums over several rows */
        memset(dst->data, 0, ai_tensor_nbytes(dst));
    if (ai_tensor_numel(src) == 0)
        return;
    ai_broadcast_strides(dst->ndim, dst->shape, src->ndim, src->shape, strides);
    /* dst is src's trailing axes (axes of one element count either side),
     * the leading ones summed: src (R, N) summed over its rows, N = dst's
     * elements, in column blocks on the pool */
    int lead = 0;
    while (lead < src->ndim && (strides[lead] == 0 || src->shape[lead] == 1))
        lead++;
    int64_t N = 1;
    bool rows = lead > 0 && (src->dtype == AI_F32 || src->dtype == AI_F64);
    for (int d = src->ndim - 1; rows && d >= lead; d--) {
        rows = strides[d] == N || src->shape[d] == 1;
        N *= src->shape[d];
    }
    if (rows && N > 1) {
        sum_rows_job j = {src->dtype == AI_F64, dst->data, src->data, ai_tensor_numel(src) / N, N};
        ai_parallel_for(N, ai_grain_of(j.R), sum_rows_range, &j);
        return;
    }
    if (src->dtype == AI_F32)
        reduce_to_f32(dst->data, strides, src->data, src->ndim, src->shape);
    else if (src->dtype == AI_F64)
        reduce_to_f64(dst->data, strides, src->data, src->ndim, src->shape);
}

typedef struct {
    bool f64, assign;
    void *dst;
    const void *src;
} accumulate_job;

static void accumulate_range(void *ctx, int64_t lo, int64_t hi)
{
    const accumulate_job *j = ctx;
    if (j->assign) {
        size_t es = j->f64 ? sizeof(double) : sizeof(float);
        memcpy((char *)j->dst + (size_t)lo * es, (const char *)j->src + (size_t)lo * es,
               (size_t)(hi - lo) * es);
    } else if (j->f64) {
        double *d = j->dst;
        const double *s = j->src;
        for (int64_t i = lo; i < hi; i++)
            d[i] += s[i];
    } else {
        float *d = j->dst;
        const float *s = j->src;
        for (int64_t i = lo; i < hi; i++)
            d[i] += s[i];
    }
}

/* the half types: added in float32, rounded once */
static void accumulate_half(ai_tensor *dst, const ai_tensor *src, bool assign)
{
    const int64_t n = ai_tensor_numel(dst);
    if (n == 0)
        return;
    if (assign) {
        memcpy(dst->data, src->data, (size_t)n * 2);
        return;
    }
    float a[256], b[256];
    uint16_t *d = dst->data;
    const uint16_t *s = src->data;
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t m = n - i < 256 ? n - i : 256;
        ai_half_to_f32(dst->dtype, d + i, a, m);
        ai_half_to_f32(src->dtype, s + i, b, m);
        for (int64_t k = 0; k < m; k++)
            a[k] += b[k];
        ai_f32_to_half(dst->dtype, a, d + i, m);
    }
}

void ai_accumulate(ai_tensor *dst, const ai_tensor *src, bool assign)
{
    if (ai_dtype_is_half(dst->dtype) && src->dtype == dst->dtype) {
        accumulate_half(dst, src, assign);
        return;
    }
    if (dst->dtype != AI_F32 && dst->dtype != AI_F64)
        return;
    accumulate_job j = {dst->dtype == AI_F64, assign, dst->data, src->data};
    ai_parallel_for(ai_tensor_numel(dst), AI_GRAIN_ELEMS, accumulate_range, &j);
}

ai_status ai_ctx_int_scalar(const ai_ctx *c, int i, const char *name, int64_t *out)
{
    const ai_tensor *t = ai_ctx_const(c, i);
    if (!t && i < c->n_in && c->in[i] && c->in[i]->data) /* at run time */
        t = c->in[i];
    if (!t)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "%s input must be a constant",
                             name);
    if (ai_tensor_numel(t) != 1 || ai_dtype_is_float(t->dtype) || t->dtype == AI_BOOL)
        return ai_node_error(c->node, AI_ERR_VALUE, "%s must be one integer", name);
    *out = ai_tensor_get_flat_i64(t, 0);
    return AI_OK;
}

bool ai_dtype_from_onnx(int64_t code, ai_dtype *out)
{
    static const struct {
        int64_t code;
        ai_dtype dt;
    } map[] = {
        {1, AI_F32}, {2, AI_U8}, {3, AI_I8}, {5, AI_I16}, {6, AI_I32},
        {7, AI_I64}, {9, AI_BOOL}, {10, AI_F16}, {11, AI_F64}, {4, AI_U16},
        {12, AI_U32}, {13, AI_U64}, {17, AI_F8E4M3FN}, {18, AI_F8E4M3FNUZ},
        {19, AI_F8E5M2}, {20, AI_F8E5M2FNUZ}, {21, AI_U4}, {22, AI_I4},
        {23, AI_F4E2M1}, {24, AI_F8E8M0}, {25, AI_U2}, {26, AI_I2}, {16, AI_BF16},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].code == code) {
            *out = map[i].dt;
            return true;
        }
    return false;
}
