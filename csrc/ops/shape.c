/*
 * shape.c — operators that move data without arithmetic: Reshape, Flatten,
 * Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Gather, Expand, Tile,
 * DepthToSpace, SpaceToDepth, Trilu, GatherElements, Pad, Shape,
 * ConstantOfShape.
 *
 * Forward kernels copy bytes (ai_dtype_size), so they take every dtype:
 * int64 matters because shape subgraphs (Shape -> Gather -> Concat ->
 * Reshape) are constant-folded by running forward at plan time. Backward
 * takes float32/float64 and adds the output gradient back to where each
 * element came from (+=), or copies it there on the gradient's first write
 * when the walks cover the whole input (AI_OP_GRAD_ASSIGN).
 *
 * Most operators are a "walk": the input and output seen as two strided
 * views of one index space (Transpose permutes strides, Slice steps them,
 * Expand zeroes them, Concat/Split offset them). Forward copies src -> dst
 * along the walk; backward swaps the roles and adds dst-gradient ->
 * src-gradient.
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/conv.h"
#include "../parallel.h"

/* ---------------------------------------------------------------- helpers */

static ai_status set_meta(ai_meta *m, ai_dtype dt, int nd, const int64_t *shape)
{
    m->dtype = dt;
    m->ndim = nd;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)nd);
    return AI_OK;
}

static int64_t prod(const int64_t *shape, int from, int to)
{
    int64_t n = 1;
    for (int i = from; i < to; i++)
        n *= shape[i];
    return n;
}

/* Reads a 0-D or 1-D int32/int64 tensor into out[0..*n). */
static ai_status read_ints(const ai_node *node, const ai_tensor *t, const char *what,
                           int64_t *out, int max, int *n)
{
    if (t->dtype != AI_I64 && t->dtype != AI_I32)
        return ai_node_error(node, AI_ERR_TYPE, "%s is %s; int64 or int32 expected", what,
                             ai_dtype_name(t->dtype));
    if (t->ndim > 1)
        return ai_node_error(node, AI_ERR_VALUE, "%s must be 1-D, got rank %d", what, t->ndim);
    int64_t len = ai_tensor_numel(t);
    if (len > max)
        return ai_node_error(node, AI_ERR_NOT_IMPLEMENTED,
                             "%s has %lld values; at most %d are supported", what,
                             (long long)len, max);
    for (int64_t i = 0; i < len; i++)
        out[i] = t->dtype == AI_I64 ? ((const int64_t *)t->data)[i]
                                    : ((const int32_t *)t->data)[i];
    *n = (int)len;
    return AI_OK;
}

/* An integer list that is input `index` from opset `since` on and attribute
 * `name` before. *n = -1 when absent. An input must be a constant. */
static ai_status int_list(const ai_ctx *c, int index, int since, const char *name,
                          int64_t *out, int max, int *n)
{
    const ai_node *node = c->node;
    *n = -1;
    if (node->opset < since) {
        if (index < c->n_in && c->in[index])
            return ai_node_error(node, AI_ERR_VALUE,
                                 "'%s' is an attribute before opset %d, not an input", name,
                                 since);
        const int64_t *v;
        int64_t len;
        ai_status st = ai_attr_ints(node, name, &v, &len);
        if (st || len < 0)
            return st;
        if (len > max)
            return ai_node_error(node, AI_ERR_NOT_IMPLEMENTED,
                                 "attribute '%s' has %lld values; at most %d are supported",
                                 name, (long long)len, max);
        for (int64_t i = 0; i < len; i++)
            out[i] = v[i];
        *n = (int)len;
        return AI_OK;
    }
    if (index >= c->n_in || !c->in[index])
        return AI_OK;
    const ai_tensor *t = ai_ctx_const(c, index);
    if (!t)
        return ai_node_error(node, AI_ERR_NOT_IMPLEMENTED, "%s input must be a constant", name);
    return read_ints(node, t, name, out, max, n);
}

/* Normalises axes[0..n) against rank into flags (no duplicates). */
static ai_status axes_flags(const ai_node *node, const int64_t *axes, int n, int rank,
                            bool *flags)
{
    memset(flags, 0, sizeof(bool) * AI_MAX_DIMS);
    for (int i = 0; i < n; i++) {
        int a;
        ai_status st = ai_norm_axis(node, axes[i], rank, &a);
        if (st)
            return st;
        if (flags[a])
            return ai_node_error(node, AI_ERR_VALUE, "axis %lld appears twice",
                                 (long long)axes[i]);
        flags[a] = true;
    }
    return AI_OK;
}

/* Gradients are float32/float64 only. */
static ai_status check_grad_dtype(const ai_ctx *c, const ai_tensor *g)
{
    if (g->dtype == AI_F32 || g->dtype == AI_F64)
        return AI_OK;
    return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                         "gradient for %s data is not supported", ai_dtype_name(g->dtype));
}

/* ---------------------------------------------------------------- strided walks */

/* One row of a walk: n elements of es bytes, strides in elements. */
typedef void (*row_fn)(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n,
                       size_t es);

#define COPY_ELEMS(E)                                                                  \
    for (int64_t j = 0; j < n; j++)                                                    \
        memcpy(dst + j * sd * (int64_t)(E), src + j * ss * (int64_t)(E), (E));

static void row_copy(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n,
                     size_t es)
{
    if (n == 0) /* an empty row of an empty tensor, whose data may be NULL */
        return;
    if (sd == 1 && ss == 1) {
        memcpy(dst, src, (size_t)n * es);
        return;
    }
    switch (es) { /* fixed sizes become plain moves */
    case 1: COPY_ELEMS(1) break;
    case 2: COPY_ELEMS(2) break;
    case 4: COPY_ELEMS(4) break;
    case 8: COPY_ELEMS(8) break;
    default: COPY_ELEMS(es)
    }
}

#define DEFINE_ROW_ADD(NAME, T)                                                        \
    static void NAME(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n,   \
                     size_t es)                                                        \
    {                                                                                  \
        (void)es;                                                                      \
        T *d = (T *)dst;                                                               \
        const T *s = (const T *)src;                                                   \
        if (sd == 1 && ss == 1) {                                                      \
            for (int64_t j = 0; j < n; j++)                                            \
                d[j] += s[j];                                                          \
        } else {                                                                       \
            for (int64_t j = 0; j < n; j++)                                            \
                d[j * sd] += s[j * ss];                                                \
        }                                                                              \
    }

DEFINE_ROW_ADD(row_add_f32, float)
DEFINE_ROW_ADD(row_add_f64, double)

/* dst[od + i . sd] (op)= src[os + i . ss] for every index i of shape. */
typedef struct {
    int nd;
    int64_t shape[AI_MAX_DIMS];
    int64_t sd[AI_MAX_DIMS], ss[AI_MAX_DIMS]; /* strides in elements */
    int64_t od, os;                           /* start offsets in elements */
} walk;

/* A walk over `shape` whose source and destination are both contiguous. */
static void walk_init(walk *w, int nd, const int64_t *shape)
{
    memset(w, 0, sizeof *w);
    w->nd = nd;
    memcpy(w->shape, shape, sizeof(int64_t) * (size_t)nd);
    ai_contiguous_strides(nd, shape, w->sd);
    ai_contiguous_strides(nd, shape, w->ss);
}

static walk walk_swapped(const walk *w)
{
    walk r = *w;
    memcpy(r.sd, w->ss, sizeof r.sd);
    memcpy(r.ss, w->sd, sizeof r.ss);
    r.od = w->os;
    r.os = w->od;
    return r;
}

/* Rows [lo, hi) of a merged walk (walk_run) */
typedef struct {
    walk w; /* merged: size-1 dimensions dropped, contiguous runs joined */
    char *dst;
    const char *src;
    size_t es;
    row_fn row;
} walk_job;

static void walk_range(void *ctx, int64_t lo, int64_t hi)
{
    const walk_job *j = ctx;
    const walk *w = &j->w;
    const int nd = w->nd;
    const int64_t inner = nd ? w->shape[nd - 1] : 1, e = (int64_t)j->es;
    const int64_t sd = nd ? w->sd[nd - 1] : 1, ss = nd ? w->ss[nd - 1] : 1;
    int64_t idx[AI_MAX_DIMS] = {0}, od = w->od, os = w->os;
    int64_t below = 1;
    for (int d = nd - 2; d >= 0; d--) { /* row lo's index */
        idx[d] = lo / below % w->shape[d];
        below *= w->shape[d];
        od += idx[d] * w->sd[d];
        os += idx[d] * w->ss[d];
    }
    for (int64_t r = lo; r < hi; r++) {
        j->row(j->dst + od * e, sd, j->src + os * e, ss, inner, j->es);
        for (int d = nd - 2; d >= 0; d--) {
            od += w->sd[d];
            os += w->ss[d];
            if (++idx[d] < w->shape[d])
                break;
            od -= w->sd[d] * w->shape[d];
            os -= w->ss[d] * w->shape[d];
            idx[d] = 0;
        }
    }
}

/* A float32 walk whose last two dimensions swap which side is contiguous
 * (the destination along the last, the source along the one before:
 * Transpose's [..., 1, 0] and its backward, after merging): each 2-D slice
 * a blocked transpose (8 x 8 tiles by shuffles) instead of rows that read
 * one element per cache line. Items: (slice, band of TR_BAND destination
 * rows). */
#define TR_BAND 64
static void transpose_range(void *ctx, int64_t lo, int64_t hi)
{
    const walk_job *j = ctx;
    const walk *w = &j->w;
    const int nd = w->nd;
    const int64_t R = w->shape[nd - 2], C = w->shape[nd - 1];
    const int64_t bands = (R + TR_BAND - 1) / TR_BAND;
    for (int64_t it = lo; it < hi; it++) {
        int64_t b = it / bands, od = w->od, os = w->os;
        const int64_t r0 = it % bands * TR_BAND;
        for (int d = nd - 3; d >= 0; d--) { /* slice b's offsets */
            const int64_t i = b % w->shape[d];
            b /= w->shape[d];
            od += i * w->sd[d];
            os += i * w->ss[d];
        }
        const int64_t nr = R - r0 < TR_BAND ? R - r0 : TR_BAND;
        /* dst rows r0.. (sd[nd-2] apart) = src columns r0.. (rows ss[nd-1] apart) */
        ai_transpose_f32((float *)j->dst + od + r0 * w->sd[nd - 2], w->sd[nd - 2],
                         (const float *)j->src + os + r0, w->ss[nd - 1], C, nr,
                         j->row == row_add_f32);
    }
}

/* Every row of w (their destinations never overlap: each walk maps one
 * element to one), rows split between threads where there are enough;
 * float32 transposes by blocks (transpose_range). */
static void walk_run(const walk *w0, char *dst, const char *src, size_t es, row_fn row,
                     bool f32)
{
    /* drop size-1 dimensions; merge a dimension into the previous one when
     * both sides are contiguous across them (long rows, few calls) */
    walk_job j = {.dst = dst, .src = src, .es = es, .row = row};
    walk *w = &j.w;
    for (int d = 0; d < w0->nd; d++) {
        if (w0->shape[d] == 0)
            return;
        if (w0->shape[d] == 1)
            continue;
        int k = w->nd - 1;
        if (k >= 0 && w->sd[k] == w0->sd[d] * w0->shape[d] &&
            w->ss[k] == w0->ss[d] * w0->shape[d]) {
            w->shape[k] *= w0->shape[d];
        } else {
            k = w->nd++;
            w->shape[k] = w0->shape[d];
        }
        w->sd[k] = w0->sd[d];
        w->ss[k] = w0->ss[d];
    }
    w->od = w0->od;
    w->os = w0->os;
    const int nd = w->nd;
    const int64_t inner = nd ? w->shape[nd - 1] : 1;
    const int64_t rows = nd ? prod(w->shape, 0, nd - 1) : 1;
    if (f32 && (row == row_copy || row == row_add_f32) && nd >= 2 &&
        w->sd[nd - 1] == 1 && w->ss[nd - 2] == 1 && w->ss[nd - 1] > 1 &&
        w->shape[nd - 2] >= 8 && w->shape[nd - 1] >= 8) {
        const int64_t items =
            prod(w->shape, 0, nd - 2) * ((w->shape[nd - 2] + TR_BAND - 1) / TR_BAND);
        ai_parallel_for(items, ai_grain_of(TR_BAND * inner), transpose_range, &j);
        return;
    }
    ai_parallel_for(rows, ai_grain_of(inner), walk_range, &j);
}

/* Forward along w: out <- in. */
static void walk_copy(const walk *w, ai_tensor *out, const ai_tensor *in)
{
    walk_run(w, out->data, in->data, ai_dtype_size(in->dtype), row_copy, in->dtype == AI_F32);
}

/* Backward along w (the forward walk): din += dout where in -> out (=
 * with `assign`). */
static ai_status walk_add_back(const ai_ctx *c, const walk *w, ai_tensor *din,
                               const ai_tensor *dout, bool assign)
{
    ai_status st = check_grad_dtype(c, din);
    if (st)
        return st;
    walk b = walk_swapped(w);
    walk_run(&b, din->data, dout->data, ai_dtype_size(din->dtype),
             assign ? row_copy : din->dtype == AI_F32 ? row_add_f32 : row_add_f64,
             din->dtype == AI_F32);
    return AI_OK;
}

/* ---------------------------------------------------------------- flat copies */

/* Reshape, Flatten, Squeeze, Unsqueeze: same bytes, another shape. */
static ai_status flat_forward(ai_ctx *c)
{
    size_t n = ai_tensor_nbytes(c->in[0]);
    if (n)
        memcpy(c->out[0]->data, c->in[0]->data, n);
    return AI_OK;
}

static ai_status flat_backward(ai_ctx *c)
{
    ai_status st = check_grad_dtype(c, c->din[0]);
    if (!st)
        ai_accumulate(c->din[0], c->dout[0], c->din_assign[0]);
    return st;
}

/* ---------------------------------------------------------------- Reshape */

static ai_status reshape_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_node *node = c->node;
    const ai_tensor *x = c->in[0];
    int64_t allowzero, s[AI_MAX_DIMS];
    int n;
    ai_status st = ai_attr_int(node, "allowzero", 0, &allowzero);
    if (!st)
        st = int_list(c, 1, 1, "shape", s, AI_MAX_DIMS, &n);
    if (st)
        return st;
    if (n < 0)
        return ai_node_error(node, AI_ERR_VALUE, "the shape input is missing");
    int infer = -1;
    int64_t known = 1;
    bool has_zero = false;
    for (int i = 0; i < n; i++) {
        if (s[i] == 0 && !allowzero) {
            if (i >= x->ndim)
                return ai_node_error(node, AI_ERR_VALUE,
                                     "shape[%d] = 0 copies input dimension %d, but the input "
                                     "has rank %d", i, i, x->ndim);
            s[i] = x->shape[i];
        }
        has_zero |= s[i] == 0;
        if (s[i] == -1) {
            if (infer >= 0)
                return ai_node_error(node, AI_ERR_VALUE, "shape has more than one -1");
            infer = i;
        } else if (s[i] < 0) {
            return ai_node_error(node, AI_ERR_VALUE, "shape[%d] = %lld is negative", i,
                                 (long long)s[i]);
        } else {
            if (s[i] && known > INT64_MAX / s[i])
                return ai_node_error(node, AI_ERR_VALUE,
                                     "shape has more than 2^63 elements (shape[%d] = %lld)",
                                     i, (long long)s[i]);
            known *= s[i];
        }
    }
    int64_t numel = ai_tensor_numel(x);
    if (infer >= 0) {
        if (has_zero && allowzero)
            return ai_node_error(node, AI_ERR_VALUE,
                                 "with allowzero=1 the shape cannot hold both 0 and -1");
        if (known == 0 || numel % known)
            return ai_node_error(node, AI_ERR_VALUE,
                                 "cannot infer the -1 dimension: %lld elements into blocks "
                                 "of %lld", (long long)numel, (long long)known);
        s[infer] = numel / known;
        known *= s[infer];
    }
    if (known != numel)
        return ai_node_error(node, AI_ERR_VALUE,
                             "cannot reshape %lld elements into a shape of %lld",
                             (long long)numel, (long long)known);
    return set_meta(&out[0], x->dtype, n, s);
}

/* ---------------------------------------------------------------- Flatten */

static ai_status flatten_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    int64_t axis;
    ai_status st = ai_attr_int(c->node, "axis", 1, &axis);
    if (st)
        return st;
    if (axis < -x->ndim || axis > x->ndim)
        return ai_node_error(c->node, AI_ERR_VALUE, "axis %lld is out of range for rank %d",
                             (long long)axis, x->ndim);
    if (axis < 0)
        axis += x->ndim;
    int64_t s[2] = {prod(x->shape, 0, (int)axis), prod(x->shape, (int)axis, x->ndim)};
    return set_meta(&out[0], x->dtype, 2, s);
}

/* ---------------------------------------------------------------- Squeeze / Unsqueeze */

static ai_status squeeze_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    int64_t axes[AI_MAX_DIMS], s[AI_MAX_DIMS];
    bool drop[AI_MAX_DIMS];
    int n, nd = 0;
    ai_status st = int_list(c, 1, 13, "axes", axes, AI_MAX_DIMS, &n);
    if (!st)
        st = axes_flags(c->node, axes, n < 0 ? 0 : n, x->ndim, drop);
    if (st)
        return st;
    for (int d = 0; d < x->ndim; d++) {
        if (n <= 0) /* no axes, or an empty list (like onnxruntime): all 1s */
            drop[d] = x->shape[d] == 1;
        else if (drop[d] && x->shape[d] != 1)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "cannot squeeze axis %d of size %lld (size 1 expected)", d,
                                 (long long)x->shape[d]);
        if (!drop[d])
            s[nd++] = x->shape[d];
    }
    return set_meta(&out[0], x->dtype, nd, s);
}

static ai_status unsqueeze_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    int64_t axes[AI_MAX_DIMS], s[AI_MAX_DIMS];
    bool add[AI_MAX_DIMS];
    int n;
    ai_status st = int_list(c, 1, 13, "axes", axes, AI_MAX_DIMS, &n);
    if (st)
        return st;
    if (n < 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "axes are missing");
    const int nd = x->ndim + n;
    if (nd > AI_MAX_DIMS)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "output rank %d exceeds %d", nd, AI_MAX_DIMS);
    if ((st = axes_flags(c->node, axes, n, nd, add)))
        return st;
    for (int d = 0, k = 0; d < nd; d++)
        s[d] = add[d] ? 1 : x->shape[k++];
    return set_meta(&out[0], x->dtype, nd, s);
}

/* ---------------------------------------------------------------- Transpose */

static ai_status transpose_walk(const ai_ctx *c, int *perm, walk *w)
{
    const ai_tensor *x = c->in[0];
    const int nd = x->ndim;
    const int64_t *p;
    int64_t len;
    ai_status st = ai_attr_ints(c->node, "perm", &p, &len);
    if (st)
        return st;
    if (len >= 0 && len != nd)
        return ai_node_error(c->node, AI_ERR_VALUE, "perm has %lld entries for rank %d",
                             (long long)len, nd);
    bool seen[AI_MAX_DIMS] = {false};
    for (int i = 0; i < nd; i++) {
        int64_t a = len < 0 ? nd - 1 - i : p[i];
        if (a < 0 || a >= nd || seen[a])
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "perm is not a permutation of 0..%d", nd - 1);
        seen[a] = true;
        perm[i] = (int)a;
    }
    int64_t shape[AI_MAX_DIMS], xs[AI_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        shape[i] = x->shape[perm[i]];
    walk_init(w, nd, shape);
    ai_contiguous_strides(nd, x->shape, xs);
    for (int i = 0; i < nd; i++)
        w->ss[i] = xs[perm[i]];
    return AI_OK;
}

static ai_status transpose_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int perm[AI_MAX_DIMS];
    walk w;
    ai_status st = transpose_walk(c, perm, &w);
    return st ? st : set_meta(&out[0], c->in[0]->dtype, w.nd, w.shape);
}

static ai_status transpose_forward(ai_ctx *c)
{
    int perm[AI_MAX_DIMS];
    walk w;
    ai_status st = transpose_walk(c, perm, &w);
    if (!st)
        walk_copy(&w, c->out[0], c->in[0]);
    return st;
}

static ai_status transpose_backward(ai_ctx *c)
{
    int perm[AI_MAX_DIMS];
    walk w;
    ai_status st = transpose_walk(c, perm, &w);
    return st ? st : walk_add_back(c, &w, c->din[0], c->dout[0], c->din_assign[0]);
}

/* ---------------------------------------------------------------- Concat / Split */

/* Walk between part k (contiguous, `len` long on `axis`, starting at `start`)
 * and the whole (contiguous, shape `whole`): src = whole, dst = part. */
static void part_walk(walk *w, int nd, const int64_t *whole, int axis, int64_t start,
                      int64_t len)
{
    int64_t shape[AI_MAX_DIMS];
    memcpy(shape, whole, sizeof(int64_t) * (size_t)nd);
    shape[axis] = len;
    walk_init(w, nd, shape);
    ai_contiguous_strides(nd, whole, w->ss);
    w->os = start * w->ss[axis];
}

static ai_status concat_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_node *node = c->node;
    const ai_tensor *x0 = c->in[0];
    int64_t axis;
    int a;
    if (!ai_node_attr(node, "axis"))
        return ai_node_error(node, AI_ERR_VALUE, "attribute 'axis' is required");
    ai_status st = ai_attr_int(node, "axis", 0, &axis);
    if (!st)
        st = ai_norm_axis(node, axis, x0->ndim, &a);
    if (st)
        return st;
    if (x0->ndim == 0)
        return ai_node_error(node, AI_ERR_VALUE, "cannot concatenate scalars");
    int64_t shape[AI_MAX_DIMS];
    memcpy(shape, x0->shape, sizeof shape);
    shape[a] = 0;
    for (int k = 0; k < c->n_in; k++) {
        const ai_tensor *x = c->in[k];
        if (!x)
            return ai_node_error(node, AI_ERR_VALUE, "input %d is missing", k);
        if (x->dtype != x0->dtype || x->ndim != x0->ndim)
            return ai_node_error(node, AI_ERR_VALUE,
                                 "input %d is %s of rank %d; input 0 is %s of rank %d", k,
                                 ai_dtype_name(x->dtype), x->ndim, ai_dtype_name(x0->dtype),
                                 x0->ndim);
        for (int d = 0; d < x->ndim; d++)
            if (d != a && x->shape[d] != x0->shape[d])
                return ai_node_error(node, AI_ERR_VALUE,
                                     "input %d has size %lld in dimension %d; input 0 has "
                                     "%lld", k, (long long)x->shape[d], d,
                                     (long long)x0->shape[d]);
        shape[a] += x->shape[a];
    }
    return set_meta(&out[0], x0->dtype, x0->ndim, shape);
}

static int concat_axis(const ai_ctx *c)
{
    int64_t axis = 0;
    ai_attr_int(c->node, "axis", 0, &axis); /* checked by concat_shape */
    return (int)(axis < 0 ? axis + c->in[0]->ndim : axis);
}

static ai_status concat_forward(ai_ctx *c)
{
    const int a = concat_axis(c);
    int64_t start = 0;
    for (int k = 0; k < c->n_in; k++) {
        walk w, part;
        part_walk(&part, c->out[0]->ndim, c->out[0]->shape, a, start, c->in[k]->shape[a]);
        w = walk_swapped(&part); /* into the whole, from part k */
        walk_copy(&w, c->out[0], c->in[k]);
        start += c->in[k]->shape[a];
    }
    return AI_OK;
}

static ai_status concat_backward(ai_ctx *c)
{
    const int a = concat_axis(c);
    int64_t start = 0;
    for (int k = 0; k < c->n_in; k++) {
        walk part;
        part_walk(&part, c->out[0]->ndim, c->out[0]->shape, a, start, c->in[k]->shape[a]);
        start += c->in[k]->shape[a];
        if (!c->din[k])
            continue;
        walk w = walk_swapped(&part); /* forward walk: in k -> whole */
        ai_status st = walk_add_back(c, &w, c->din[k], c->dout[0], c->din_assign[k]);
        if (st)
            return st;
    }
    return AI_OK;
}

/* Sizes of the outputs along the axis: the split input (opset >= 13) or
 * attribute, else num_outputs (opset >= 18) or the number of outputs; an
 * uneven split makes the last part smaller. */
static ai_status split_sizes(const ai_ctx *c, int *axis, int64_t *sizes)
{
    const ai_node *node = c->node;
    const ai_tensor *x = c->in[0];
    int64_t ax, num;
    int n;
    ai_status st = ai_attr_int(node, "axis", 0, &ax);
    if (!st)
        st = ai_norm_axis(node, ax, x->ndim, axis);
    if (!st)
        st = int_list(c, 1, 13, "split", sizes, AI_MAX_IO, &n);
    if (!st)
        st = ai_attr_int(node, "num_outputs", c->n_out, &num);
    if (st)
        return st;
    if (x->ndim == 0)
        return ai_node_error(node, AI_ERR_VALUE, "cannot split a scalar");
    const int64_t dim = x->shape[*axis];
    if (n >= 0) {
        int64_t total = 0;
        for (int i = 0; i < n; i++) {
            if (sizes[i] < 0)
                return ai_node_error(node, AI_ERR_VALUE, "split[%d] = %lld is negative", i,
                                     (long long)sizes[i]);
            total += sizes[i];
        }
        if (n != c->n_out || total != dim)
            return ai_node_error(node, AI_ERR_VALUE,
                                 "split has %d sizes summing to %lld; expected %d sizes "
                                 "summing to %lld", n, (long long)total, c->n_out,
                                 (long long)dim);
        return AI_OK;
    }
    if (num != c->n_out)
        return ai_node_error(node, AI_ERR_VALUE, "num_outputs is %lld but the node has %d "
                             "outputs", (long long)num, c->n_out);
    const int64_t part = (dim + num - 1) / num;
    if (part * (num - 1) > dim)
        return ai_node_error(node, AI_ERR_VALUE, "cannot split %lld into %lld parts",
                             (long long)dim, (long long)num);
    for (int i = 0; i < c->n_out; i++)
        sizes[i] = i < c->n_out - 1 ? part : dim - part * (num - 1);
    return AI_OK;
}

static ai_status split_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int64_t sizes[AI_MAX_IO];
    int a;
    ai_status st = split_sizes(c, &a, sizes);
    for (int k = 0; !st && k < c->n_out; k++) {
        set_meta(&out[k], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
        out[k].shape[a] = sizes[k];
    }
    return st;
}

static ai_status split_forward(ai_ctx *c)
{
    int64_t sizes[AI_MAX_IO], start = 0;
    int a;
    ai_status st = split_sizes(c, &a, sizes);
    for (int k = 0; !st && k < c->n_out; k++) {
        walk w;
        part_walk(&w, c->in[0]->ndim, c->in[0]->shape, a, start, sizes[k]);
        walk_copy(&w, c->out[k], c->in[0]);
        start += sizes[k];
    }
    return st;
}

static ai_status split_backward(ai_ctx *c)
{
    int64_t sizes[AI_MAX_IO], start = 0;
    int a;
    ai_status st = split_sizes(c, &a, sizes);
    for (int k = 0; !st && k < c->n_out; k++) {
        walk w;
        part_walk(&w, c->in[0]->ndim, c->in[0]->shape, a, start, sizes[k]);
        start += sizes[k];
        st = walk_add_back(c, &w, c->din[0], c->dout[k], c->din_assign[0]); /* parts */
    }
    return st;
}

/* ---------------------------------------------------------------- Slice */

/* The walk from the input to the output: starts/ends/axes/steps inputs
 * (opset >= 10; attributes starts/ends/axes before), clamped like ONNX. */
static ai_status slice_walk(const ai_ctx *c, walk *w)
{
    const ai_node *node = c->node;
    const ai_tensor *x = c->in[0];
    const int nd = x->ndim;
    int64_t starts[AI_MAX_DIMS], ends[AI_MAX_DIMS], axes[AI_MAX_DIMS], steps[AI_MAX_DIMS];
    int ns, ne, na, nt;
    ai_status st = int_list(c, 1, 10, "starts", starts, AI_MAX_DIMS, &ns);
    if (!st)
        st = int_list(c, 2, 10, "ends", ends, AI_MAX_DIMS, &ne);
    if (!st)
        st = int_list(c, 3, 10, "axes", axes, AI_MAX_DIMS, &na);
    if (!st)
        st = int_list(c, 4, 10, "steps", steps, AI_MAX_DIMS, &nt);
    if (st)
        return st;
    if (ns < 0 || ne < 0)
        return ai_node_error(node, AI_ERR_VALUE, "starts and ends are required");
    if (ne != ns || (na >= 0 && na != ns) || (nt >= 0 && nt != ns))
        return ai_node_error(node, AI_ERR_VALUE,
                             "starts, ends, axes and steps must have the same length "
                             "(%d, %d, %d, %d)", ns, ne, na, nt);
    bool seen[AI_MAX_DIMS] = {false};
    walk_init(w, nd, x->shape);
    ai_contiguous_strides(nd, x->shape, w->ss);
    for (int k = 0; k < ns; k++) {
        int a;
        if ((st = ai_norm_axis(node, na >= 0 ? axes[k] : k, nd, &a)))
            return st;
        if (seen[a])
            return ai_node_error(node, AI_ERR_VALUE, "axis %d is sliced twice", a);
        seen[a] = true;
        const int64_t step = nt >= 0 ? steps[k] : 1, dim = x->shape[a];
        if (step == 0)
            return ai_node_error(node, AI_ERR_VALUE, "steps[%d] is 0", k);
        int64_t s = starts[k], e = ends[k], count = 0;
        if (s < 0)
            s += dim;
        if (e < 0)
            e += dim;
        if (step > 0) {
            s = s < 0 ? 0 : (s > dim ? dim : s);
            e = e < 0 ? 0 : (e > dim ? dim : e);
            count = e > s ? 1 + (e - s - 1) / step : 0;
        } else {
            const int64_t mag = step == INT64_MIN ? INT64_MAX : -step;
            s = s < 0 ? 0 : (s > dim - 1 ? dim - 1 : s);
            e = e < -1 ? -1 : (e > dim - 1 ? dim - 1 : e);
            count = dim > 0 && s > e ? 1 + (s - e - 1) / mag : 0; /* dim 0: s is 0 > e */
        }
        w->shape[a] = count;
        if (count > 0) {
            w->os += s * w->ss[a];
            w->ss[a] = count > 1 ? step * w->ss[a] : 0;
        }
    }
    ai_contiguous_strides(nd, w->shape, w->sd);
    return AI_OK;
}

static ai_status slice_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    walk w;
    ai_status st = slice_walk(c, &w);
    return st ? st : set_meta(&out[0], c->in[0]->dtype, w.nd, w.shape);
}

static ai_status slice_forward(ai_ctx *c)
{
    walk w;
    ai_status st = slice_walk(c, &w);
    if (!st)
        walk_copy(&w, c->out[0], c->in[0]);
    return st;
}

static ai_status slice_backward(ai_ctx *c)
{
    walk w;
    ai_status st = slice_walk(c, &w);
    return st ? st : walk_add_back(c, &w, c->din[0], c->dout[0], false);
}

/* ---------------------------------------------------------------- Expand */

static ai_status expand_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    int64_t s[AI_MAX_DIMS], shape[AI_MAX_DIMS];
    int n, nd;
    ai_status st = int_list(c, 1, 1, "shape", s, AI_MAX_DIMS, &n);
    if (!st && n < 0)
        st = ai_node_error(c->node, AI_ERR_VALUE, "the shape input is missing");
    if (!st)
        st = ai_broadcast_shape(c->node, x->ndim, x->shape, n, s, &nd, shape);
    return st ? st : set_meta(&out[0], x->dtype, nd, shape);
}

static ai_status expand_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    ai_tensor *y = c->out[0];
    walk w;
    walk_init(&w, y->ndim, y->shape);
    ai_broadcast_strides(x->ndim, x->shape, y->ndim, y->shape, w.ss);
    walk_copy(&w, y, x);
    return AI_OK;
}

static ai_status expand_backward(ai_ctx *c)
{
    ai_status st = check_grad_dtype(c, c->din[0]);
    if (!st)
        ai_reduce_to(c->din[0], c->dout[0], c->din_assign[0]);
    return st;
}

/* ---------------------------------------------------------------- Tile */

/* Y = X repeated repeats[d] times along each dim d: Y viewed as (r0, s0, r1,
 * s1, ...) reads X with stride 0 on the r's. Backward sums dY over them
 * (ai_reduce_to from that view onto X viewed as (1, s0, 1, s1, ...)). */
static ai_status tile_view(const ai_ctx *c, int64_t *rep, int64_t *yshape, int64_t *view,
                           int64_t *xview)
{
    const ai_tensor *x = c->in[0];
    int n;
    ai_status st = int_list(c, 1, 1, "repeats", rep, AI_MAX_DIMS, &n);
    if (st)
        return st;
    if (n != x->ndim)
        return ai_node_error(c->node, AI_ERR_VALUE, "repeats has %d values for rank %d", n,
                             x->ndim);
    if (2 * x->ndim > AI_MAX_DIMS)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "rank %d: at most %d supported",
                             x->ndim, AI_MAX_DIMS / 2);
    for (int d = 0; d < x->ndim; d++) {
        if (rep[d] < 0)
            return ai_node_error(c->node, AI_ERR_VALUE, "repeats[%d] is %lld", d,
                                 (long long)rep[d]);
        if (rep[d] && x->shape[d] > INT64_MAX / 2 / rep[d])
            return ai_node_error(c->node, AI_ERR_VALUE, "repeats[%d] = %lld is too large", d,
                                 (long long)rep[d]);
        yshape[d] = rep[d] * x->shape[d];
        view[2 * d] = rep[d];
        view[2 * d + 1] = x->shape[d];
        xview[2 * d] = 1;
        xview[2 * d + 1] = x->shape[d];
    }
    return AI_OK;
}

static ai_status tile_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int64_t rep[AI_MAX_DIMS], y[AI_MAX_DIMS], v[AI_MAX_DIMS], xv[AI_MAX_DIMS];
    ai_status st = tile_view(c, rep, y, v, xv);
    return st ? st : set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, y);
}

static ai_status tile_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    int64_t rep[AI_MAX_DIMS], y[AI_MAX_DIMS], v[AI_MAX_DIMS], xv[AI_MAX_DIMS], xs[AI_MAX_DIMS];
    ai_status st = tile_view(c, rep, y, v, xv);
    if (st || ai_tensor_numel(c->out[0]) == 0)
        return st;
    walk w;
    walk_init(&w, 2 * x->ndim, v);
    ai_contiguous_strides(x->ndim, x->shape, xs);
    for (int d = 0; d < x->ndim; d++) {
        w.ss[2 * d] = 0;
        w.ss[2 * d + 1] = xs[d];
    }
    walk_copy(&w, c->out[0], x);
    return AI_OK;
}

static ai_status tile_backward(ai_ctx *c)
{
    ai_status st = check_grad_dtype(c, c->din[0]);
    int64_t rep[AI_MAX_DIMS], y[AI_MAX_DIMS], v[AI_MAX_DIMS], xv[AI_MAX_DIMS];
    if (st || (st = tile_view(c, rep, y, v, xv)))
        return st;
    const int nd = 2 * c->in[0]->ndim;
    ai_tensor g = *c->dout[0], dx = *c->din[0];
    g.ndim = dx.ndim = nd;
    memcpy(g.shape, v, sizeof(int64_t) * (size_t)nd);
    memcpy(dx.shape, xv, sizeof(int64_t) * (size_t)nd);
    ai_contiguous_strides(nd, g.shape, g.strides);
    ai_contiguous_strides(nd, dx.shape, dx.strides);
    if (ai_tensor_numel(&g) == 0) {
        if (c->din_assign[0] && ai_tensor_nbytes(c->din[0]))
            memset(c->din[0]->data, 0, ai_tensor_nbytes(c->din[0]));
        return AI_OK;
    }
    ai_reduce_to(&dx, &g, c->din_assign[0]);
    return AI_OK;
}

/* ---------------------------------------------------------------- DepthToSpace, SpaceToDepth */

/* Both are a transpose of a 6-D view (blocksize b): DepthToSpace reads X
 * (N, C, H, W) as (N, b, b, C', H, W) (mode DCR) or (N, C', b, b, H, W)
 * (CRD) and writes Y (N, C', H, b, W, b) = (N, C / b^2, H b, W b);
 * SpaceToDepth reads X as (N, C, H', b, W', b) and writes (N, b, b, C, H',
 * W') (DCR) or (N, C, b, b, H', W') (CRD, opset 28's mode) = (N, C b^2,
 * H / b, W / b). The walk goes over Y's 6-D shape. */
static ai_status d2s_walk(const ai_ctx *c, walk *w, int64_t *yshape)
{
    const ai_tensor *x = c->in[0];
    const bool d2s = strcmp(c->node->op_type, "DepthToSpace") == 0;
    int64_t b;
    const char *mode = "DCR";
    ai_status st = ai_attr_int(c->node, "blocksize", 0, &b);
    if (!st)
        st = ai_attr_string(c->node, "mode", "DCR", &mode);
    if (st)
        return st;
    const bool crd = strcmp(mode, "CRD") == 0;
    if (!crd && strcmp(mode, "DCR") != 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "mode '%s'; DCR or CRD expected", mode);
    if (b <= 0 || b > (1 << 20))
        return ai_node_error(c->node, AI_ERR_VALUE, "blocksize is %lld; > 0 expected",
                             (long long)b);
    if (x->ndim != 4)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank %d; (N, C, H, W) expected",
                             x->ndim);
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t xv[6], perm[6], shape[6], xs[6];
    if (d2s) {
        if (C % (b * b))
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "%lld channels are not a multiple of blocksize^2 = %lld",
                                 (long long)C, (long long)(b * b));
        const int64_t Cp = C / (b * b);
        const int64_t dcr[6] = {N, b, b, Cp, H, W}, crdv[6] = {N, Cp, b, b, H, W};
        const int64_t pd[6] = {0, 3, 4, 1, 5, 2}, pc[6] = {0, 1, 4, 2, 5, 3};
        memcpy(xv, crd ? crdv : dcr, sizeof xv);
        memcpy(perm, crd ? pc : pd, sizeof perm);
        yshape[0] = N, yshape[1] = Cp, yshape[2] = H * b, yshape[3] = W * b;
    } else {
        if (H % b || W % b)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "H = %lld and W = %lld must be multiples of blocksize %lld",
                                 (long long)H, (long long)W, (long long)b);
        const int64_t v[6] = {N, C, H / b, b, W / b, b};
        const int64_t pd[6] = {0, 3, 5, 1, 2, 4}, pc[6] = {0, 1, 3, 5, 2, 4};
        memcpy(xv, v, sizeof xv);
        memcpy(perm, crd ? pc : pd, sizeof perm);
        yshape[0] = N, yshape[1] = C * b * b, yshape[2] = H / b, yshape[3] = W / b;
    }
    ai_contiguous_strides(6, xv, xs);
    for (int i = 0; i < 6; i++)
        shape[i] = xv[perm[i]];
    walk_init(w, 6, shape);
    for (int i = 0; i < 6; i++)
        w->ss[i] = xs[perm[i]];
    return AI_OK;
}

static ai_status d2s_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    walk w;
    int64_t y[4];
    ai_status st = d2s_walk(c, &w, y);
    return st ? st : set_meta(&out[0], c->in[0]->dtype, 4, y);
}

static ai_status d2s_forward(ai_ctx *c)
{
    walk w;
    int64_t y[4];
    ai_status st = d2s_walk(c, &w, y);
    if (!st && ai_tensor_numel(c->out[0]))
        walk_copy(&w, c->out[0], c->in[0]);
    return st;
}

static ai_status d2s_backward(ai_ctx *c)
{
    walk w;
    int64_t y[4];
    ai_status st = d2s_walk(c, &w, y);
    if (st || !ai_tensor_numel(c->out[0]))
        return st;
    return walk_add_back(c, &w, c->din[0], c->dout[0], c->din_assign[0]);
}

/* ---------------------------------------------------------------- Trilu, GatherElements */

/* element i of a float32/float64 gradient, written from a double */
static void put_d(ai_tensor *t, int64_t i, double v)
{
    if (t->dtype == AI_F32)
        ((float *)t->data)[i] = (float)v;
    else
        ((double *)t->data)[i] = v;
}

/* Trilu: X's last two dims keep the elements on and above (upper = 1) or on
 * and below (upper = 0) diagonal k (an optional constant input), the rest
 * 0; backward masks dY the same way. */
static ai_status trilu_k(const ai_ctx *c, int64_t *k, int64_t *upper)
{
    *k = 0;
    ai_status st = ai_attr_int(c->node, "upper", 1, upper);
    if (st || c->n_in < 2 || !c->in[1])
        return st;
    return ai_ctx_int_scalar(c, 1, "k", k);
}

static ai_status trilu_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int64_t k, upper;
    ai_status st = trilu_k(c, &k, &upper);
    if (!st && c->in[0]->ndim < 2)
        return ai_node_error(c->node, AI_ERR_VALUE, "input has rank %d; >= 2 expected",
                             c->in[0]->ndim);
    return st ? st : set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
}

/* dst = src masked (add: dst += src masked: float gradients) */
static void trilu_run(const ai_tensor *src, ai_tensor *dst, int64_t k, bool upper, bool add)
{
    const int nd = src->ndim;
    const int64_t R = src->shape[nd - 2], C = src->shape[nd - 1];
    const int64_t mats = R && C ? ai_tensor_numel(src) / (R * C) : 0;
    const size_t es = ai_dtype_size(src->dtype);
    for (int64_t m = 0; m < mats; m++)
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                const int64_t at = (m * R + i) * C + j;
                const bool keep = upper ? j - i >= k : j - i <= k;
                char *d = (char *)dst->data + at * (int64_t)es;
                if (add) {
                    if (keep)
                        put_d(dst, at, ai_tensor_get_flat(dst, at) + ai_tensor_get_flat(src, at));
                } else if (keep) {
                    memcpy(d, (const char *)src->data + at * (int64_t)es, es);
                } else {
                    memset(d, 0, es);
                }
            }
}

static ai_status trilu_forward(ai_ctx *c)
{
    int64_t k, upper;
    ai_status st = trilu_k(c, &k, &upper);
    if (!st)
        trilu_run(c->in[0], c->out[0], k, upper != 0, false);
    return st;
}

static ai_status trilu_backward(ai_ctx *c)
{
    int64_t k, upper;
    ai_status st = trilu_k(c, &k, &upper);
    if (!st && !(st = check_grad_dtype(c, c->din[0])))
        trilu_run(c->dout[0], c->din[0], k, upper != 0, !c->din_assign[0]);
    return st;
}

/* GatherElements: Y has the shape of `indices`; Y[i...] = X[i...] with the
 * index along `axis` replaced by indices[i...] (negative from the end).
 * Backward adds dY[i...] into dX at the same place. */
typedef struct {
    int axis, nd;
    int64_t xs[AI_MAX_DIMS]; /* X's contiguous strides */
} ge_plan;

static ai_status ge_setup(const ai_ctx *c, ge_plan *p)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    int64_t a;
    ai_status st = ai_attr_int(c->node, "axis", 0, &a);
    if (!st)
        st = ai_norm_axis(c->node, a, x->ndim, &p->axis);
    if (st)
        return st;
    if (idx->dtype != AI_I64 && idx->dtype != AI_I32)
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s; int32 or int64 expected",
                             ai_dtype_name(idx->dtype));
    if (idx->ndim != x->ndim)
        return ai_node_error(c->node, AI_ERR_VALUE, "indices have rank %d, data rank %d",
                             idx->ndim, x->ndim);
    for (int d = 0; d < x->ndim; d++)
        if (d != p->axis && idx->shape[d] > x->shape[d])
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "indices dim %d is %lld, larger than data's %lld", d,
                                 (long long)idx->shape[d], (long long)x->shape[d]);
    p->nd = x->ndim;
    ai_contiguous_strides(x->ndim, x->shape, p->xs);
    return AI_OK;
}

static ai_status ge_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    ge_plan p;
    ai_status st = ge_setup(c, &p);
    return st ? st : set_meta(&out[0], c->in[0]->dtype, c->in[1]->ndim, c->in[1]->shape);
}

/* Over each element e of indices and its offset in X: forward copies X's
 * element into dst[e], backward adds src[e] into dst at that offset. */
static ai_status ge_walk(const ai_ctx *c, const ge_plan *p, ai_tensor *dst,
                         const ai_tensor *src, bool backward, bool add)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    const int64_t n = ai_tensor_numel(idx), len = x->shape[p->axis];
    const size_t es = ai_dtype_size(x->dtype);
    int64_t mi[AI_MAX_DIMS] = {0};
    for (int64_t e = 0; e < n; e++) {
        int64_t k = ai_tensor_get_flat_i64(idx, e);
        if (k < -len || k >= len)
            return ai_node_error(c->node, AI_ERR_VALUE,
                                 "index %lld is out of range for axis %d of size %lld",
                                 (long long)k, p->axis, (long long)len);
        k = k < 0 ? k + len : k;
        int64_t off = 0;
        for (int d = 0; d < p->nd; d++)
            off += (d == p->axis ? k : mi[d]) * p->xs[d];
        if (!backward)
            memcpy((char *)dst->data + e * (int64_t)es,
                   (const char *)src->data + off * (int64_t)es, es);
        else if (add)
            put_d(dst, off, ai_tensor_get_flat(dst, off) + ai_tensor_get_flat(src, e));
        for (int d = p->nd - 1; d >= 0; d--) {
            if (++mi[d] < idx->shape[d])
                break;
            mi[d] = 0;
        }
    }
    return AI_OK;
}

static ai_status ge_forward(ai_ctx *c)
{
    ge_plan p;
    ai_status st = ge_setup(c, &p);
    return st ? st : ge_walk(c, &p, c->out[0], c->in[0], false, false);
}

static ai_status ge_backward(ai_ctx *c)
{
    ge_plan p;
    ai_status st = ge_setup(c, &p);
    if (st || !c->din[0] || (st = check_grad_dtype(c, c->din[0])))
        return st;
    if (c->din_assign[0] && ai_tensor_nbytes(c->din[0]))
        memset(c->din[0]->data, 0, ai_tensor_nbytes(c->din[0]));
    return ge_walk(c, &p, c->din[0], c->dout[0], true, true);
}

/* ---------------------------------------------------------------- Gather */

static ai_status gather_axis(const ai_ctx *c, int *axis)
{
    int64_t a;
    ai_status st = ai_attr_int(c->node, "axis", 0, &a);
    if (!st && c->in[0]->ndim == 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "cannot gather from a scalar");
    return st ? st : ai_norm_axis(c->node, a, c->in[0]->ndim, axis);
}

static ai_status gather_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    int a;
    ai_status st = gather_axis(c, &a);
    if (st)
        return st;
    if (idx->dtype != AI_I64 && idx->dtype != AI_I32)
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s; int64 or int32 expected",
                             ai_dtype_name(idx->dtype));
    const int nd = x->ndim - 1 + idx->ndim;
    if (nd > AI_MAX_DIMS)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "output rank %d exceeds %d", nd,
                             AI_MAX_DIMS);
    int64_t s[AI_MAX_DIMS];
    memcpy(s, x->shape, sizeof(int64_t) * (size_t)a);
    memcpy(s + a, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    memcpy(s + a + idx->ndim, x->shape + a + 1, sizeof(int64_t) * (size_t)(x->ndim - a - 1));
    return set_meta(&out[0], x->dtype, nd, s);
}

/* Index i of the indices, made non-negative; -1 when out of range. */
static int64_t gather_index(const ai_tensor *idx, int64_t i, int64_t dim)
{
    int64_t v = idx->dtype == AI_I64 ? ((const int64_t *)idx->data)[i]
                                     : ((const int32_t *)idx->data)[i];
    if (v < 0)
        v += dim;
    return v >= 0 && v < dim ? v : -1;
}

/* data (outer, dim, inner), indices (ni) -> out (outer, ni, inner) */
static ai_status gather_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    int a;
    ai_status st = gather_axis(c, &a);
    if (st)
        return st;
    const int64_t outer = prod(x->shape, 0, a), dim = x->shape[a];
    const int64_t inner = prod(x->shape, a + 1, x->ndim), ni = ai_tensor_numel(idx);
    for (int64_t i = 0; i < ni; i++)
        if (gather_index(idx, i, dim) < 0)
            return ai_node_error(c->node, AI_ERR_INDEX,
                                 "index %g is out of range for axis %d of size %lld",
                                 ai_tensor_get_flat(idx, i), a, (long long)dim);
    const size_t row = (size_t)inner * ai_dtype_size(x->dtype);
    if (!row)
        return AI_OK;
    const char *xp = x->data;
    char *yp = c->out[0]->data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < ni; i++)
            memcpy(yp + (size_t)(o * ni + i) * row,
                   xp + (size_t)(o * dim + gather_index(idx, i, dim)) * row, row);
    return AI_OK;
}

/* dx[o, idx[i], :] += dy[o, i, :]; repeated indices accumulate */
static ai_status gather_backward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *idx = c->in[1];
    ai_tensor *dx = c->din[0];
    int a;
    ai_status st = gather_axis(c, &a);
    if (!st && dx)
        st = check_grad_dtype(c, dx);
    if (st || !dx)
        return st;
    const int64_t outer = prod(x->shape, 0, a), dim = x->shape[a];
    const int64_t inner = prod(x->shape, a + 1, x->ndim), ni = ai_tensor_numel(idx);
    const size_t es = ai_dtype_size(dx->dtype);
    const row_fn add = dx->dtype == AI_F32 ? row_add_f32 : row_add_f64;
    if (!inner)
        return AI_OK;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < ni; i++)
            add((char *)dx->data + (size_t)((o * dim + gather_index(idx, i, dim)) * inner) * es,
                1, (const char *)c->dout[0]->data + (size_t)((o * ni + i) * inner) * es, 1,
                inner, es);
    return AI_OK;
}

/* ---------------------------------------------------------------- Pad */

enum { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

typedef struct {
    int mode;
    int64_t before[AI_MAX_DIMS], after[AI_MAX_DIMS];
    unsigned char value[8];  /* the constant, in the data's dtype */
} pad_plan;

/* pads (input from opset 11, attribute before), axes (input, opset 18),
 * constant_value (input from opset 11, attribute 'value' before), mode
 * (constant, reflect, edge; wrap from opset 19). */
static ai_status pad_setup(const ai_ctx *c, pad_plan *p, int64_t *shape)
{
    const ai_node *node = c->node;
    const ai_tensor *x = c->in[0];
    const int nd = x->ndim;
    const char *mode;
    int64_t pads[2 * AI_MAX_DIMS], axes[AI_MAX_DIMS];
    int np, na = -1;
    memset(p, 0, sizeof *p);
    ai_status st = ai_attr_string(node, "mode", "constant", &mode);
    if (st)
        return st;
    if (strcmp(mode, "constant") == 0)
        p->mode = PAD_CONSTANT;
    else if (strcmp(mode, "reflect") == 0)
        p->mode = PAD_REFLECT;
    else if (strcmp(mode, "edge") == 0)
        p->mode = PAD_EDGE;
    else if (strcmp(mode, "wrap") == 0)
        p->mode = PAD_WRAP;
    else
        return ai_node_error(node, AI_ERR_NOT_IMPLEMENTED,
                             "mode '%s' is not supported (constant, reflect, edge, wrap)", mode);
    if ((st = int_list(c, 1, 11, "pads", pads, 2 * AI_MAX_DIMS, &np)))
        return st;
    if ((st = int_list(c, 3, 18, "axes", axes, AI_MAX_DIMS, &na)))
        return st;
    if (na < 0) {
        na = nd;
        for (int i = 0; i < nd; i++)
            axes[i] = i;
    }
    if (np != 2 * na)
        return ai_node_error(node, AI_ERR_VALUE, "pads has %d values; %d expected (2 per axis)",
                             np < 0 ? 0 : np, 2 * na);
    bool seen[AI_MAX_DIMS];
    if ((st = axes_flags(node, axes, na, nd, seen)))
        return st;
    for (int i = 0; i < na; i++) {
        int a = (int)(axes[i] < 0 ? axes[i] + nd : axes[i]);
        p->before[a] = pads[i];
        p->after[a] = pads[na + i];
    }
    for (int i = 0; i < np; i++)
        if (pads[i] < -INT32_MAX || pads[i] > INT32_MAX)
            return ai_node_error(node, AI_ERR_VALUE, "pads[%d] = %lld is out of range "
                                 "(at most 2^31-1 either way)", i, (long long)pads[i]);
    for (int d = 0; d < nd; d++) {
        int64_t n = x->shape[d], pad = p->before[d] + p->after[d]; /* |pad| <= 2^32 */
        if (pad > 0 && n > INT64_MAX - pad)
            return ai_node_error(node, AI_ERR_VALUE, "padding axis %d (%lld) overflows",
                                 d, (long long)n);
        int64_t out = n + pad;
        if (out < 0)
            return ai_node_error(node, AI_ERR_VALUE,
                                 "pads %lld and %lld crop more than axis %d holds (%lld)",
                                 (long long)p->before[d], (long long)p->after[d], d,
                                 (long long)n);
        int64_t kept = p->mode == PAD_WRAP ? n + (p->before[d] < 0 ? p->before[d] : 0) +
                                                 (p->after[d] < 0 ? p->after[d] : 0)
                                           : n;
        if (kept <= 0 && out > 0 && p->mode != PAD_CONSTANT)
            return ai_node_error(node, AI_ERR_VALUE, "mode '%s' cannot pad axis %d: nothing "
                                 "is left to repeat", mode, d);
        if (shape)
            shape[d] = out;
    }
    /* the constant: input 2 (same dtype as the data) or attribute 'value' */
    if (node->opset >= 11) {
        const ai_tensor *v = c->n_in > 2 ? c->in[2] : NULL;
        if (v && (v->dtype != x->dtype || ai_tensor_numel(v) != 1))
            return ai_node_error(node, AI_ERR_VALUE,
                                 "constant_value must be one %s value, got %s with %lld values",
                                 ai_dtype_name(x->dtype), ai_dtype_name(v->dtype),
                                 (long long)ai_tensor_numel(v));
        if (v && v->data) /* NULL while planning a non-constant value */
            memcpy(p->value, v->data, ai_dtype_size(x->dtype));
    } else {
        double value;
        if ((st = ai_attr_float(node, "value", 0.0, &value)))
            return st;
        ai_tensor src = {.dtype = AI_F64, .data = &value};
        ai_tensor dst = {.dtype = x->dtype, .data = p->value};
        if ((st = ai_tensor_copy(&dst, &src)))
            return st;
    }
    return AI_OK;
}

/* Source index along one axis for output index j (the input has n elements
 * there, `before` and `after` were added), or -1 for the constant.
 * Reflection and wrapping repeat like numpy's when the pad exceeds the axis. */
static int64_t pad_src(int mode, int64_t j, int64_t before, int64_t after, int64_t n)
{
    int64_t u = j - before;
    if (u >= 0 && u < n)
        return u;
    if (mode == PAD_CONSTANT)
        return -1;
    if (mode == PAD_EDGE)
        return u < 0 ? 0 : n - 1;
    if (mode == PAD_WRAP) { /* like torch's circular: crop first, then wrap */
        const int64_t lo = before < 0 ? -before : 0, m = n - lo - (after < 0 ? -after : 0);
        const int64_t v = j - (before > 0 ? before : 0);
        return lo + (v % m + m) % m;
    }
    const int64_t period = 2 * (n - 1);
    if (period == 0)
        return 0;
    u %= period;
    if (u < 0)
        u += period;
    return u < n ? u : period - u;
}

/* Offset (elements) of the input row feeding the output row at idx (the
 * last axis excluded), or -1 when the row is all constant. */
static int64_t pad_row(const pad_plan *p, const ai_tensor *x, const int64_t *xs,
                       const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < x->ndim - 1; d++) {
        int64_t s = pad_src(p->mode, idx[d], p->before[d], p->after[d], x->shape[d]);
        if (s < 0)
            return -1;
        off += s * xs[d];
    }
    return off;
}

/* Calls the body for each output row: yo (its offset) and xo (pad_row). */
#define PAD_ROWS(P, X, Y, W, ...)                                                     \
    do {                                                                               \
        const int nd_ = (Y)->ndim;                                                     \
        int64_t xs_[AI_MAX_DIMS], idx_[AI_MAX_DIMS] = {0};                             \
        ai_contiguous_strides((X)->ndim, (X)->shape, xs_);                             \
        const int64_t rows_ = nd_ ? prod((Y)->shape, 0, nd_ - 1) : 1;                  \
        for (int64_t r_ = 0; r_ < rows_; r_++) {                                       \
            const int64_t yo = r_ * (W), xo = pad_row((P), (X), xs_, idx_);            \
            __VA_ARGS__;                                                               \
            for (int d_ = nd_ - 2; d_ >= 0; d_--) {                                    \
                if (++idx_[d_] < (Y)->shape[d_])                                       \
                    break;                                                             \
                idx_[d_] = 0;                                                          \
            }                                                                          \
        }                                                                              \
    } while (0)

/* The columns of an output row: [lo, hi) copy input columns [lo - b, hi - b)
 * of the input row, the others (the edges: [0, lo) and [hi, W)) are the
 * constant or, in the other modes, repeat input columns (pad_src). */
typedef struct {
    int64_t W, lo, hi, b;
} pad_cols;

static pad_cols pad_cols_of(const pad_plan *p, const ai_tensor *x, const int64_t *yshape)
{
    const int nd = x->ndim;
    const int64_t W = nd ? yshape[nd - 1] : 1, n = nd ? x->shape[nd - 1] : 1;
    const int64_t b = nd ? p->before[nd - 1] : 0;
    const int64_t lo = b < 0 ? 0 : (b > W ? W : b);
    return (pad_cols){W, lo, b + n < lo ? lo : (b + n > W ? W : b + n), b};
}

/* Workspace: the source column of each edge column (not for the constant). */
static size_t pad_edge_bytes(const pad_plan *p, const pad_cols *pc)
{
    return p->mode == PAD_CONSTANT ? 0
                                   : (size_t)(pc->W - (pc->hi - pc->lo)) * sizeof(int64_t);
}

static ai_status pad_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    pad_plan p;
    int64_t shape[AI_MAX_DIMS];
    ai_status st = pad_setup(c, &p, shape);
    if (st)
        return st;
    const pad_cols pc = pad_cols_of(&p, c->in[0], shape);
    *ws = pad_edge_bytes(&p, &pc);
    return set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, shape);
}

/* The forward on the thread pool, over output rows. */
typedef struct {
    const pad_plan *p;
    const ai_tensor *x;
    ai_tensor *y;
    pad_cols pc;
    const int64_t *edge; /* source columns of [0, lo) then [hi, W); NULL: the constant */
} pad_job;

/* Output rows [r0, r1): the interior with one memcpy, the edges from the
 * column table; all-constant rows filled. T: an unsigned type of the
 * element's size (the bits are copied). */
#define DEFINE_PAD_ROWS(NAME, T)                                                       \
    static void NAME(const pad_job *j, int64_t r0, int64_t r1)                         \
    {                                                                                  \
        const ai_tensor *x = j->x, *y = j->y;                                          \
        const int nd = y->ndim;                                                        \
        const int64_t W = j->pc.W, lo = j->pc.lo, hi = j->pc.hi, mid = hi - lo;        \
        const int64_t *edge = j->edge;                                                 \
        int64_t xs[AI_MAX_DIMS], idx[AI_MAX_DIMS] = {0};                               \
        ai_contiguous_strides(x->ndim, x->shape, xs);                                  \
        for (int64_t d = nd - 2, rest = r0; d >= 0; rest /= y->shape[d--])            \
            idx[d] = rest % y->shape[d];                                               \
        T value;                                                                       \
        memcpy(&value, j->p->value, sizeof value);                                     \
        for (int64_t r = r0; r < r1; r++) {                                            \
            T *yr = (T *)y->data + r * W;                                              \
            const int64_t xo = pad_row(j->p, x, xs, idx);                              \
            if (xo < 0) {                                                              \
                for (int64_t k = 0; k < W; k++)                                        \
                    yr[k] = value;                                                     \
            } else {                                                                   \
                const T *xr = (const T *)x->data + xo;                                 \
                for (int64_t k = 0; k < lo; k++)                                       \
                    yr[k] = edge ? xr[edge[k]] : value;                                \
                if (mid > 0)                                                           \
                    memcpy(yr + lo, xr + lo - j->pc.b, (size_t)mid * sizeof(T));       \
                for (int64_t k = hi; k < W; k++)                                       \
                    yr[k] = edge ? xr[edge[k - mid]] : value;                          \
            }                                                                          \
            for (int d = nd - 2; d >= 0; d--) {                                        \
                if (++idx[d] < y->shape[d])                                            \
                    break;                                                             \
                idx[d] = 0;                                                            \
            }                                                                          \
        }                                                                              \
    }

DEFINE_PAD_ROWS(pad_rows_1, uint8_t)
DEFINE_PAD_ROWS(pad_rows_2, uint16_t)
DEFINE_PAD_ROWS(pad_rows_4, uint32_t)
DEFINE_PAD_ROWS(pad_rows_8, uint64_t)

static void pad_range(void *ctx, int64_t r0, int64_t r1)
{
    const pad_job *j = ctx;
    switch (ai_dtype_size(j->x->dtype)) {
    case 1: pad_rows_1(j, r0, r1); break;
    case 2: pad_rows_2(j, r0, r1); break;
    case 4: pad_rows_4(j, r0, r1); break;
    default: pad_rows_8(j, r0, r1); break;
    }
}

static ai_status pad_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    ai_tensor *y = c->out[0];
    pad_plan p;
    ai_status st = pad_setup(c, &p, NULL);
    if (st || ai_tensor_numel(y) == 0)
        return st;
    const size_t es = ai_dtype_size(x->dtype);
    if (es != 1 && es != 2 && es != 4 && es != 8)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "%s data is not supported",
                             ai_dtype_name(x->dtype));
    const int nd = y->ndim;
    pad_job j = {&p, x, y, pad_cols_of(&p, x, y->shape), NULL};
    if (p.mode != PAD_CONSTANT) {
        int64_t *edge = c->workspace;
        const int64_t n = nd ? x->shape[nd - 1] : 1, e = nd ? p.after[nd - 1] : 0;
        for (int64_t k = 0, i = 0; k < j.pc.W; k++)
            if (k < j.pc.lo || k >= j.pc.hi)
                edge[i++] = pad_src(p.mode, k, j.pc.b, e, n);
        j.edge = edge;
    }
    const int64_t rows = nd ? prod(y->shape, 0, nd - 1) : 1;
    ai_parallel_for(rows, ai_grain_of(j.pc.W), pad_range, &j);
    return AI_OK;
}

#define DEFINE_PAD_BACK(NAME, T)                                                       \
    static void NAME(const pad_plan *p, ai_tensor *dx, const ai_tensor *dy)            \
    {                                                                                  \
        const int nd = dy->ndim;                                                       \
        const int64_t W = nd ? dy->shape[nd - 1] : 1, n = nd ? dx->shape[nd - 1] : 1;  \
        const int64_t b = nd ? p->before[nd - 1] : 0, e = nd ? p->after[nd - 1] : 0;  \
        T *gx = dx->data;                                                              \
        const T *gy = dy->data;                                                        \
        PAD_ROWS(p, dx, dy, W, {                                                       \
            for (int64_t j = 0; xo >= 0 && j < W; j++) {                               \
                int64_t s = pad_src(p->mode, j, b, e, n);                              \
                if (s >= 0)                                                            \
                    gx[xo + s] += gy[yo + j];                                          \
            }                                                                          \
        });                                                                            \
    }

DEFINE_PAD_BACK(pad_back_f32, float)
DEFINE_PAD_BACK(pad_back_f64, double)

static ai_status pad_backward(ai_ctx *c)
{
    pad_plan p;
    ai_status st = pad_setup(c, &p, NULL);
    if (!st && c->din[0]) /* no gradient for constant_value */
        st = check_grad_dtype(c, c->din[0]);
    if (st || !c->din[0] || ai_tensor_numel(c->dout[0]) == 0)
        return st;
    if (c->din[0]->dtype == AI_F32)
        pad_back_f32(&p, c->din[0], c->dout[0]);
    else
        pad_back_f64(&p, c->din[0], c->dout[0]);
    return AI_OK;
}

/* ---------------------------------------------------------------- Shape */

/* dims [start, end) of the input's shape (opset 15 attributes), clamped. */
static int64_t clamp_dim(int64_t i, int64_t r)
{
    i = i < 0 ? i + r : i;
    return i < 0 ? 0 : (i > r ? r : i);
}

static ai_status shape_range(const ai_ctx *c, int64_t *start, int64_t *end)
{
    const int64_t r = c->in[0]->ndim;
    ai_status st = ai_attr_int(c->node, "start", 0, start);
    ai_status st_end = ai_attr_int(c->node, "end", r, end);
    *start = clamp_dim(*start, r);
    *end = clamp_dim(*end, r);
    if (*end < *start)
        *end = *start;
    return st ? st : st_end;
}

static ai_status shape_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    int64_t start, end;
    ai_status st = shape_range(c, &start, &end);
    int64_t len = end - start;
    return st ? st : set_meta(&out[0], AI_I64, 1, &len);
}

/* Runs at plan time on the input's shape alone (AI_OP_FOLD_ON_SHAPE). */
static ai_status shape_forward(ai_ctx *c)
{
    int64_t start, end;
    ai_status st = shape_range(c, &start, &end);
    for (int64_t i = start; !st && i < end; i++)
        ((int64_t *)c->out[0]->data)[i - start] = c->in[0]->shape[i];
    return st;
}

/* ---------------------------------------------------------------- ConstantOfShape */

static ai_status cos_value(const ai_ctx *c, const ai_tensor **value)
{
    const ai_attr *a = ai_node_attr(c->node, "value");
    *value = NULL;
    if (!a)
        return AI_OK;
    if (a->type != AI_ATTR_TENSOR || ai_tensor_numel(a->t) != 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "attribute 'value' must be a one-element "
                             "tensor");
    *value = a->t;
    return AI_OK;
}

static ai_status cos_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *value;
    int64_t s[AI_MAX_DIMS];
    int n;
    ai_status st = cos_value(c, &value);
    if (!st)
        st = int_list(c, 0, 1, "shape", s, AI_MAX_DIMS, &n);
    if (st)
        return st;
    for (int i = 0; i < n; i++)
        if (s[i] < 0)
            return ai_node_error(c->node, AI_ERR_VALUE, "shape[%d] = %lld is negative", i,
                                 (long long)s[i]);
    return set_meta(&out[0], value ? value->dtype : AI_F32, n, s);
}

static ai_status cos_forward(ai_ctx *c)
{
    const ai_tensor *value;
    ai_status st = cos_value(c, &value);
    ai_tensor *y = c->out[0];
    const size_t es = ai_dtype_size(y->dtype);
    const int64_t n = ai_tensor_numel(y);
    if (st || n == 0)
        return st;
    if (!value) {
        memset(y->data, 0, (size_t)n * es); /* the default: float32 zeros */
        return AI_OK;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)y->data + (size_t)i * es, value->data, es);
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

#define OP(VAR, NAME, MIN_IN, MAX_IN, MAX_OUT, FLAGS, SHAPE, FWD, BWD)                  \
    static const ai_op_def VAR = {NAME, "", MIN_IN, MAX_IN, 1, MAX_OUT, FLAGS, NULL,     \
                                  SHAPE, FWD, BWD};

#define ASSIGN1 AI_OP_GRAD_ASSIGN(1) /* writes all of dx on a first write */
/* a copy: backward passes dy through and reads no value */
#define FLAT (ASSIGN1 | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y)
OP(op_reshape, "Reshape", 2, 2, 1, FLAT, reshape_shape, flat_forward, flat_backward)
OP(op_flatten, "Flatten", 1, 1, 1, FLAT, flatten_shape, flat_forward, flat_backward)
OP(op_squeeze, "Squeeze", 1, 2, 1, FLAT, squeeze_shape, flat_forward, flat_backward)
OP(op_unsqueeze, "Unsqueeze", 1, 2, 1, FLAT, unsqueeze_shape, flat_forward, flat_backward)
#undef FLAT
OP(op_transpose, "Transpose", 1, 1, 1, ASSIGN1, transpose_shape, transpose_forward,
   transpose_backward)
OP(op_concat, "Concat", 1, AI_MAX_IO, 1, AI_OP_GRAD_ASSIGN(AI_MAX_IO), concat_shape,
   concat_forward, concat_backward)
OP(op_split, "Split", 1, 2, AI_MAX_IO, ASSIGN1, split_shape, split_forward, split_backward)
OP(op_slice, "Slice", 1, 5, 1, 0, slice_shape, slice_forward, slice_backward)
OP(op_expand, "Expand", 2, 2, 1, ASSIGN1, expand_shape, expand_forward, expand_backward)
OP(op_trilu, "Trilu", 1, 2, 1, ASSIGN1 | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, trilu_shape,
   trilu_forward, trilu_backward)
OP(op_gather_elements, "GatherElements", 2, 2, 1, ASSIGN1 | AI_OP_BWD_NO_Y, ge_shape,
   ge_forward, ge_backward)
OP(op_tile, "Tile", 2, 2, 1, ASSIGN1 | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, tile_shape,
   tile_forward, tile_backward)
OP(op_depth_to_space, "DepthToSpace", 1, 1, 1, ASSIGN1 | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
   d2s_shape, d2s_forward, d2s_backward)
OP(op_space_to_depth, "SpaceToDepth", 1, 1, 1, ASSIGN1 | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
   d2s_shape, d2s_forward, d2s_backward)
OP(op_gather, "Gather", 2, 2, 1, 0, gather_shape, gather_forward, gather_backward)
OP(op_pad, "Pad", 1, 4, 1, 0, pad_shape, pad_forward, pad_backward)
#undef ASSIGN1
OP(op_shape, "Shape", 1, 1, 1, AI_OP_FOLD_ON_SHAPE, shape_shape, shape_forward, NULL)
OP(op_constant_of_shape, "ConstantOfShape", 1, 1, 1, 0, cos_shape, cos_forward, NULL)

/* Size: the number of elements, an int64 scalar (folded from the shape). */
static ai_status size_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)c;
    (void)ws;
    (void)state;
    out[0].dtype = AI_I64;
    out[0].ndim = 0;
    return AI_OK;
}

static ai_status size_forward(ai_ctx *c)
{
    *(int64_t *)c->out[0]->data = ai_tensor_numel(c->in[0]);
    return AI_OK;
}

OP(op_size, "Size", 1, 1, 1, AI_OP_FOLD_ON_SHAPE, size_shape, size_forward, NULL)

const ai_op_def *const ai_ops_shape[] = {
    &op_reshape, &op_flatten, &op_squeeze, &op_unsqueeze, &op_transpose, &op_concat,
    &op_split, &op_slice, &op_expand, &op_tile, &op_depth_to_space, &op_space_to_depth,
    &op_trilu, &op_gather_elements,
    &op_gather, &op_pad, &op_shape, &op_constant_of_shape, &op_size, NULL,
};
