/*
 * pad.c — Pad: constant, reflect, edge and wrap modes, negative pads
 * cropping. Forward fills output rows on the thread pool (the interior with
 * one copy, the edges from a table of source columns; rank 2 and more plane
 * by plane, the rows' sources from a table too); backward adds each
 * output gradient element to the input element it came from (plane by
 * plane on the thread pool where only the last two axes are padded; a
 * data-movement family: movement.h).
 */
#include <string.h>

#include "../kernels/simd.h"
#include "../parallel.h"
#include "movement.h"

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
    if ((st = ai_ints_input(c, 1, 11, "pads", pads, 2 * AI_MAX_DIMS, &np)))
        return st;
    if ((st = ai_ints_input(c, 3, 18, "axes", axes, AI_MAX_DIMS, &na)))
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
    if ((st = ai_axes_flags(node, axes, na, nd, seen)))
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
 * last axis excluded), or -1 when the row is all constant; pad_offset: of
 * the input block at the output index idx of the first nd axes. */
static int64_t pad_offset(const pad_plan *p, const ai_tensor *x, const int64_t *xs,
                          const int64_t *idx, int nd)
{
    int64_t off = 0;
    for (int d = 0; d < nd; d++) {
        int64_t s = pad_src(p->mode, idx[d], p->before[d], p->after[d], x->shape[d]);
        if (s < 0)
            return -1;
        off += s * xs[d];
    }
    return off;
}

static int64_t pad_row(const pad_plan *p, const ai_tensor *x, const int64_t *xs,
                       const int64_t *idx)
{
    return pad_offset(p, x, xs, idx, x->ndim - 1);
}

/* Calls the body for each output row: yo (its offset) and xo (pad_row). */
#define PAD_ROWS(P, X, Y, W, ...)                                                     \
    do {                                                                               \
        const int nd_ = (Y)->ndim;                                                     \
        int64_t xs_[AI_MAX_DIMS], idx_[AI_MAX_DIMS] = {0};                             \
        ai_contiguous_strides((X)->ndim, (X)->shape, xs_);                             \
        const int64_t rows_ = nd_ ? ai_shape_prod((Y)->shape, 0, nd_ - 1) : 1;        \
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

/* Workspace: the source column of each edge column (not for the constant),
 * then the source row (pad_src, -1 for the constant) of each output row of
 * a plane (the second last axis; rank 2 and more). */
static size_t pad_edge_bytes(const pad_plan *p, const pad_cols *pc)
{
    return p->mode == PAD_CONSTANT ? 0
                                   : (size_t)(pc->W - (pc->hi - pc->lo)) * sizeof(int64_t);
}

static size_t pad_ws_bytes(const pad_plan *p, const pad_cols *pc, int nd, const int64_t *yshape)
{
    return pad_edge_bytes(p, pc) + (nd >= 2 ? (size_t)yshape[nd - 2] * sizeof(int64_t) : 0);
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
    *ws = pad_ws_bytes(&p, &pc, c->in[0]->ndim, shape);
    return ai_set_meta(&out[0], c->in[0]->dtype, c->in[0]->ndim, shape);
}

/* The forward on the thread pool, over output rows. */
typedef struct {
    const pad_plan *p;
    const ai_tensor *x;
    ai_tensor *y;
    pad_cols pc;
    const int64_t *edge; /* source columns of [0, lo) then [hi, W); NULL: the constant */
    const int64_t *rows; /* source row of each output row of a plane (rank >= 2) */
    bool reference;      /* the row by row twin (ai_fast_kernels() false) */
} pad_job;

/* Output rows [r0, r1): the interior with one memcpy, the edges from the
 * column table; all-constant rows filled. T: an unsigned type of the
 * element's size (the bits are copied). Rank 1, and the reference twin of
 * the plane kernel below (ai_fast_kernels() false). */
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

/* The same rows (rank >= 2) plane by plane: the input plane's offset once
 * per plane (pad_offset), each row's from the table of source rows; rows of
 * at most PAD_SHORT_ROW bytes copied by a loop (GCC's vectors), not a
 * memcpy call. Reflect-padding (8, 32, 32, 32) by 1 on the last two axes,
 * 1 thread: 1.3 -> 0.8 of torch's time. */
#define PAD_SHORT_ROW 512
#define DEFINE_PAD_PLANES(NAME, T)                                                     \
    AI_SHORT_LOOPS static void NAME(const pad_job *j, int64_t r0, int64_t r1)          \
    {                                                                                  \
        const ai_tensor *x = j->x, *y = j->y;                                          \
        const int nd = y->ndim;                                                        \
        const int64_t W = j->pc.W, lo = j->pc.lo, hi = j->pc.hi, mid = hi - lo;        \
        const int64_t *edge = j->edge, *rows = j->rows, Hy = y->shape[nd - 2];         \
        const bool short_row = mid * (int64_t)sizeof(T) <= PAD_SHORT_ROW;              \
        int64_t xs[AI_MAX_DIMS], idx[AI_MAX_DIMS] = {0};                               \
        ai_contiguous_strides(x->ndim, x->shape, xs);                                  \
        for (int64_t d = nd - 3, rest = r0 / Hy; d >= 0; rest /= y->shape[d--])       \
            idx[d] = rest % y->shape[d];                                               \
        T value;                                                                       \
        memcpy(&value, j->p->value, sizeof value);                                     \
        for (int64_t r = r0; r < r1;) {                                                \
            const int64_t po = pad_offset(j->p, x, xs, idx, nd - 2);                   \
            const int64_t i1 = r - r % Hy + Hy < r1 ? Hy : r1 - (r - r % Hy);          \
            for (int64_t i = r % Hy; i < i1; i++, r++) {                               \
                T *yr = (T *)y->data + r * W;                                          \
                if (po < 0 || rows[i] < 0) {                                           \
                    for (int64_t k = 0; k < W; k++)                                    \
                        yr[k] = value;                                                 \
                    continue;                                                          \
                }                                                                      \
                const T *xr = (const T *)x->data + po + rows[i] * xs[nd - 2];          \
                if (edge) {                                                            \
                    for (int64_t k = 0; k < lo; k++)                                   \
                        yr[k] = xr[edge[k]];                                           \
                    for (int64_t k = hi; k < W; k++)                                   \
                        yr[k] = xr[edge[k - mid]];                                     \
                } else {                                                               \
                    for (int64_t k = 0; k < lo; k++)                                   \
                        yr[k] = value;                                                 \
                    for (int64_t k = hi; k < W; k++)                                   \
                        yr[k] = value;                                                 \
                }                                                                      \
                T *yi = yr + lo;                                                       \
                const T *xi = xr + lo - j->pc.b;                                       \
                if (short_row)                                                         \
                    for (int64_t k = 0; k < mid; k++)                                  \
                        yi[k] = xi[k];                                                 \
                else if (mid > 0)                                                      \
                    memcpy(yi, xi, (size_t)mid * sizeof(T));                           \
            }                                                                          \
            for (int d = nd - 3; d >= 0; d--) {                                        \
                if (++idx[d] < y->shape[d])                                            \
                    break;                                                             \
                idx[d] = 0;                                                            \
            }                                                                          \
        }                                                                              \
    }

DEFINE_PAD_PLANES(pad_planes_1, uint8_t)
DEFINE_PAD_PLANES(pad_planes_2, uint16_t)
DEFINE_PAD_PLANES(pad_planes_4, uint32_t)
DEFINE_PAD_PLANES(pad_planes_8, uint64_t)

static void pad_range(void *ctx, int64_t r0, int64_t r1)
{
    const pad_job *j = ctx;
    const size_t es = ai_dtype_size(j->x->dtype);
    if (j->rows && !j->reference) {
        switch (es) {
        case 1: pad_planes_1(j, r0, r1); break;
        case 2: pad_planes_2(j, r0, r1); break;
        case 4: pad_planes_4(j, r0, r1); break;
        default: pad_planes_8(j, r0, r1); break;
        }
        return;
    }
    switch (es) {
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
    pad_job j = {&p, x, y, pad_cols_of(&p, x, y->shape), NULL, NULL, !ai_fast_kernels()};
    int64_t *ws = c->workspace;
    if (p.mode != PAD_CONSTANT) {
        const int64_t n = nd ? x->shape[nd - 1] : 1, e = nd ? p.after[nd - 1] : 0;
        for (int64_t k = 0, i = 0; k < j.pc.W; k++)
            if (k < j.pc.lo || k >= j.pc.hi)
                ws[i++] = pad_src(p.mode, k, j.pc.b, e, n);
        j.edge = ws;
        ws += pad_edge_bytes(&p, &j.pc) / sizeof *ws;
    }
    if (nd >= 2) {
        for (int64_t i = 0; i < y->shape[nd - 2]; i++)
            ws[i] = pad_src(p.mode, i, p.before[nd - 2], p.after[nd - 2], x->shape[nd - 2]);
        j.rows = ws;
    }
    const int64_t rows = nd ? ai_shape_prod(y->shape, 0, nd - 1) : 1;
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

/* Backward plane by plane (the last two axes) on the thread pool where the
 * axes before them are not padded, so that an output plane feeds its input
 * plane alone: each output row added to its source row, the interior
 * columns by one loop that vectorises, the edge columns through pad_src.
 * The same additions in the same order as the reference above (row after
 * row, column after column), whatever the split: the same values at any
 * thread count. bench_ops's reflect pad of 8 x 32 x 32 x 32, 1 thread:
 * the reference (pad_src for every element, one thread) 0.38 ms. The
 * reference runs where ai_fast_kernels() is false. */
typedef struct {
    const pad_plan *p;
    pad_cols pc;
    int64_t H, Hin, hb, he, n, e; /* rows out and in, the row axis's pads; columns in */
    bool f64;
    void *dx;
    const void *dy;
} pad_back_job;

#define DEFINE_PAD_BACK_PLANES(NAME, T)                                                \
    AI_VECTOR_CLONES static void NAME(const pad_back_job *j, int64_t p0, int64_t p1)   \
    {                                                                                  \
        const pad_cols pc = j->pc;                                                     \
        const int mode = j->p->mode;                                                   \
        for (int64_t pl = p0; pl < p1; pl++) {                                         \
            T *gx = (T *)j->dx + pl * j->Hin * j->n;                                   \
            const T *gy = (const T *)j->dy + pl * j->H * pc.W;                         \
            for (int64_t r = 0; r < j->H; r++, gy += pc.W) {                           \
                const int64_t s = pad_src(mode, r, j->hb, j->he, j->Hin);              \
                if (s < 0)                                                             \
                    continue;                                                          \
                T *gr = gx + s * j->n;                                                 \
                for (int64_t c = 0; c < pc.lo; c++) {                                  \
                    const int64_t k = pad_src(mode, c, pc.b, j->e, j->n);              \
                    if (k >= 0)                                                        \
                        gr[k] += gy[c];                                                \
                }                                                                      \
                for (int64_t c = pc.lo; c < pc.hi; c++)                                \
                    gr[c - pc.b] += gy[c];                                             \
                for (int64_t c = pc.hi; c < pc.W; c++) {                               \
                    const int64_t k = pad_src(mode, c, pc.b, j->e, j->n);              \
                    if (k >= 0)                                                        \
                        gr[k] += gy[c];                                                \
                }                                                                      \
            }                                                                          \
        }                                                                              \
    }

DEFINE_PAD_BACK_PLANES(pad_back_planes_f32, float)
DEFINE_PAD_BACK_PLANES(pad_back_planes_f64, double)

static void pad_back_range(void *ctx, int64_t p0, int64_t p1)
{
    const pad_back_job *j = ctx;
    if (j->f64)
        pad_back_planes_f64(j, p0, p1);
    else
        pad_back_planes_f32(j, p0, p1);
}

/* Whether pad_back_planes applies (the axes before the last two unpadded),
 * and then runs it */
static bool pad_back_by_planes(const pad_plan *p, ai_tensor *dx, const ai_tensor *dy)
{
    const int nd = dy->ndim;
    if (nd < 1 || !ai_fast_kernels())
        return false;
    for (int d = 0; d < nd - 2; d++)
        if (p->before[d] != 0 || p->after[d] != 0)
            return false;
    const bool rows = nd >= 2;
    pad_back_job j = {p, pad_cols_of(p, dx, dy->shape),
                      rows ? dy->shape[nd - 2] : 1, rows ? dx->shape[nd - 2] : 1,
                      rows ? p->before[nd - 2] : 0, rows ? p->after[nd - 2] : 0,
                      dx->shape[nd - 1], p->after[nd - 1], dx->dtype == AI_F64, dx->data,
                      dy->data};
    const int64_t planes = rows ? ai_shape_prod(dy->shape, 0, nd - 2) : 1;
    ai_parallel_for(planes, ai_grain_of(j.H * j.pc.W), pad_back_range, &j);
    return true;
}

static ai_status pad_backward(ai_ctx *c)
{
    pad_plan p;
    ai_status st = pad_setup(c, &p, NULL);
    if (!st && c->din[0]) /* no gradient for constant_value */
        st = ai_check_grad_dtype(c, c->din[0]);
    if (st || !c->din[0] || ai_tensor_numel(c->dout[0]) == 0)
        return st;
    if (pad_back_by_planes(&p, c->din[0], c->dout[0]))
        return AI_OK;
    if (c->din[0]->dtype == AI_F32)
        pad_back_f32(&p, c->din[0], c->dout[0]);
    else
        pad_back_f64(&p, c->din[0], c->dout[0]);
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

OP(op_pad, "Pad", 1, 4, 1, 0, pad_shape, pad_forward, pad_backward)

const ai_op_def *const ai_ops_pad[] = {&op_pad, NULL};
