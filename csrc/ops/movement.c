/*
 * movement.c — the strided walk, and the operators that are one: Transpose,
 * Concat, Split, Slice, Expand, Tile, DepthToSpace, SpaceToDepth. Also the
 * helpers the other data-movement families share (movement.h).
 *
 * A walk sees the input and output as two strided views of one index space
 * (Transpose permutes strides, Slice steps them, Expand zeroes them,
 * Concat/Split offset them). Forward copies src -> dst along the walk;
 * backward swaps the roles and adds dst-gradient -> src-gradient.
 */
#include <stdlib.h>
#include <string.h>

#include "../kernels/conv.h"
#include "../parallel.h"
#include "movement.h"

/* ---------------------------------------------------------------- helpers */

ai_status ai_set_meta(ai_meta *m, ai_dtype dt, int nd, const int64_t *shape)
{
    m->dtype = dt;
    m->ndim = nd;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)nd);
    return AI_OK;
}

int64_t ai_shape_prod(const int64_t *shape, int from, int to)
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
ai_status ai_ints_input(const ai_ctx *c, int index, int since, const char *name,
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
ai_status ai_axes_flags(const ai_node *node, const int64_t *axes, int n, int rank,
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
ai_status ai_check_grad_dtype(const ai_ctx *c, const ai_tensor *g)
{
    if (g->dtype == AI_F32 || g->dtype == AI_F64)
        return AI_OK;
    return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                         "gradient for %s data is not supported", ai_dtype_name(g->dtype));
}

/* ---------------------------------------------------------------- strided walks */

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
    void NAME(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n,           \
              size_t es)                                                               \
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

DEFINE_ROW_ADD(ai_row_add_f32, float)
DEFINE_ROW_ADD(ai_row_add_f64, double)

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

/* Items [lo, hi) of a merged walk (walk_run): item it is piece
 * it % pieces of row it / pieces, a row cut into `pieces` equal runs (1
 * but for rows of more than AI_GRAIN_ELEMS elements: a contiguous copy is
 * one row after merging, which would run on one thread). Each element is
 * written by one piece, so the split never changes a value. */
typedef struct {
    walk w; /* merged: size-1 dimensions dropped, contiguous runs joined */
    char *dst;
    const char *src;
    size_t es;
    ai_row_fn row;
    int64_t pieces;
} walk_job;

static void walk_range(void *ctx, int64_t lo, int64_t hi)
{
    const walk_job *j = ctx;
    const walk *w = &j->w;
    const int nd = w->nd;
    const int64_t inner = nd ? w->shape[nd - 1] : 1, e = (int64_t)j->es, pieces = j->pieces;
    const int64_t sd = nd ? w->sd[nd - 1] : 1, ss = nd ? w->ss[nd - 1] : 1;
    int64_t idx[AI_MAX_DIMS] = {0}, od = w->od, os = w->os;
    int64_t below = 1;
    for (int d = nd - 2; d >= 0; d--) { /* row lo / pieces's index */
        idx[d] = lo / pieces / below % w->shape[d];
        below *= w->shape[d];
        od += idx[d] * w->sd[d];
        os += idx[d] * w->ss[d];
    }
    for (int64_t it = lo; it < hi; it++) {
        const int64_t k = it % pieces, c0 = inner * k / pieces, c1 = inner * (k + 1) / pieces;
        j->row(j->dst + (od + c0 * sd) * e, sd, j->src + (os + c0 * ss) * e, ss, c1 - c0,
               j->es);
        if (k < pieces - 1)
            continue;
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
                         j->row == ai_row_add_f32);
    }
}

/* Every row of w (their destinations never overlap: each walk maps one
 * element to one), rows split between threads where there are enough;
 * float32 transposes by blocks (transpose_range). */
static void walk_run(const walk *w0, char *dst, const char *src, size_t es, ai_row_fn row,
                     bool f32)
{
    /* drop size-1 dimensions; merge a dimension into the previous one when
     * both sides are contiguous across them (long rows, few calls) */
    walk_job j = {.dst = dst, .src = src, .es = es, .row = row, .pieces = 1};
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
    const int64_t rows = nd ? ai_shape_prod(w->shape, 0, nd - 1) : 1;
    if (f32 && (row == row_copy || row == ai_row_add_f32) && nd >= 2 &&
        w->sd[nd - 1] == 1 && w->ss[nd - 2] == 1 && w->ss[nd - 1] > 1 &&
        w->shape[nd - 2] >= 8 && w->shape[nd - 1] >= 8) {
        const int64_t items =
            ai_shape_prod(w->shape, 0, nd - 2) * ((w->shape[nd - 2] + TR_BAND - 1) / TR_BAND);
        ai_parallel_for(items, ai_grain_of(TR_BAND * inner), transpose_range, &j);
        return;
    }
    j.pieces = inner > AI_GRAIN_ELEMS ? inner / AI_GRAIN_ELEMS : 1;
    ai_parallel_for(rows * j.pieces, ai_grain_of(inner / j.pieces), walk_range, &j);
}

void ai_copy_elems(void *dst, const void *src, int64_t n, size_t es)
{
    walk w;
    walk_init(&w, 1, &n);
    walk_run(&w, dst, src, es, row_copy, false);
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
    ai_status st = ai_check_grad_dtype(c, din);
    if (st)
        return st;
    walk b = walk_swapped(w);
    walk_run(&b, din->data, dout->data, ai_dtype_size(din->dtype),
             assign ? row_copy : din->dtype == AI_F32 ? ai_row_add_f32 : ai_row_add_f64,
             din->dtype == AI_F32);
    return AI_OK;
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
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, w.nd, w.shape);
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
    return ai_set_meta(&out[0], x0->dtype, x0->ndim, shape);
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
        st = ai_ints_input(c, 1, 13, "split", sizes, AI_MAX_IO, &n);
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
        ai_set_meta(&out[k], c->in[0]->dtype, c->in[0]->ndim, c->in[0]->shape);
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
    ai_status st = ai_ints_input(c, 1, 10, "starts", starts, AI_MAX_DIMS, &ns);
    if (!st)
        st = ai_ints_input(c, 2, 10, "ends", ends, AI_MAX_DIMS, &ne);
    if (!st)
        st = ai_ints_input(c, 3, 10, "axes", axes, AI_MAX_DIMS, &na);
    if (!st)
        st = ai_ints_input(c, 4, 10, "steps", steps, AI_MAX_DIMS, &nt);
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
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, w.nd, w.shape);
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
    ai_status st = ai_ints_input(c, 1, 1, "shape", s, AI_MAX_DIMS, &n);
    if (!st && n < 0)
        st = ai_node_error(c->node, AI_ERR_VALUE, "the shape input is missing");
    if (!st)
        st = ai_broadcast_shape(c->node, x->ndim, x->shape, n, s, &nd, shape);
    return st ? st : ai_set_meta(&out[0], x->dtype, nd, shape);
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
    ai_status st = ai_check_grad_dtype(c, c->din[0]);
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
    ai_status st = ai_ints_input(c, 1, 1, "repeats", rep, AI_MAX_DIMS, &n);
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
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, y);
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
    ai_status st = ai_check_grad_dtype(c, c->din[0]);
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
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, 4, y);
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

/* ---------------------------------------------------------------- registry */

OP(op_transpose, "Transpose", 1, 1, 1, ASSIGN1 | AI_OP_HALF | AI_OP_ANY_DTYPE, transpose_shape, transpose_forward,
   transpose_backward)
OP(op_concat, "Concat", 1, AI_MAX_IO, 1, AI_OP_GRAD_ASSIGN(AI_MAX_IO) | AI_OP_HALF | AI_OP_ANY_DTYPE, concat_shape,
   concat_forward, concat_backward)
OP(op_split, "Split", 1, 2, AI_MAX_IO, ASSIGN1 | AI_OP_HALF | AI_OP_ANY_DTYPE, split_shape, split_forward, split_backward)
OP(op_slice, "Slice", 1, 5, 1, AI_OP_HALF | AI_OP_ANY_DTYPE, slice_shape, slice_forward, slice_backward)
OP(op_expand, "Expand", 2, 2, 1, ASSIGN1 | AI_OP_HALF | AI_OP_ANY_DTYPE, expand_shape, expand_forward, expand_backward)
OP(op_tile, "Tile", 2, 2, 1, ASSIGN1 | AI_OP_HALF | AI_OP_ANY_DTYPE | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y, tile_shape,
   tile_forward, tile_backward)
OP(op_depth_to_space, "DepthToSpace", 1, 1, 1, ASSIGN1 | AI_OP_HALF | AI_OP_ANY_DTYPE | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
   d2s_shape, d2s_forward, d2s_backward)
OP(op_space_to_depth, "SpaceToDepth", 1, 1, 1, ASSIGN1 | AI_OP_HALF | AI_OP_ANY_DTYPE | AI_OP_BWD_NO_X | AI_OP_BWD_NO_Y,
   d2s_shape, d2s_forward, d2s_backward)

const ai_op_def *const ai_ops_movement[] = {
    &op_transpose, &op_concat, &op_split, &op_slice, &op_expand, &op_tile,
    &op_depth_to_space, &op_space_to_depth, NULL,
};
