/*
 * index_nd.c — operators that address slices of the data by index tuples:
 * GatherND (reads the slices) and ScatterND (writes or reduces updates
 * into them). Each row of `indices` is a tuple of k indices into the
 * leading dims of the data (after batch_dims), negative from the end; it
 * names one "place": the slice of the remaining dims at that position.
 * GatherND's backward adds dY back at the places; ScatterND's passes dY to
 * the data where nothing was written and gathers it for the updates (a
 * data-movement family: movement.h).
 *
 * torch's dynamo exporter writes GatherND for advanced indexing with
 * several index tensors (`x[i, j]`, as transformers' attention masks do),
 * ScatterND for index_put_.
 */
#include <string.h>

#include "movement.h"

/* ---------------------------------------------------------------- index tuples */

/* data (batches, places, slice) as seen by indices (batches, tuples, k):
 * data's dims are batch_dims b, the k indexed dims, then the slice's */
typedef struct {
    int b, k;
    int64_t batches;               /* data.shape[:b] */
    int64_t tuples;                /* indices.shape[b:-1]: tuples per batch */
    int64_t places;                /* data.shape[b:b+k]: places per batch */
    int64_t slice;                 /* data.shape[b+k:]: elements per place */
    int64_t pstride[AI_MAX_DIMS];  /* of the k indexed dims, in places */
} nd_plan;

/* Checks indices against data x for batch_dims b (0 for ScatterND). */
static ai_status nd_setup(const ai_ctx *c, const ai_tensor *x, const ai_tensor *idx,
                          int64_t b, nd_plan *p)
{
    if (idx->dtype != AI_I64 && idx->dtype != AI_I32)
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s; int64 or int32 expected",
                             ai_dtype_name(idx->dtype));
    if (idx->ndim < 1 || x->ndim < 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "data has rank %d, indices rank %d; "
                             ">= 1 expected", x->ndim, idx->ndim);
    const int bmax = (x->ndim < idx->ndim ? x->ndim : idx->ndim) - 1;
    if (b < 0 || b > bmax)
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "batch_dims is %lld; 0 to %d expected (below the ranks of data, "
                             "%d, and indices, %d)", (long long)b, bmax, x->ndim, idx->ndim);
    const int64_t k = idx->shape[idx->ndim - 1];
    if (k > x->ndim - b)
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "indices' last dim is %lld; at most %d (data's rank %d less "
                             "batch_dims %d) expected", (long long)k, x->ndim - (int)b,
                             x->ndim, (int)b);
    for (int d = 0; d < b; d++)
        if (idx->shape[d] != x->shape[d])
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "batch dim %d is %lld in indices, %lld in data", d,
                                 (long long)idx->shape[d], (long long)x->shape[d]);
    p->b = (int)b;
    p->k = (int)k;
    p->batches = ai_shape_prod(x->shape, 0, p->b);
    p->tuples = ai_shape_prod(idx->shape, p->b, idx->ndim - 1);
    p->places = ai_shape_prod(x->shape, p->b, p->b + p->k);
    p->slice = ai_shape_prod(x->shape, p->b + p->k, x->ndim);
    int64_t s = 1;
    for (int j = p->k - 1; j >= 0; j--) {
        p->pstride[j] = s;
        s *= x->shape[p->b + j];
    }
    return AI_OK;
}

/* The place of tuple t (of all batches' tuples), in places of the whole
 * data; AI_ERR_INDEX naming the node when an index is out of range. */
static ai_status nd_place(const ai_ctx *c, const ai_tensor *x, const ai_tensor *idx,
                          const nd_plan *p, int64_t t, int64_t *place)
{
    int64_t at = (t / p->tuples) * p->places;
    for (int j = 0; j < p->k; j++) {
        const int64_t i = t * p->k + j, dim = x->shape[p->b + j];
        int64_t v = idx->dtype == AI_I64 ? ((const int64_t *)idx->data)[i]
                                         : ((const int32_t *)idx->data)[i];
        if (v < -dim || v >= dim)
            return ai_node_error(c->node, AI_ERR_INDEX,
                                 "index %lld is out of range for axis %d of size %lld",
                                 (long long)v, p->b + j, (long long)dim);
        at += (v < 0 ? v + dim : v) * p->pstride[j];
    }
    *place = at;
    return AI_OK;
}

/* ---------------------------------------------------------------- GatherND */

/* data (batches, places, slice), indices (batches, tuples, k)
 *   -> Y (batches, tuples, slice): Y[t] = data[place(t)];
 * Y's shape is indices.shape[:-1] + data.shape[b+k:] */
static ai_status gnd_setup(const ai_ctx *c, nd_plan *p)
{
    int64_t b;
    ai_status st = ai_attr_int(c->node, "batch_dims", 0, &b);
    return st ? st : nd_setup(c, c->in[0], c->in[1], b, p);
}

static ai_status gnd_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    nd_plan p;
    ai_status st = gnd_setup(c, &p);
    if (st)
        return st;
    const int q = idx->ndim, tail = x->ndim - p.b - p.k, nd = q - 1 + tail;
    if (nd > AI_MAX_DIMS)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "output rank %d exceeds %d", nd,
                             AI_MAX_DIMS);
    int64_t s[AI_MAX_DIMS];
    memcpy(s, idx->shape, sizeof(int64_t) * (size_t)(q - 1));
    memcpy(s + q - 1, x->shape + p.b + p.k, sizeof(int64_t) * (size_t)tail);
    return ai_set_meta(&out[0], x->dtype, nd, s);
}

static ai_status gnd_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    nd_plan p;
    ai_status st = gnd_setup(c, &p);
    const size_t row = (size_t)p.slice * ai_dtype_size(x->dtype);
    for (int64_t t = 0; !st && t < p.batches * p.tuples; t++) {
        int64_t at = 0;
        if (!(st = nd_place(c, x, idx, &p, t, &at)) && row)
            memcpy((char *)c->out[0]->data + (size_t)t * row,
                   (const char *)x->data + (size_t)at * row, row);
    }
    return st;
}

/* dX[place(t)] += dY[t]; repeated places add up */
static ai_status gnd_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    ai_tensor *dx = c->din[0];
    nd_plan p;
    ai_status st = gnd_setup(c, &p);
    if (!st && dx)
        st = ai_check_grad_dtype(c, dx);
    if (st || !dx)
        return st;
    const size_t es = ai_dtype_size(dx->dtype);
    const ai_row_fn add = dx->dtype == AI_F32 ? ai_row_add_f32 : ai_row_add_f64;
    for (int64_t t = 0; !st && t < p.batches * p.tuples; t++) {
        int64_t at = 0;
        if (!(st = nd_place(c, x, idx, &p, t, &at)))
            add((char *)dx->data + (size_t)(at * p.slice) * es, 1,
                (const char *)c->dout[0]->data + (size_t)(t * p.slice) * es, 1, p.slice, es);
    }
    return st;
}

/* ---------------------------------------------------------------- ScatterND */

/* Y = data, then for each tuple t in order: Y[place(t)] = updates[t]
 * (reduction none: a repeated place keeps the last write), or
 * Y[place(t)] op= updates[t] (add, mul, max, min; a NaN wins max and min).
 * updates' shape is indices.shape[:-1] + data.shape[k:]. */
const char *const ai_scatter_red_names[] = {"none", "add", "mul", "max", "min"};

ai_status ai_scatter_reduction(const ai_ctx *c, int *red)
{
    const ai_tensor *x = c->in[0];
    ai_status st = ai_attr_choice(c->node, "reduction", "none", ai_scatter_red_names,
                                  RED_MIN + 1, red);
    if (st)
        return st;
    if (*red != RED_NONE && (ai_dtype_is_half(x->dtype) || x->dtype == AI_BOOL))
        return ai_node_error(c->node, AI_ERR_TYPE,
                             "reduction '%s' of %s is not supported (float32, float64 and "
                             "integers)", ai_scatter_red_names[*red], ai_dtype_name(x->dtype));
    return AI_OK;
}

static ai_status snd_setup(const ai_ctx *c, nd_plan *p, int *red)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1], *u = c->in[2];
    ai_status st = ai_scatter_reduction(c, red);
    if (st)
        return st;
    if (u->dtype != x->dtype)
        return ai_node_error(c->node, AI_ERR_TYPE, "updates are %s, data %s",
                             ai_dtype_name(u->dtype), ai_dtype_name(x->dtype));
    if ((st = nd_setup(c, x, idx, 0, p)))
        return st;
    const int q = idx->ndim, tail = x->ndim - p->k;
    bool ok = u->ndim == q - 1 + tail;
    for (int d = 0; ok && d < q - 1; d++)
        ok = u->shape[d] == idx->shape[d];
    for (int d = 0; ok && d < tail; d++)
        ok = u->shape[q - 1 + d] == x->shape[p->k + d];
    if (!ok)
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "updates must have shape indices.shape[:-1] + data.shape[%d:] "
                             "(rank %d), got rank %d", p->k, q - 1 + tail, u->ndim);
    return AI_OK;
}

/* The backward of reduction none needs one flag per place (the workspace). */
static ai_status snd_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    nd_plan p;
    int red;
    ai_status st = snd_setup(c, &p, &red);
    if (st)
        return st;
    if (red == RED_NONE && c->g->need_backward)
        *ws = (size_t)p.places;
    return ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
}

/* dst[j] op= src[j], j < n, in type T (integers in unsigned arithmetic: they wrap) */
#define REDUCE_ROW(T, U)                                                                 \
    do {                                                                                 \
        T *d_ = (T *)dst;                                                                \
        const T *s_ = (const T *)src;                                                    \
        for (int64_t j = 0; j < n; j++) {                                                \
            const T a = d_[j], v = s_[j];                                                \
            if (red == RED_ADD)                                                          \
                d_[j] = (T)((U)a + (U)v);                                                \
            else if (red == RED_MUL)                                                     \
                d_[j] = (T)((U)a * (U)v);                                                \
            else if (v != v || (red == RED_MAX ? v > a : v < a))                         \
                d_[j] = v;                                                               \
        }                                                                                \
    } while (0)

void ai_scatter_reduce_row(int red, ai_dtype dt, void *dst, const void *src, int64_t n)
{
    switch (dt) {
    case AI_F32: REDUCE_ROW(float, float); break;
    case AI_F64: REDUCE_ROW(double, double); break;
    case AI_I8: REDUCE_ROW(int8_t, uint32_t); break;
    case AI_U8: REDUCE_ROW(uint8_t, uint32_t); break;
    case AI_I16: REDUCE_ROW(int16_t, uint32_t); break;
    case AI_I32: REDUCE_ROW(int32_t, uint32_t); break;
    case AI_I64: REDUCE_ROW(int64_t, uint64_t); break;
    default: break; /* float16 and bool: refused by snd_setup */
    }
}

static ai_status snd_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1], *u = c->in[2];
    nd_plan p;
    int red;
    ai_status st = snd_setup(c, &p, &red);
    if (st)
        return st;
    const size_t row = (size_t)p.slice * ai_dtype_size(x->dtype);
    char *y = c->out[0]->data;
    if (ai_tensor_nbytes(x))
        memcpy(y, x->data, ai_tensor_nbytes(x));
    for (int64_t t = 0; !st && t < p.tuples; t++) {
        int64_t at = 0;
        const char *src = (const char *)u->data + (size_t)t * row;
        if ((st = nd_place(c, x, idx, &p, t, &at)) || !row)
            continue;
        if (red == RED_NONE)
            memcpy(y + (size_t)at * row, src, row);
        else
            ai_scatter_reduce_row(red, x->dtype, y + (size_t)at * row, src, p.slice);
    }
    return st;
}

/* none: dData = dY where no tuple wrote, 0 where one did; dUpdates[t] =
 * dY[place(t)] (each update of a repeated place gets it, as torch's
 * index_put_). add: dData = dY, dUpdates the same gather. mul, max, min:
 * refused. Both gradients are written whole (AI_OP_GRAD_ASSIGN(2)). */
static ai_status snd_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1], *dy = c->dout[0];
    ai_tensor *dx = c->din[0], *du = c->din[2];
    nd_plan p;
    int red;
    ai_status st = snd_setup(c, &p, &red);
    if (st || (!dx && !du))
        return st;
    if (red != RED_NONE && red != RED_ADD)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "no gradient for reduction '%s' (only none and add)",
                             ai_scatter_red_names[red]);
    if ((dx && (st = ai_check_grad_dtype(c, dx))) || (du && (st = ai_check_grad_dtype(c, du))))
        return st;
    const size_t es = ai_dtype_size(dy->dtype), row = (size_t)p.slice * es;
    const ai_row_fn add = dy->dtype == AI_F32 ? ai_row_add_f32 : ai_row_add_f64;
    if (dx && red == RED_ADD) {
        ai_accumulate(dx, dy, c->din_assign[0]);
    } else if (dx) {
        unsigned char *written = c->workspace;
        if (p.places)
            memset(written, 0, (size_t)p.places);
        for (int64_t t = 0; !st && t < p.tuples; t++) {
            int64_t at = 0;
            if (!(st = nd_place(c, x, idx, &p, t, &at)))
                written[at] = 1;
        }
        for (int64_t at = 0; !st && row && at < p.places; at++) {
            char *d = (char *)dx->data + (size_t)at * row;
            const char *s = (const char *)dy->data + (size_t)at * row;
            if (written[at] && c->din_assign[0])
                memset(d, 0, row);
            else if (c->din_assign[0])
                memcpy(d, s, row);
            else if (!written[at])
                add(d, 1, s, 1, p.slice, es);
        }
    }
    for (int64_t t = 0; du && !st && t < p.tuples; t++) {
        int64_t at = 0;
        if ((st = nd_place(c, x, idx, &p, t, &at)) || !row)
            continue;
        char *d = (char *)du->data + (size_t)t * row;
        const char *s = (const char *)dy->data + (size_t)at * row;
        if (c->din_assign[2])
            memcpy(d, s, row);
        else
            add(d, 1, s, 1, p.slice, es);
    }
    return st;
}

/* ---------------------------------------------------------------- registry */

OP(op_gather_nd, "GatherND", 2, 2, 1, AI_OP_BWD_NO_Y | AI_OP_HALF | AI_OP_ANY_DTYPE, gnd_shape, gnd_forward, gnd_backward)
OP(op_scatter_nd, "ScatterND", 3, 3, 1, AI_OP_GRAD_ASSIGN(3) | AI_OP_BWD_NO_Y, snd_shape,
   snd_forward, snd_backward)

const ai_op_def *const ai_ops_index_nd[] = {&op_gather_nd, &op_scatter_nd, NULL};
