/*
 * plan.c — planning and running a graph: shape inference with constant
 * folding, the schedule, the liveness-based memory plan, forward, backward.
 *
 * Time line of the memory plan: forward step s runs at time s (0..S-1); the
 * backward of step s runs at time 2S-1-s; output gradients are seeded at
 * time S. An activation lives from its producer's step to its last reader
 * (to the end of backward when a backward that will run reads it: see
 * AI_OP_BWD_NO_X in graph.h); a gradient lives from the backward of the
 * value's last reader to the backward of its producer. Buffers whose
 * lifetimes do not overlap share memory.
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */
#if defined(__APPLE__)
#define _DARWIN_C_SOURCE /* _SC_PHYS_PAGES */
#endif
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "parallel.h"
#include "plan.h"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#define ALIGN_UP(x) (((x) + (AI_ALIGN - 1)) / AI_ALIGN * AI_ALIGN)

/* ---------------------------------------------------------------- memory limit */

static atomic_size_t memory_limit; /* 0: the default */

void ai_set_memory_limit(size_t bytes)
{
    atomic_store(&memory_limit, bytes);
}

/* 80% of the physical memory, where the system tells it. */
static size_t default_memory_limit(void)
{
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (uint64_t)pages <= SIZE_MAX / 5 / (uint64_t)page)
        return (size_t)pages * (size_t)page / 5 * 4;
#endif
    return AI_NO_MEMORY_LIMIT;
}

size_t ai_memory_limit(void)
{
    size_t limit = atomic_load(&memory_limit);
    return limit ? limit : default_memory_limit();
}

/* Adds `bytes` (what node n needs for `what`) to the plan's `*total`, or
 * refuses when that passes `limit` (at most PTRDIFF_MAX, and each addend is
 * a size that fits: no sum overflows). */
static ai_status budget_add(size_t *total, size_t bytes, size_t limit, const ai_node *n,
                            const char *what)
{
    if (bytes > limit || *total > limit - bytes) {
        if (!*total)
            return ai_node_error(n, AI_ERR_NOMEM,
                                 "%s needs %zu bytes, over the memory limit of %zu bytes "
                                 "(aidge_interop.set_memory_limit)", what, bytes, limit);
        return ai_node_error(n, AI_ERR_NOMEM,
                             "%s needs %zu bytes, which brings the plan to %zu bytes, over "
                             "the memory limit of %zu bytes (aidge_interop.set_memory_limit)",
                             what, bytes, *total + bytes, limit);
    }
    *total += bytes;
    return AI_OK;
}

void ai_plan_free(ai_plan *p)
{
    if (!p)
        return;
    for (int v = 0; v < p->n_values; v++) {
        ai_tensor_free(p->folded[v]);
        ai_tensor_free(p->known[v]);
        ai_tensor_free(p->act[v]);
        ai_tensor_free(p->gradv[v]);
        if (p->wide)
            ai_tensor_free(p->wide[v]);
    }
    for (int i = 0; i < p->n_inputs; i++)
        ai_tensor_free(p->bound[i]);
    ai_tensor_free(p->arena);
    ai_tensor_free(p->state_mem);
    ai_tensor_free(p->zeros);
    free(p->workspace);
    free(p->in_shapes);
    free(p->meta);
    free(p->folded);
    free(p->known);
    free(p->act);
    free(p->gradv);
    free(p->needs_grad);
    free(p->grad_reaches);
    free(p->fresh);
    free(p->grad_borrow);
    free(p->grad_ready);
    free(p->def_step);
    free(p->last_step);
    free(p->kept);
    free(p->view_of);
    free(p->grad_view_of);
    free(p->view_node);
    free(p->pass_out);
    free(p->passed);
    free(p->poison_at);
    free(p->sched);
    free(p->state);
    free(p->state_size);
    free(p->bound);
    free(p->half_mode);
    free(p->scratch_at);
    free(p->wide);
    free(p);
}

/* ---------------------------------------------------------------- helpers */

static void meta_of(ai_meta *m, const ai_tensor *t)
{
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof m->shape);
}

static void tensor_of_meta(ai_tensor *t, const ai_meta *m, void *data)
{
    memset(t, 0, sizeof *t);
    t->dtype = m->dtype;
    t->ndim = m->ndim;
    memcpy(t->shape, m->shape, sizeof t->shape);
    ai_contiguous_strides(m->ndim, m->shape, t->strides);
    t->data = data;
}

static size_t meta_bytes(const ai_meta *m)
{
    size_t n = ai_dtype_size(m->dtype);
    for (int i = 0; i < m->ndim; i++)
        n *= (size_t)m->shape[i];
    return n;
}

/* A view of `len` bytes of the arena at `offset`, typed as `m`. */
static ai_status arena_view(ai_tensor **out, ai_tensor *arena, size_t offset, const ai_meta *m)
{
    ai_status st = ai_tensor_share(out, arena);
    if (st)
        return st;
    ai_tensor *t = *out;
    t->dtype = m->dtype;
    t->ndim = m->ndim;
    memcpy(t->shape, m->shape, sizeof t->shape);
    ai_contiguous_strides(m->ndim, m->shape, t->strides);
    t->data = meta_bytes(m) ? (char *)arena->data + offset : NULL;
    return AI_OK;
}

/* The tensor holding value v at run time (NULL for a not-yet-bound input). */
static ai_tensor *runtime(const ai_graph *g, const ai_plan *p, int v)
{
    const ai_value *val = &g->values[v];
    if (p->folded[v])
        return p->folded[v];
    switch (val->kind) {
    case AI_VAL_INPUT:
        for (int i = 0; i < g->n_inputs; i++)
            if (g->inputs[i] == v)
                return p->bound[i];
        return NULL;
    case AI_VAL_PARAM:
    case AI_VAL_BUFFER:
    case AI_VAL_CONST:
        return val->data;
    default:
        return p->act[v];
    }
}

static bool is_const(const ai_graph *g, const ai_plan *p, int v)
{
    return p->folded[v] || g->values[v].kind == AI_VAL_CONST;
}

/* ---------------------------------------------------------------- half precision */

/* float16 and bfloat16 are stored, not computed: as in ONNX Runtime's and
 * torch's CPU kernels, a node computes in float32 and rounds each output
 * once. Values (activations, their gradients, parameters) keep their half
 * type between nodes; only a node's own inputs and outputs are converted,
 * into float32 copies in the workspace after the operator's own
 * (scratch_at). So every float32 kernel serves the half types, with no
 * kernel of its own:
 *   HALF_WIDEN     a node with a half input: its shape() sees float32
 *                  inputs (and float32 copies of half constants, wide[]),
 *                  each float32 output it gives becomes the half type;
 *                  forward converts the half inputs, runs the float32
 *                  kernel, rounds the outputs
 *   HALF_BACKWARD  an AI_OP_HALF operator (forward moves or converts the
 *                  bytes as they are), or a node with half outputs only
 *                  (a Cast to float16)
 *   HALF_NONE      no half value, or an AI_OP_HALF_GRAD operator (Loop,
 *                  If: their subgraphs convert node by node)
 * Backward of the first two converts the same way: the inputs, outputs and
 * output gradients to float32, the input gradients computed in float32
 * copies, each rounded to the half type and then written to (or added to)
 * the value's half gradient, as torch's autograd adds half gradients. */
enum { HALF_NONE, HALF_WIDEN, HALF_BACKWARD };

typedef struct {
    int op; /* 0: half -> f32, 1: f32 -> half, 2: half += f32 rounded to half */
    ai_dtype half;
    const void *src;
    void *dst;
} convert_job;

static void convert_range(void *ctx, int64_t lo, int64_t hi)
{
    const convert_job *j = ctx;
    if (j->op == 0) {
        ai_half_to_f32(j->half, (const uint16_t *)j->src + lo, (float *)j->dst + lo, hi - lo);
    } else if (j->op == 1) {
        ai_f32_to_half(j->half, (const float *)j->src + lo, (uint16_t *)j->dst + lo, hi - lo);
    } else {
        /* the node's gradient rounded (its output), then added in the half
         * type, as torch's autograd accumulates two half gradients */
        float acc[256], add[256];
        uint16_t h[256];
        for (int64_t i = lo; i < hi; i += 256) {
            const int64_t m = hi - i < 256 ? hi - i : 256;
            uint16_t *d = (uint16_t *)j->dst + i;
            ai_f32_to_half(j->half, (const float *)j->src + i, h, m);
            ai_half_to_f32(j->half, h, add, m);
            ai_half_to_f32(j->half, d, acc, m);
            for (int64_t k = 0; k < m; k++)
                acc[k] += add[k];
            ai_f32_to_half(j->half, acc, d, m);
        }
    }
}

/* dst (float32) = src (half), or back (op 1), or dst (half) += src rounded
 * to half (op 2); both contiguous, of one shape. */
static void convert(int op, ai_tensor *dst, const ai_tensor *src)
{
    convert_job j = {op, op == 0 ? src->dtype : dst->dtype, src->data, dst->data};
    ai_parallel_for(ai_tensor_numel(dst), AI_GRAIN_ELEMS, convert_range, &j);
}

/* A float32 tensor of `like`'s shape in the scratch at *at (moved past it). */
static ai_tensor *scratch_view(ai_tensor *t, const ai_tensor *like, char **at)
{
    ai_meta m;
    meta_of(&m, like);
    m.dtype = AI_F32;
    tensor_of_meta(t, &m, meta_bytes(&m) ? *at : NULL);
    *at += ALIGN_UP(meta_bytes(&m));
    return t;
}

static int node_index(const ai_ctx *c) { return (int)(c->node - c->g->nodes); }

/* The float32 version of input k of a converted node: the constant's
 * float32 copy, else `view` filled from the half input (when `fill`). */
static ai_tensor *wide_input(ai_ctx *c, int k, ai_tensor *view, char **at, bool fill)
{
    const int v = c->node->in[k];
    if (c->plan->wide[v])
        return c->plan->wide[v];
    scratch_view(view, c->in[k], at);
    if (fill)
        convert(0, view, c->in[k]);
    return view;
}

static ai_status node_forward(ai_ctx *c)
{
    ai_plan *p = c->plan;
    const ai_node *n = c->node;
    if (p->half_mode[node_index(c)] != HALF_WIDEN)
        return n->op->forward(c);
    char *at = (char *)c->workspace + p->scratch_at[node_index(c)];
    ai_tensor xs[AI_MAX_IO], ys[AI_MAX_IO], *half_out[AI_MAX_IO] = {NULL};
    for (int k = 0; k < n->n_in; k++)
        if (c->in[k] && ai_dtype_is_half(c->in[k]->dtype))
            c->in[k] = wide_input(c, k, &xs[k], &at, true);
    for (int k = 0; k < n->n_out; k++)
        if (ai_dtype_is_half(c->out[k]->dtype)) {
            half_out[k] = c->out[k];
            c->out[k] = scratch_view(&ys[k], half_out[k], &at);
        }
    ai_status st = n->op->forward(c);
    for (int k = 0; k < n->n_out && !st; k++)
        if (half_out[k])
            convert(1, half_out[k], c->out[k]);
    return st;
}

static ai_status node_backward(ai_ctx *c)
{
    ai_plan *p = c->plan;
    const ai_node *n = c->node;
    if (p->half_mode[node_index(c)] == HALF_NONE)
        return n->op->backward(c);
    const unsigned fl = n->op->flags;
    const int n_assign = AI_OP_GRAD_ASSIGN_OF(fl);
    char *at = (char *)c->workspace + p->scratch_at[node_index(c)];
    ai_tensor xs[AI_MAX_IO], ys[AI_MAX_IO], dys[AI_MAX_IO], dxs[AI_MAX_IO];
    ai_tensor *half_din[AI_MAX_IO] = {NULL};
    bool assign[AI_MAX_IO];
    for (int k = 0; k < n->n_in; k++)
        if (c->in[k] && ai_dtype_is_half(c->in[k]->dtype))
            c->in[k] = wide_input(c, k, &xs[k], &at, !(fl & AI_OP_BWD_NO_X));
    for (int k = 0; k < n->n_out; k++) {
        if (ai_dtype_is_half(c->out[k]->dtype)) {
            ai_tensor *y = c->out[k];
            c->out[k] = scratch_view(&ys[k], y, &at);
            if (!(fl & AI_OP_BWD_NO_Y))
                convert(0, c->out[k], y);
        }
        if (c->dout[k] && ai_dtype_is_half(c->dout[k]->dtype)) {
            ai_tensor *dy = c->dout[k];
            convert(0, scratch_view(&dys[k], dy, &at), dy);
            c->dout[k] = &dys[k];
        }
    }
    /* each input gradient its own copy, written (assign) or zeroed first */
    for (int k = 0; k < n->n_in; k++) {
        if (!c->din[k] || !ai_dtype_is_half(c->din[k]->dtype))
            continue;
        half_din[k] = c->din[k];
        assign[k] = c->din_assign[k];
        c->din[k] = scratch_view(&dxs[k], half_din[k], &at);
        c->din_assign[k] = k < n_assign;
        if (!c->din_assign[k] && c->din[k]->data)
            memset(c->din[k]->data, 0, ai_tensor_nbytes(c->din[k]));
    }
    ai_status st = n->op->backward(c);
    for (int k = 0; k < n->n_in && !st; k++)
        if (half_din[k])
            convert(assign[k] ? 1 : 2, half_din[k], c->din[k]);
    return st;
}

/* The float32 copy of half constant v, or of a value known when planning
 * (kept by the plan). */
static ai_status make_wide(ai_plan *p, int v, const ai_tensor *t)
{
    if (p->wide[v])
        return AI_OK;
    ai_status st = ai_tensor_new_uninit(&p->wide[v], AI_F32, t->ndim, t->shape);
    return st ? st : ai_tensor_copy(p->wide[v], t);
}

/* Shape inference of node n (index ni) with its half inputs as float32: c's
 * inputs as planned (constants or metas in shape_t), om its outputs with
 * each float32 output of the operator in `half`. */
static ai_status wide_shape(ai_graph *g, ai_plan *p, const ai_ctx *c, int ni, ai_dtype half,
                            ai_tensor *shape_t, ai_meta *om, size_t *ws, size_t *state)
{
    ai_ctx w = *c;
    ai_status st = AI_OK;
    for (int k = 0; k < c->n_in && !st; k++) {
        const int v = c->node->in[k];
        if (v < 0 || !ai_dtype_is_half(p->meta[v].dtype))
            continue;
        if (is_const(g, p, v) || c->in[k]->data) { /* (a value known when planning:
                                                       its float32 copy too) */
            st = make_wide(p, v, c->in[k]);
            w.in[k] = p->wide[v];
        } else {
            shape_t[v].dtype = AI_F32;
            w.in[k] = &shape_t[v];
        }
    }
    const unsigned char mode = p->half_mode[ni];
    p->half_mode[ni] = HALF_WIDEN; /* (ai_ctx_const gives the float32 copies) */
    if (!st)
        st = c->node->op->shape(&w, om, ws, state);
    p->half_mode[ni] = mode;
    for (int k = 0; k < c->n_in; k++) /* shape_t holds metas as planned */
        if (c->node->in[k] >= 0 && !is_const(g, p, c->node->in[k]))
            shape_t[c->node->in[k]].dtype = p->meta[c->node->in[k]].dtype;
    for (int k = 0; k < c->n_out && !st; k++)
        if (om[k].dtype == AI_F32)
            om[k].dtype = half;
    return st;
}

/* Shape inference of a node in plan_build, and its half mode. With a half
 * input and no AI_OP_HALF, through wide_shape; an AI_OP_HALF node's
 * float32 backward needs the workspace and state that the float32 shape()
 * asks (the larger of both are kept). */
static ai_status node_shape(ai_graph *g, ai_plan *p, ai_ctx *c, int ni, ai_tensor *shape_t,
                            ai_meta *om, size_t *ws, size_t *state)
{
    ai_dtype half = AI_DTYPE_COUNT;
    for (int k = c->n_in - 1; k >= 0; k--)
        if (c->node->in[k] >= 0 && ai_dtype_is_half(p->meta[c->node->in[k]].dtype))
            half = p->meta[c->node->in[k]].dtype;
    const unsigned fl = c->node->op->flags;
    const bool native = fl & AI_OP_HALF;
    ai_status st;
    if (half != AI_DTYPE_COUNT && !native) {
        p->half_mode[ni] = HALF_WIDEN;
        st = wide_shape(g, p, c, ni, half, shape_t, om, ws, state);
    } else {
        p->half_mode[ni] = HALF_NONE;
        st = c->node->op->shape(c, om, ws, state);
        for (int k = 0; k < c->n_out && !st && !(fl & AI_OP_HALF_GRAD); k++)
            if (ai_dtype_is_half(om[k].dtype) || half != AI_DTYPE_COUNT)
                p->half_mode[ni] = HALF_BACKWARD;
        if (!st && p->half_mode[ni] && half != AI_DTYPE_COUNT && g->need_backward) {
            ai_meta om32[AI_MAX_IO];
            size_t ws32 = 0, state32 = 0;
            memset(om32, 0, sizeof om32);
            st = wide_shape(g, p, c, ni, half, shape_t, om32, &ws32, &state32);
            *ws = ws32 > *ws ? ws32 : *ws;
            *state = state32 > *state ? state32 : *state;
        }
    }
    if (st || p->half_mode[ni] == HALF_NONE)
        return st;
    /* the float32 copies: inputs and outputs, and with backward their
     * gradients; scratch_at is where they start */
    size_t scratch = 0;
    for (int k = 0; k < c->n_in; k++) {
        const int v = c->node->in[k];
        if (v >= 0 && ai_dtype_is_half(p->meta[v].dtype))
            scratch += ALIGN_UP(meta_bytes(&p->meta[v]) * 2);
    }
    for (int k = 0; k < c->n_out; k++)
        if (ai_dtype_is_half(om[k].dtype))
            scratch += ALIGN_UP(meta_bytes(&om[k]) * 2);
    if (g->need_backward)
        scratch *= 2;
    else if (p->half_mode[ni] == HALF_BACKWARD)
        scratch = 0;
    p->scratch_at[ni] = ALIGN_UP(*ws);
    if (scratch)
        *ws = p->scratch_at[ni] + scratch;
    return AI_OK;
}

const ai_tensor *ai_ctx_const(const ai_ctx *c, int i)
{
    if (i >= c->n_in || c->node->in[i] < 0)
        return NULL;
    int v = c->node->in[i];
    const ai_plan *p = c->plan;
    if (!p->folded[v] && c->g->values[v].kind != AI_VAL_CONST)
        return NULL;
    if (p->wide && p->wide[v] && p->half_mode[node_index(c)] == HALF_WIDEN)
        return p->wide[v]; /* the float32 copy a converted node reads */
    return p->folded[v] ? p->folded[v] : c->g->values[v].data;
}

/* ---------------------------------------------------------------- memory plan */

typedef struct {
    size_t size, offset;
    int start, end; /* inclusive */
    int value;
    bool grad;
} item;

static int by_size_desc(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    return x->start - y->start;
}

static int by_offset(const void *a, const void *b)
{
    const item *const *x = a, *const *y = b;
    return (*x)->offset < (*y)->offset ? -1 : (*x)->offset > (*y)->offset;
}

/* Value v's name and its producer, for the messages of the memory limit. */
static const ai_node *producer_of(const ai_graph *g, int v, char *what, size_t size,
                                  const char *fmt)
{
    snprintf(what, size, fmt, g->values[v].name);
    return &g->nodes[g->values[v].producer];
}

/* Greedy by decreasing size: each item goes to the lowest offset that does
 * not collide with an already placed item alive at the same time. The arena
 * must stay within `limit` (refused naming the node whose value passes it). */
static ai_status place(const ai_graph *g, item *items, int n, size_t limit, size_t *total)
{
    qsort(items, (size_t)n, sizeof *items, by_size_desc);
    item **live = malloc(sizeof(item *) * (size_t)(n + 1));
    if (!live)
        return ai_error(AI_ERR_NOMEM, "out of memory planning buffers");
    *total = 0;
    for (int i = 0; i < n; i++) {
        int m = 0;
        for (int j = 0; j < i; j++)
            if (items[j].start <= items[i].end && items[i].start <= items[j].end)
                live[m++] = &items[j];
        qsort(live, (size_t)m, sizeof *live, by_offset);
        size_t off = 0;
        for (int j = 0; j < m; j++) {
            if (live[j]->offset >= off + items[i].size)
                break;
            if (live[j]->offset + live[j]->size > off)
                off = live[j]->offset + live[j]->size;
        }
        items[i].offset = off;
        if (off + items[i].size > limit) { /* off <= limit: no overflow */
            char what[320];
            const ai_node *nd = producer_of(g, items[i].value, what, sizeof what,
                                            items[i].grad ? "the gradient of its output '%s'"
                                                          : "its output '%s'");
            free(live);
            return budget_add(&off, items[i].size, limit, nd, what);
        }
        if (off + items[i].size > *total)
            *total = off + items[i].size;
    }
    free(live);
    return AI_OK;
}

/* ---------------------------------------------------------------- planning */

/* Integer graph inputs this small may be read at plan time, like constants:
 * they can be shapes, axes or pads (ONNX lets them be inputs). Their values
 * are then part of the plan's key. */
#define AI_SHAPE_INPUT_MAX 64

static bool shape_like(const ai_tensor *t)
{
    return (t->dtype == AI_I64 || t->dtype == AI_I32) && ai_tensor_numel(t) <= AI_SHAPE_INPUT_MAX;
}

/* Whether value v feeds, through any nodes, an input of a node that plans a
 * subgraph with its inputs' values (AI_OP_VALUES_AT_PLAN: Loop, If). */
static bool reaches_subgraph(const ai_graph *g, int v)
{
    bool any = false;
    for (int i = 0; i < g->n_nodes && !any; i++)
        any = g->nodes[i].op->flags & AI_OP_VALUES_AT_PLAN;
    bool *mark = any ? calloc((size_t)g->n_values, sizeof(bool)) : NULL;
    if (!mark) /* (out of memory: the value is read at run time) */
        return false;
    mark[v] = true;
    bool found = false;
    for (int oi = 0; oi < g->n_nodes && !found; oi++) {
        const ai_node *n = &g->nodes[g->order[oi]];
        bool reads = false;
        for (int k = 0; k < n->n_in; k++)
            reads |= n->in[k] >= 0 && mark[n->in[k]];
        found = reads && (n->op->flags & AI_OP_VALUES_AT_PLAN);
        for (int k = 0; reads && k < n->n_out; k++)
            mark[n->out[k]] = true;
    }
    free(mark);
    return found;
}

/* A graph input read when the graph is planned: a scalar that an
 * AI_OP_SHAPE_FROM_VALUES node reads, a small tensor that an
 * AI_OP_SHAPE_FROM_INPUTS node reads after its first input, any integer or bool input of a
 * subgraph or that reaches one (its iteration numbers, bag offsets: they set
 * the subgraph's shapes), and, with `ints`, any small integer tensor
 * (shapes, axes, pads). Not an input of ai_graph_infer whose value is
 * unknown (data NULL). */
static bool plan_time_input(const ai_graph *g, int v, const ai_tensor *t, bool ints)
{
    if (!t->data && ai_tensor_numel(t) > 0)
        return false;
    if (ints && shape_like(t))
        return true;
    if ((t->dtype == AI_I64 || t->dtype == AI_I32 || t->dtype == AI_BOOL) &&
        (g->subgraph || reaches_subgraph(g, v)))
        return true;
    for (int i = 0; i < g->n_nodes; i++) {
        const ai_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == v &&
                (((n->op->flags & AI_OP_SHAPE_FROM_VALUES) && ai_tensor_numel(t) == 1) ||
                 ((n->op->flags & AI_OP_SHAPE_FROM_INPUTS) && k > 0 &&
                  ai_tensor_numel(t) <= AI_SHAPE_INPUT_MAX)))
                return true;
    }
    return false;
}

/* Marks in `to_data` every value that an input of an AI_OP_SHAPE_FROM_DATA
 * node depends on (itself included); false when there is none. */
static bool mark_shape_data(const ai_graph *g, bool *to_data)
{
    bool any = false;
    for (int oi = g->n_nodes - 1; oi >= 0; oi--) {
        const ai_node *n = &g->nodes[g->order[oi]];
        bool feeds = n->op->flags & AI_OP_SHAPE_FROM_DATA;
        for (int k = 0; !feeds && k < n->n_out; k++)
            feeds = to_data[n->out[k]];
        for (int k = 0; feeds && k < n->n_in; k++)
            if (n->in[k] >= 0)
                to_data[n->in[k]] = true;
        any |= feeds;
    }
    return any;
}

/* Runs node c->node's forward at plan time into new tensors dst[out]
 * (p->folded: a constant; p->known: a value of this plan only). */
static ai_status run_fold(ai_graph *g, ai_ctx *c, const ai_meta *om, size_t ws,
                          size_t state_bytes, ai_tensor **dst)
{
    const ai_node *n = c->node;
    ai_status st = AI_OK;
    void *work = NULL, *state = NULL;
    for (int k = 0; k < n->n_out; k++) {
        if ((st = ai_tensor_new(&dst[n->out[k]], om[k].dtype, om[k].ndim, om[k].shape)))
            return st;
        c->out[k] = dst[n->out[k]];
    }
    if ((ws && !(work = calloc(1, ws))) || (state_bytes && !(state = calloc(1, state_bytes)))) {
        free(work);
        return ai_error(AI_ERR_NOMEM, "out of memory folding node '%s'", n->name);
    }
    c->workspace = work;
    c->state = state;
    st = node_forward(c);
    free(work);
    free(state);
    (void)g;
    return st;
}

#define ALLOC(ptr, count)                                                        \
    do {                                                                         \
        if (!((ptr) = calloc((size_t)(count) + 1, sizeof *(ptr)))) {             \
            st = ai_error(AI_ERR_NOMEM, "out of memory planning the graph");    \
            goto fail;                                                           \
        }                                                                        \
    } while (0)

/* Whether node n's backward runs: it has one and an input carries a gradient. */
static bool backward_runs(const ai_plan *p, const ai_node *n)
{
    bool any = false;
    for (int k = 0; k < n->n_in; k++)
        any |= n->in[k] >= 0 && p->needs_grad[n->in[k]];
    return any && n->op->backward;
}

/* Each of node n's outputs, its workspace and its state within `limit`. */
static ai_status node_within_limit(const ai_graph *g, const ai_node *n, const ai_meta *om,
                                   size_t ws, size_t state_bytes, size_t limit)
{
    ai_status st = AI_OK;
    char what[320];
    for (int k = 0; k < n->n_out && !st; k++) {
        size_t total = 0;
        snprintf(what, sizeof what, "its output '%s'", g->values[n->out[k]].name);
        st = budget_add(&total, meta_bytes(&om[k]), limit, n, what);
    }
    size_t total = 0;
    if (!st)
        st = budget_add(&total, ws, limit, n, "its workspace");
    total = 0;
    if (!st)
        st = budget_add(&total, state_bytes, limit, n, "its state");
    return st;
}

/* Plans g for these inputs, reading small integer inputs' values with
 * `ints` (plan_for); with `shapes_only`, stops after shape inference and
 * constant folding (the metas of ai_graph_infer). */
/* Gradients flow through the float values, not the 8- and 4-bit ones. */
static bool carries_grad(ai_dtype dt)
{
    return ai_dtype_is_float(dt) && !ai_dtype_is_storage(dt);
}

/* The dtypes beyond the common ones reach only the operators that take
 * them (AI_OP_ANY_DTYPE, AI_OP_UNSIGNED). */
static ai_status check_dtypes(const ai_ctx *c)
{
    const unsigned flags = c->node->op->flags;
    if (flags & AI_OP_ANY_DTYPE)
        return AI_OK;
    for (int k = 0; k < c->n_in; k++) {
        if (!c->in[k])
            continue;
        const ai_dtype dt = c->in[k]->dtype;
        if (ai_dtype_is_storage(dt))
            return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                                 "input %d is %s, which the engine stores and converts "
                                 "(Cast, data movement) but does not compute on", k,
                                 ai_dtype_name(dt));
        if ((dt == AI_U16 || dt == AI_U32 || dt == AI_U64) && !(flags & AI_OP_UNSIGNED))
            return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                                 "input %d is %s, which this operator does not take", k,
                                 ai_dtype_name(dt));
    }
    return AI_OK;
}

/* p->view_node's bits; GRAD_IS_DY << k: input k's gradient is dy (below) */
enum { VIEW_FORWARD = 1, VIEW_BACKWARD = 2, GRAD_IS_DY = 4 };

/* Whether value v is a computed value with a buffer in the arena (not
 * folded, not a graph output given a fresh tensor). */
static bool in_arena(const ai_graph *g, const ai_plan *p, int v)
{
    return g->values[v].kind == AI_VAL_ACT && !p->folded[v] && p->def_step[v] >= 0 &&
           !p->fresh[v];
}

static bool is_graph_output(const ai_graph *g, int v)
{
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v)
            return true;
    return false;
}

/* Whether values a and b have the same dtype and bytes (not none). */
static bool same_bytes(const ai_plan *p, int a, int b)
{
    return p->meta[a].dtype == p->meta[b].dtype && meta_bytes(&p->meta[a]) &&
           meta_bytes(&p->meta[a]) == meta_bytes(&p->meta[b]);
}

/* Whether two metas are the same dtype and shape. */
static bool same_meta(const ai_meta *a, const ai_meta *b)
{
    return a->dtype == b->dtype && a->ndim == b->ndim &&
           !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

/* How many input slots of the scheduled nodes read value v. */
static int slots_reading(const ai_graph *g, const ai_plan *p, int v)
{
    int n = 0;
    for (int s = 0; s < p->n_sched; s++) {
        const ai_node *nd = &g->nodes[p->sched[s]];
        for (int k = 0; k < nd->n_in; k++)
            n += nd->in[k] == v;
    }
    return n;
}

/* Gradients that are dy: input k of an AI_OP_GRAD_IS_DY(k) node (Add, Sub's
 * first) with the output's shape has the output's gradient as its own; the
 * node at step s copies it for nothing in two cases.
 * - An activation whose last reader the node is: its gradient becomes a
 *   view of the output's, as a view node's input's (plan_views): the node's
 *   backward would be the first to write it, and nothing reads the output's
 *   gradient afterwards (its producer is this node). One slot of the node
 *   at most: its other input's gradient is computed from the shared buffer
 *   while the aliased input's other readers add to that buffer later (in
 *   x + f(x), f's backward adds into x's gradient, which f(x)'s must not
 *   share); and not a value that two slots read (x + x is 2 dy).
 * - A graph input that this slot alone reads, when the output is a graph
 *   output nobody reads (grad_borrow): its gradient is the caller's output
 *   gradient itself (pass_out; backward_run decides per call, when the
 *   caller gives a contiguous one), as torch's autograd hands the same
 *   tensor to both inputs of an addition. Not in a subgraph: Scan's
 *   backward (ops/control.c) rewrites the gradients it passes a body. */
static void plan_grad_is_dy(const ai_graph *g, ai_plan *p, int s)
{
    const int ni = p->sched[s];
    const ai_node *n = &g->nodes[ni];
    const int o = n->out[0];
    if (!p->needs_grad[o] || g->values[o].kind != AI_VAL_ACT)
        return;
    bool viewed = false;
    for (int k = 0; k < n->n_in && k < 2; k++) {
        const int i = n->in[k];
        if (!(n->op->flags & AI_OP_GRAD_IS_DY(k)) || i < 0 || !p->needs_grad[i] ||
            !same_meta(&p->meta[i], &p->meta[o]))
            continue;
        bool twice = false;
        for (int k2 = 0; k2 < n->n_in; k2++)
            twice |= k2 != k && n->in[k2] == i;
        if (twice || is_graph_output(g, i))
            continue;
        if (g->values[i].kind == AI_VAL_ACT && !viewed && p->last_step[i] == s &&
            !is_graph_output(g, o)) {
            p->grad_view_of[i] = p->grad_view_of[o] >= 0 ? p->grad_view_of[o] : o;
            p->view_node[ni] |= GRAD_IS_DY << k;
            viewed = true;
        } else if (g->values[i].kind == AI_VAL_INPUT && p->grad_borrow[o] && !g->subgraph &&
                   slots_reading(g, p, i) == 1) {
            for (int j = 0; j < g->n_outputs; j++)
                if (g->outputs[j] == o)
                    p->pass_out[i] = j;
            p->view_node[ni] |= GRAD_IS_DY << k;
        }
    }
}

/* Views: a node of an AI_OP_VIEW operator (Reshape, Flatten, Squeeze,
 * Unsqueeze, Identity) whose input and output both live in the arena copies
 * nothing: its output is a view of its input's buffer (view_of: the owner
 * of the buffer, through chains of views), whose lifetime then extends to
 * the view's (the memory plan merges them). Nodes write only their own
 * outputs and a buffer is written only by its producer before anyone reads
 * it, so the view holds what the copy would. In backward, the input's
 * gradient is a view of the output's when the node is the input's last
 * reader: its backward, the first to write that gradient, would copy the
 * output's gradient (which dies there) into it, and the other readers'
 * backwards add to it afterwards. Graph outputs keep their copies: the
 * caller receives their tensors and seeds (or lends) their gradients. */
static void plan_views(const ai_graph *g, ai_plan *p)
{
    const int S = p->n_sched;
    for (int s = 0; s < S; s++) {
        const int ni = p->sched[s];
        const ai_node *n = &g->nodes[ni];
        if (!(n->op->flags & AI_OP_VIEW))
            continue;
        const int i = n->in[0], o = n->out[0];
        if (in_arena(g, p, i) && in_arena(g, p, o) && same_bytes(p, i, o)) {
            p->view_of[o] = p->view_of[i] >= 0 ? p->view_of[i] : i;
            p->view_node[ni] |= VIEW_FORWARD;
        }
    }
    for (int s = S - 1; s >= 0 && p->need_backward; s--) { /* owners first: later values */
        const int ni = p->sched[s];
        const ai_node *n = &g->nodes[ni];
        if (!backward_runs(p, n))
            continue;
        if (!(n->op->flags & AI_OP_VIEW)) {
            plan_grad_is_dy(g, p, s);
            continue;
        }
        const int i = n->in[0], o = n->out[0];
        if (p->needs_grad[i] && p->needs_grad[o] && g->values[i].kind == AI_VAL_ACT &&
            g->values[o].kind == AI_VAL_ACT && p->last_step[i] == s &&
            !is_graph_output(g, i) && !is_graph_output(g, o) && same_bytes(p, i, o)) {
            p->grad_view_of[i] = p->grad_view_of[o] >= 0 ? p->grad_view_of[o] : o;
            p->view_node[ni] |= VIEW_BACKWARD;
        }
    }
}

static ai_status plan_build(ai_graph *g, const ai_tensor *const *inputs, bool ints,
                            bool shapes_only,
                            ai_plan **out)
{
    ai_status st = AI_OK;
    ai_plan *p = calloc(1, sizeof *p);
    ai_tensor *shape_t = NULL;
    item *items = NULL;
    int *item_at = NULL;
    bool *to_data = NULL;
    size_t *ws_of = NULL;
    size_t limit = ai_memory_limit();
    if (limit > PTRDIFF_MAX)
        limit = PTRDIFF_MAX; /* no size is larger: sums of two stay in size_t */
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory planning the graph");
    const int V = g->n_values, N = g->n_nodes;
    p->n_values = V;
    p->n_inputs = g->n_inputs;
    p->need_backward = g->need_backward;
    p->input_grads = g->input_grads;
    p->keep_all = g->keep_intermediates;
    p->training = g->training;
    p->poison_dead = p->need_backward && getenv("AIDGE_INTEROP_POISON_DEAD") != NULL;
    ALLOC(p->in_shapes, (size_t)g->n_inputs * (AI_MAX_DIMS + 1));
    ALLOC(p->meta, V);
    ALLOC(p->folded, V);
    ALLOC(p->known, V);
    ALLOC(p->act, V);
    ALLOC(p->gradv, V);
    ALLOC(p->needs_grad, V);
    ALLOC(p->grad_reaches, V);
    ALLOC(p->fresh, V);
    ALLOC(p->grad_borrow, V);
    ALLOC(p->grad_ready, V);
    ALLOC(p->def_step, V);
    ALLOC(p->last_step, V);
    ALLOC(p->kept, V);
    ALLOC(p->view_of, V);
    ALLOC(p->grad_view_of, V);
    ALLOC(p->view_node, N);
    ALLOC(p->pass_out, V);
    ALLOC(p->passed, V);
    ALLOC(p->poison_at, V);
    ALLOC(p->sched, N);
    ALLOC(p->state, N);
    ALLOC(p->state_size, N);
    ALLOC(p->bound, g->n_inputs);
    ALLOC(p->half_mode, N);
    ALLOC(p->scratch_at, N);
    ALLOC(p->wide, V);
    ALLOC(shape_t, V);
    ALLOC(ws_of, N);
    ALLOC(to_data, V);
    const bool data_shapes = mark_shape_data(g, to_data);

    for (int i = 0; i < g->n_inputs; i++) {
        int64_t *key = p->in_shapes + (size_t)i * (AI_MAX_DIMS + 1);
        key[0] = inputs[i]->ndim;
        memcpy(key + 1, inputs[i]->shape, sizeof(int64_t) * (size_t)inputs[i]->ndim);
        meta_of(&p->meta[g->inputs[i]], inputs[i]);
        if (plan_time_input(g, g->inputs[i], inputs[i], ints)) {
            if ((st = ai_tensor_clone(&p->folded[g->inputs[i]], inputs[i])))
                goto fail;
        } else if (to_data[g->inputs[i]] && (inputs[i]->data || !ai_tensor_numel(inputs[i])) &&
                   (st = ai_tensor_clone(&p->known[g->inputs[i]], inputs[i]))) {
            goto fail;
        }
    }
    for (int v = 0; v < V; v++) {
        if (g->values[v].data)
            meta_of(&p->meta[v], g->values[v].data);
        /* parameters and buffers an output shape depends on: their values
         * now (they may change between forwards: plan_matches compares) */
        if ((g->values[v].kind == AI_VAL_PARAM || g->values[v].kind == AI_VAL_BUFFER) &&
            to_data[v] && (st = ai_tensor_clone(&p->known[v], g->values[v].data)))
            goto fail;
        p->def_step[v] = -1;
        p->last_step[v] = -1;
        p->view_of[v] = p->grad_view_of[v] = p->poison_at[v] = p->pass_out[v] = -1;
    }

    /* shape inference in topological order, folding constant nodes */
    for (int oi = 0; oi < N; oi++) {
        const ai_node *n = &g->nodes[g->order[oi]];
        ai_ctx c = {.g = g, .node = n, .n_in = n->n_in, .n_out = n->n_out,
                    .training = g->training, .plan = p};
        bool all_const = true, all_known = true;
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < 0)
                continue;
            if (is_const(g, p, v)) {
                c.in[k] = p->folded[v] ? p->folded[v] : g->values[v].data;
            } else {
                tensor_of_meta(&shape_t[v], &p->meta[v], p->known[v] ? p->known[v]->data : NULL);
                c.in[k] = &shape_t[v];
                all_const = false;
                all_known &= p->known[v] != NULL;
            }
        }
        if ((st = check_dtypes(&c)))
            goto fail;
        ai_meta om[AI_MAX_IO];
        memset(om, 0, sizeof om);
        size_t ws = 0, state_bytes = 0;
        if ((st = node_shape(g, p, &c, g->order[oi], shape_t, om, &ws, &state_bytes)))
            goto fail;
        for (int k = 0; k < n->n_out; k++) {
            int64_t numel;
            if ((unsigned)om[k].dtype >= AI_DTYPE_COUNT ||
                ai_shape_check(om[k].ndim, om[k].shape, ai_dtype_size(om[k].dtype), &numel)) {
                st = ai_node_error(n, AI_ERR_VALUE, "output %d has an invalid shape: %s", k,
                                   ai_last_error());
                goto fail;
            }
            p->meta[n->out[k]] = om[k];
        }
        unsigned fl = n->op->flags;
        bool fold = !(fl & AI_OP_NO_FOLD) && ((fl & AI_OP_FOLD_ON_SHAPE) || all_const);
        if ((fold || !shapes_only) &&
            (st = node_within_limit(g, n, om, ws, state_bytes, limit)))
            goto fail;
        /* a value an AI_OP_SHAPE_FROM_DATA node needs: computed now as well */
        bool feeds = false;
        for (int k = 0; data_shapes && k < n->n_out; k++)
            feeds |= to_data[n->out[k]];
        if (!fold && feeds && all_known && !(fl & AI_OP_NO_FOLD) &&
            (st = run_fold(g, &c, om, ws, state_bytes, p->known)))
            goto fail;
        if (fold) {
            if ((st = run_fold(g, &c, om, ws, state_bytes, p->folded)))
                goto fail;
        } else {
            p->sched[p->n_sched] = g->order[oi];
            ws_of[p->n_sched] = ws;
            p->state_size[g->order[oi]] = state_bytes;
            p->n_sched++;
        }
    }
    if (shapes_only)
        goto done;
    const int S = p->n_sched;

    /* which values carry gradients */
    if (p->need_backward) {
        for (int v = 0; v < V; v++) {
            const ai_value *val = &g->values[v];
            p->needs_grad[v] = (val->kind == AI_VAL_PARAM) ||
                               (val->kind == AI_VAL_INPUT && g->input_grads &&
                                carries_grad(p->meta[v].dtype));
        }
        for (int s = 0; s < S; s++) {
            const ai_node *n = &g->nodes[p->sched[s]];
            if (!backward_runs(p, n))
                continue;
            for (int k = 0; k < n->n_out; k++)
                p->needs_grad[n->out[k]] = carries_grad(p->meta[n->out[k]].dtype);
        }
        for (int o = 0; o < g->n_outputs; o++)
            p->grad_reaches[g->outputs[o]] = p->needs_grad[g->outputs[o]];
        for (int s = S - 1; s >= 0; s--) {
            const ai_node *n = &g->nodes[p->sched[s]];
            bool reaches = false;
            for (int k = 0; k < n->n_out; k++)
                reaches |= p->grad_reaches[n->out[k]];
            for (int k = 0; reaches && backward_runs(p, n) && k < n->n_in; k++)
                if (n->in[k] >= 0)
                    p->grad_reaches[n->in[k]] |= p->needs_grad[n->in[k]];
        }
    }

    /* lifetimes */
    for (int s = 0; s < S; s++) {
        const ai_node *n = &g->nodes[p->sched[s]];
        for (int k = 0; k < n->n_out; k++)
            p->def_step[n->out[k]] = s;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0 && p->last_step[n->in[k]] < s)
                p->last_step[n->in[k]] = s;
    }
    /* A computed output that no node reads, listed once: its gradient is
     * the caller's alone (no consumer adds to it), so backward reads it in
     * place instead of copying it into the arena. */
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        p->grad_borrow[v] = g->values[v].kind == AI_VAL_ACT && p->def_step[v] >= 0 &&
                            p->last_step[v] < 0;
        for (int k = 0; k < i; k++)
            if (g->outputs[k] == v)
                p->grad_borrow[v] = false;
    }
    for (int i = 0; i < g->n_outputs; i++)
        p->last_step[g->outputs[i]] = S; /* read when forward returns */
    /* With need_backward, a value stays to the end of backward when a
     * backward that runs may read it: its producer's (unless the op reads
     * no output, AI_OP_BWD_NO_Y) or a consumer's (unless it reads no input,
     * AI_OP_BWD_NO_X). The others die at their last forward use, as at
     * inference: in Conv -> BatchNorm -> Relu, the BatchNorm's output. */
    for (int v = 0; v < V; v++)
        p->kept[v] = p->keep_all;
    for (int s = 0; s < S && p->need_backward; s++) {
        const ai_node *n = &g->nodes[p->sched[s]];
        if (!backward_runs(p, n))
            continue;
        for (int k = 0; k < n->n_out && !(n->op->flags & AI_OP_BWD_NO_Y); k++)
            p->kept[n->out[k]] = true;
        for (int k = 0; k < n->n_in && !(n->op->flags & AI_OP_BWD_NO_X); k++)
            if (n->in[k] >= 0)
                p->kept[n->in[k]] = true;
    }

    /* Zero-copy outputs and input gradients: a computed graph output gets a
     * fresh tensor at each forward (the caller receives it, the plan keeps a
     * reference until the next forward for backward and intermediate()), and
     * so does a graph input's gradient at each backward. No copy in the
     * steady state, and a result the caller keeps is never overwritten. With
     * keep_intermediates every value, outputs included, stays in the arena. */
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        p->fresh[v] |= !p->keep_all && g->values[v].kind == AI_VAL_ACT && !p->folded[v] &&
                       p->def_step[v] >= 0;
    }
    for (int i = 0; i < g->n_outputs; i++)
        p->outputs_read |= p->fresh[g->outputs[i]] && p->kept[g->outputs[i]];
    for (int i = 0; i < g->n_inputs; i++)
        p->inputs_read |= p->need_backward && p->kept[g->inputs[i]];
    plan_views(g, p);

    ALLOC(items, 2 * V);
    ALLOC(item_at, 2 * V); /* value v's item: v for its data, V + v for its gradient */
    int n_items = 0;
    size_t zeros_bytes = 0;
    int zeros_value = -1;
    for (int v = 0; v < V; v++) {
        if (g->values[v].kind != AI_VAL_ACT || p->folded[v] || p->def_step[v] < 0 ||
            p->fresh[v])
            continue;
        int last = p->last_step[v] < p->def_step[v] ? p->def_step[v] : p->last_step[v];
        item_at[v] = n_items;
        items[n_items++] = (item){.size = ALIGN_UP(meta_bytes(&p->meta[v])),
                                  .start = p->def_step[v],
                                  .end = p->kept[v] ? 2 * S + 1 : last,
                                  .value = v};
        if (p->need_backward && !p->needs_grad[v] && meta_bytes(&p->meta[v]) > zeros_bytes) {
            zeros_bytes = meta_bytes(&p->meta[v]);
            zeros_value = v;
        }
    }
    if (p->need_backward) {
        for (int v = 0; v < V; v++) {
            const ai_value *val = &g->values[v];
            if (!p->needs_grad[v] || val->kind == AI_VAL_PARAM || val->kind == AI_VAL_INPUT)
                continue; /* input gradients are fresh tensors (see above) */
            bool is_out = false;
            for (int i = 0; i < g->n_outputs; i++)
                is_out |= g->outputs[i] == v;
            int last = p->last_step[v] >= S ? -1 : p->last_step[v];
            int start = is_out ? S : (last >= 0 ? 2 * S - 1 - last : S);
            int end = val->kind == AI_VAL_INPUT ? 2 * S + 1 : 2 * S - 1 - p->def_step[v];
            if (end < start)
                end = start;
            item_at[V + v] = n_items;
            items[n_items++] = (item){.size = ALIGN_UP(meta_bytes(&p->meta[v])),
                                      .start = start, .end = end, .value = v, .grad = true};
        }
    }
    /* a view has no buffer of its own: its lifetime extends its owner's */
    for (int k = 0; k < n_items; k++) {
        const int owner = items[k].grad ? p->grad_view_of[items[k].value]
                                        : p->view_of[items[k].value];
        if (owner < 0)
            continue;
        item *o = &items[item_at[(items[k].grad ? V : 0) + owner]];
        o->start = items[k].start < o->start ? items[k].start : o->start;
        o->end = items[k].end > o->end ? items[k].end : o->end;
    }
    int n_owners = 0;
    for (int k = 0; k < n_items; k++) {
        const int v = items[k].value;
        if ((items[k].grad ? p->grad_view_of[v] : p->view_of[v]) >= 0)
            continue;
        if (p->poison_dead && !items[k].grad && items[k].end < S)
            p->poison_at[v] = items[k].end; /* (S and later: kept, or a graph output) */
        items[n_owners++] = items[k];
    }
    n_items = n_owners;
    if ((st = place(g, items, n_items, limit, &p->arena_bytes)))
        goto fail;

    /* the rest of the plan's memory within the limit, before any allocation:
     * the zero buffer, node state, the workspace, the graph outputs of each
     * forward (fresh tensors) */
    size_t planned = p->arena_bytes, total_state = 0;
    char what[320];
    if (zeros_bytes) {
        const ai_node *nd = producer_of(g, zeros_value, what, sizeof what,
                                        "a zero buffer the size of its output '%s'");
        if ((st = budget_add(&planned, zeros_bytes, limit, nd, what)))
            goto fail;
    }
    int ws_node = -1;
    for (int s = 0; s < S; s++) {
        const ai_node *nd = &g->nodes[p->sched[s]];
        if ((st = budget_add(&planned, ALIGN_UP(p->state_size[p->sched[s]]), limit, nd,
                             "its state")))
            goto fail;
        total_state += ALIGN_UP(p->state_size[p->sched[s]]);
        if (ws_of[s] > p->workspace_bytes) {
            p->workspace_bytes = ws_of[s];
            ws_node = p->sched[s];
        }
    }
    if (ws_node >= 0 && (st = budget_add(&planned, ALIGN_UP(p->workspace_bytes), limit,
                                         &g->nodes[ws_node], "its workspace")))
        goto fail;
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        if (!p->fresh[v])
            continue;
        const ai_node *nd = producer_of(g, v, what, sizeof what, "its output '%s'");
        if ((st = budget_add(&planned, meta_bytes(&p->meta[v]), limit, nd, what)))
            goto fail;
    }

    int64_t arena_shape[1] = {(int64_t)p->arena_bytes};
    if ((st = ai_tensor_new(&p->arena, AI_U8, 1, arena_shape)))
        goto fail;
    for (int i = 0; i < n_items; i++) {
        ai_tensor **slot = items[i].grad ? &p->gradv[items[i].value] : &p->act[items[i].value];
        if ((st = arena_view(slot, p->arena, items[i].offset, &p->meta[items[i].value])))
            goto fail;
    }
    for (int v = 0; v < V; v++) { /* the views, at their owners' offsets */
        const char *base = p->arena->data;
        if (p->view_of[v] >= 0 &&
            (st = arena_view(&p->act[v], p->arena,
                             (size_t)((char *)p->act[p->view_of[v]]->data - base), &p->meta[v])))
            goto fail;
        if (p->grad_view_of[v] >= 0 &&
            (st = arena_view(&p->gradv[v], p->arena,
                             (size_t)((char *)p->gradv[p->grad_view_of[v]]->data - base),
                             &p->meta[v])))
            goto fail;
    }
    if (zeros_bytes) {
        int64_t zshape[1] = {(int64_t)zeros_bytes};
        if ((st = ai_tensor_new(&p->zeros, AI_U8, 1, zshape)))
            goto fail;
    }

    /* node state and the shared workspace */
    if (total_state) {
        int64_t sshape[1] = {(int64_t)total_state};
        if ((st = ai_tensor_new(&p->state_mem, AI_U8, 1, sshape)))
            goto fail;
        size_t off = 0;
        for (int s = 0; s < S; s++) {
            int ni = p->sched[s];
            if (p->state_size[ni]) {
                p->state[ni] = (char *)p->state_mem->data + off;
                off += ALIGN_UP(p->state_size[ni]);
            }
        }
    }
    p->state_bytes = total_state;
    if (p->workspace_bytes &&
        !(p->workspace = aligned_alloc(AI_ALIGN, ALIGN_UP(p->workspace_bytes)))) {
        st = ai_error(AI_ERR_NOMEM, "out of memory for a %zu-byte workspace",
                      p->workspace_bytes);
        goto fail;
    }
done:
    free(items);
    free(item_at);
    free(shape_t);
    free(ws_of);
    free(to_data);
    *out = p;
    return AI_OK;
fail:
    free(items);
    free(item_at);
    free(shape_t);
    free(ws_of);
    free(to_data);
    ai_plan_free(p);
    *out = NULL;
    return st;
}

/* Plans for `inputs`, reading small integer inputs at plan time only where
 * shapes need their values (a graph input that is a Reshape's shape): token
 * ids and masks are small integer tensors too, and a plan keyed on their
 * values re-plans at every new sentence (BERT at 2 x 8 tokens: 0.23 ms per
 * call instead of 0.11). Which kind of graph it is shows at its first plan:
 * without the values first; an operator that needs one refuses (it never
 * guesses a shape), and the graph is then planned with them from then on. */
static ai_status plan_for(ai_graph *g, const ai_tensor *const *inputs, ai_plan **out)
{
    if (!g->int_values_at_plan) {
        bool any = false;
        for (int i = 0; i < g->n_inputs; i++)
            any |= shape_like(inputs[i]) && !plan_time_input(g, g->inputs[i], inputs[i], false);
        if (!any)
            return plan_build(g, inputs, true, false, out); /* the same plan either way */
        if (plan_build(g, inputs, false, false, out) == AI_OK) {
            g->int_values_at_plan = 1;
            return AI_OK;
        }
        ai_status st = plan_build(g, inputs, true, false, out);
        if (st == AI_OK)
            g->int_values_at_plan = 2;
        return st;
    }
    return plan_build(g, inputs, g->int_values_at_plan == 2, false, out);
}

/* Whether a (a contiguous copy) and b hold the same values, bit for bit
 * (a NaN is the NaN it was). */
static bool same_values(const ai_tensor *a, const ai_tensor *b)
{
    if (!ai_tensor_nbytes(a))
        return true;
    if (ai_tensor_is_contiguous(b))
        return memcmp(a->data, b->data, ai_tensor_nbytes(a)) == 0;
    for (int64_t k = 0; k < ai_tensor_numel(a); k++)
        if (ai_tensor_get_flat_i64(a, k) != ai_tensor_get_flat_i64(b, k) ||
            memcmp(&(double){ai_tensor_get_flat(a, k)}, &(double){ai_tensor_get_flat(b, k)},
                   sizeof(double)))
            return false;
    return true;
}

static bool plan_matches(const ai_graph *g, const ai_plan *p, const ai_tensor *const *inputs)
{
    if (!p || p->need_backward != g->need_backward || p->input_grads != g->input_grads ||
        p->keep_all != g->keep_intermediates || p->training != g->training)
        return false;
    for (int i = 0; i < g->n_inputs; i++) {
        const int64_t *key = p->in_shapes + (size_t)i * (AI_MAX_DIMS + 1);
        if (key[0] != inputs[i]->ndim ||
            memcmp(key + 1, inputs[i]->shape, sizeof(int64_t) * (size_t)inputs[i]->ndim))
            return false;
        if (p->known[g->inputs[i]] && !same_values(p->known[g->inputs[i]], inputs[i]))
            return false;
        const ai_tensor *known = p->folded[g->inputs[i]];
        for (int64_t k = 0; known && k < ai_tensor_numel(known); k++)
            if (ai_tensor_get_flat_i64(known, k) != ai_tensor_get_flat_i64(inputs[i], k) ||
                memcmp(&(double){ai_tensor_get_flat(known, k)},
                       &(double){ai_tensor_get_flat(inputs[i], k)}, sizeof(double)))
                return false; /* a new value of a plan-time input re-plans */
    }
    for (int v = 0; v < p->n_values; v++) { /* a parameter a shape depends on */
        const ai_value_kind kind = g->values[v].kind;
        if (p->known[v] && (kind == AI_VAL_PARAM || kind == AI_VAL_BUFFER) &&
            !same_values(p->known[v], g->values[v].data))
            return false;
    }
    return true;
}

/* ---------------------------------------------------------------- forward */

static void ctx_bind(ai_ctx *c, ai_graph *g, ai_plan *p, int node_index)
{
    const ai_node *n = &g->nodes[node_index];
    memset(c, 0, sizeof *c);
    c->g = g;
    c->node = n;
    c->plan = p;
    c->n_in = n->n_in;
    c->n_out = n->n_out;
    c->training = g->training;
    c->state = p->state[node_index];
    c->workspace = p->workspace;
    for (int k = 0; k < n->n_in; k++)
        c->in[k] = n->in[k] >= 0 ? runtime(g, p, n->in[k]) : NULL;
    for (int k = 0; k < n->n_out; k++)
        c->out[k] = runtime(g, p, n->out[k]);
}

/* Debugging the AI_OP_BWD_NO_X / NO_Y declarations (AIDGE_INTEROP_POISON_DEAD
 * set when the plan is built): after forward step s, the values that die
 * there although backward runs are filled with NaN (bytes 0x5a for other
 * types), so that a backward that reads one after all gives NaN gradients
 * instead of reading whatever reused the buffer (tests/test_engine.py). */
static void poison_dead(const ai_plan *p, int s)
{
    for (int v = 0; v < p->n_values; v++) { /* (poison_at: buffers, views' lifetimes included) */
        if (p->poison_at[v] != s)
            continue;
        ai_tensor *t = p->act[v];
        const int64_t numel = ai_tensor_numel(t);
        if (t->dtype == AI_F32)
            for (int64_t e = 0; e < numel; e++)
                ((float *)t->data)[e] = NAN;
        else if (t->dtype == AI_F64)
            for (int64_t e = 0; e < numel; e++)
                ((double *)t->data)[e] = NAN;
        else
            memset(t->data, 0x5a, ai_tensor_nbytes(t));
    }
}

static void dims_text(char *buf, size_t size, int ndim, const int64_t *dims)
{
    size_t at = (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)(dims[d] < 0 ? snprintf(buf + at, size - at, "%s?", d ? ", " : "")
                                   : snprintf(buf + at, size - at, "%s%lld", d ? ", " : "",
                                              (long long)dims[d]));
    if (at < size)
        snprintf(buf + at, size - at, "%s)", ndim == 1 ? "," : "");
}

/* The inputs against the dims the model declares (checked when planning). */
static ai_status check_input_dims(const ai_graph *g, const ai_tensor *const *inputs)
{
    for (int i = 0; i < g->n_inputs; i++) {
        const int64_t *decl = g->input_dims[i];
        const ai_tensor *x = inputs[i];
        int bad = decl[0] < 0 ? -1 : decl[0] != x->ndim ? 0 : -1;
        for (int d = 0; bad < 0 && decl[0] == x->ndim && d < x->ndim; d++)
            if (decl[1 + d] >= 0 && decl[1 + d] != x->shape[d])
                bad = d;
        if (bad < 0)
            continue;
        char want[AI_MAX_DIMS * 24], got[AI_MAX_DIMS * 24];
        dims_text(want, sizeof want, (int)decl[0], decl + 1);
        dims_text(got, sizeof got, x->ndim, x->shape);
        if (decl[0] != x->ndim)
            return ai_error(AI_ERR_VALUE, "graph input '%s' has rank %d, the model declares "
                            "rank %lld %s", g->values[g->inputs[i]].name, x->ndim,
                            (long long)decl[0], want);
        return ai_error(AI_ERR_VALUE, "graph input '%s' has shape %s, the model declares %s: "
                        "dim %d is %lld, %lld expected (? is free)",
                        g->values[g->inputs[i]].name, got, want, bad,
                        (long long)x->shape[bad], (long long)decl[1 + bad]);
    }
    return AI_OK;
}

/* The inputs of a forward (or an inference) against the graph's inputs. */
static ai_status check_inputs(const ai_graph *g, int n_in, const ai_tensor *const *inputs,
                              int n_out)
{
    if (!g->finalized)
        return ai_error(AI_ERR_VALUE, "the graph is not finalized");
    if (n_in != g->n_inputs)
        return ai_error(AI_ERR_VALUE, "the graph takes %d input%s, got %d", g->n_inputs,
                        g->n_inputs == 1 ? "" : "s", n_in);
    if (n_out != g->n_outputs)
        return ai_error(AI_ERR_VALUE, "the graph gives %d outputs, asked for %d",
                        g->n_outputs, n_out);
    for (int i = 0; i < n_in; i++) {
        const ai_value *v = &g->values[g->inputs[i]];
        if (!inputs[i])
            return ai_error(AI_ERR_VALUE, "graph input '%s' is missing", v->name);
        if (inputs[i]->dtype != v->dtype && !g->subgraph) /* (a subgraph takes its node's) */
            return ai_error(AI_ERR_TYPE, "graph input '%s' expects %s, got %s", v->name,
                            ai_dtype_name(v->dtype), ai_dtype_name(inputs[i]->dtype));
    }
    return AI_OK;
}

ai_status ai_graph_infer(ai_graph *g, int n_in, const ai_tensor *const *inputs,
                         ai_meta *out, ai_tensor **values)
{
    ai_plan *p;
    ai_status st;
    for (int i = 0; values && i < g->n_outputs; i++)
        values[i] = NULL;
    if ((st = check_inputs(g, n_in, inputs, g->n_outputs)) ||
        (st = check_input_dims(g, inputs)) || (st = plan_build(g, inputs, true, true, &p)))
        return st;
    for (int i = 0; i < g->n_outputs && !st; i++) {
        const int v = g->outputs[i];
        out[i] = p->meta[v];
        const ai_tensor *known = is_const(g, p, v) ? runtime(g, p, v) : NULL;
        if (values && known)
            st = ai_tensor_clone(&values[i], known);
    }
    ai_plan_free(p);
    for (int i = 0; st && values && i < g->n_outputs; i++) {
        ai_tensor_free(values[i]);
        values[i] = NULL;
    }
    return st;
}

ai_status ai_graph_forward(ai_graph *g, int n_in, const ai_tensor *const *inputs,
                           int n_out, ai_tensor **outputs)
{
    ai_status st;
    if ((st = check_inputs(g, n_in, inputs, n_out)))
        return st;
    for (int i = 0; i < n_out; i++)
        outputs[i] = NULL;
    if (!plan_matches(g, g->plan, inputs)) {
        ai_plan *p;
        if ((st = check_input_dims(g, inputs)) || (st = plan_for(g, inputs, &p)))
            return st;
        ai_plan_free(g->plan);
        g->plan = p;
    }
    ai_plan *p = g->plan;
    p->forward_done = false;
    for (int i = 0; i < n_in; i++) {
        if (p->bound[i] && ai_tensor_is_contiguous(inputs[i])) {
            ai_tensor_reshare(p->bound[i], inputs[i]); /* no header to allocate */
            continue;
        }
        ai_tensor_free(p->bound[i]);
        p->bound[i] = NULL;
        st = ai_tensor_is_contiguous(inputs[i]) ? ai_tensor_share(&p->bound[i], inputs[i])
                                                 : ai_tensor_clone(&p->bound[i], inputs[i]);
        if (st)
            return st;
    }
    for (int i = 0; i < n_out; i++) {
        int v = g->outputs[i];
        if (!p->fresh[v])
            continue; /* (a value listed twice is allocated twice, harmlessly) */
        /* the caller let go of the previous result (no view of it is left):
         * it is this one's memory, as a new allocation would be (the shape
         * is the plan's). A small model's call then allocates no memory
         * for its results: 3 allocations and frees fewer per output. */
        if (p->act[v] && ai_tensor_unshared(p->act[v]))
            continue;
        ai_tensor_free(p->act[v]); /* the caller may still hold it: only our reference */
        p->act[v] = NULL;
        /* not zeroed: every op writes all of its outputs (as in the arena).
         * Zeroing cost a pass over each output per call: 2.4 MB, 0.1 ms. */
        if ((st = ai_tensor_new_uninit(&p->act[v], p->meta[v].dtype, p->meta[v].ndim,
                                       p->meta[v].shape)))
            return st;
    }
    for (int s = 0; s < p->n_sched; s++) {
        if (!(p->view_node[p->sched[s]] & VIEW_FORWARD)) { /* (a view: nothing to run) */
            ai_ctx c;
            ctx_bind(&c, g, p, p->sched[s]);
            double t0 = g->profile ? ai_seconds() : 0;
            if ((st = node_forward(&c)))
                return st;
            if (g->profile) {
                g->nodes[p->sched[s]].prof_fwd_s += ai_seconds() - t0;
                g->nodes[p->sched[s]].prof_fwd_n++;
            }
        }
        if (p->poison_dead)
            poison_dead(p, s);
    }
    for (int i = 0; i < n_out; i++) {
        int v = g->outputs[i];
        st = p->fresh[v] ? ai_tensor_share(&outputs[i], p->act[v])
                         : ai_tensor_clone(&outputs[i], runtime(g, p, v));
        if (st) {
            for (int k = 0; k < i; k++) {
                ai_tensor_free(outputs[k]);
                outputs[k] = NULL;
            }
            return st;
        }
    }
    p->forward_done = true;
    return AI_OK;
}

/* ---------------------------------------------------------------- backward */

/* The gradient of value v as an accumulator. Parameter gradients
 * accumulate across backward calls; any other gradient is garbage until its
 * first write in this backward pass: with `assign` (the writer overwrites
 * it all) it is handed over as it is, else zeroed first. Either way it is
 * ready (valid) afterwards, so nothing ever reads garbage. *assigned tells
 * which happened (may be NULL when `assign` is false). */
static ai_tensor *grad_of(ai_graph *g, ai_plan *p, int v, bool assign, bool *assigned)
{
    ai_tensor *t = g->values[v].kind == AI_VAL_PARAM ? g->values[v].grad : p->gradv[v];
    bool fresh = t && g->values[v].kind != AI_VAL_PARAM && !p->grad_ready[v];
    if (fresh && !assign && t->data)
        memset(t->data, 0, ai_tensor_nbytes(t));
    if (fresh)
        p->grad_ready[v] = true;
    if (assigned)
        *assigned = fresh && assign;
    return t;
}

/* Output gradients read in place (grad_borrow): the value's arena view is
 * swapped for a view of the caller's tensor for one backward, then put back. */
#define BORROW_MAX 8
typedef struct {
    int n, v[BORROW_MAX];
    ai_tensor *planned[BORROW_MAX];
    ai_tensor view[BORROW_MAX];
} grad_borrows;

static ai_status backward_run(ai_graph *g, int n_out, const ai_tensor *const *grad_outputs,
                              int n_in, ai_tensor **input_grads, grad_borrows *b)
{
    ai_status st;
    ai_plan *p = g->plan;
    if (!p || !p->forward_done)
        return ai_error(AI_ERR_VALUE, "backward needs a forward first");
    if (!p->need_backward)
        return ai_error(AI_ERR_VALUE, "the last forward ran without need_backward; "
                        "run forward again with gradients enabled");
    if (n_out != g->n_outputs)
        return ai_error(AI_ERR_VALUE, "backward takes %d output gradients, got %d",
                        g->n_outputs, n_out);
    if (n_in != g->n_inputs)
        return ai_error(AI_ERR_VALUE, "backward gives %d input gradients, asked for %d",
                        g->n_inputs, n_in);
    for (int i = 0; i < n_in; i++)
        input_grads[i] = NULL;
    memset(p->grad_ready, 0, sizeof(bool) * (size_t)p->n_values);
    for (int i = 0; i < n_in; i++) {
        int v = g->inputs[i];
        if (!p->needs_grad[v])
            continue;
        /* the caller's output gradient, when it is a contiguous one (its
         * shape is checked below): the input's gradient is that tensor */
        const int j = p->pass_out[v];
        p->passed[v] = j >= 0 && grad_outputs[j] && grad_outputs[j]->storage &&
                       ai_tensor_is_contiguous(grad_outputs[j]);
        if (p->passed[v])
            continue;
        /* fresh (the caller may keep the last one), not ready: its first
         * writer assigns or zeroes it; zeroed at the end if nobody wrote it.
         * The last one again when nothing else references it (as forward's
         * outputs) */
        if (p->gradv[v] && ai_tensor_unshared(p->gradv[v]))
            continue;
        ai_tensor_free(p->gradv[v]);
        p->gradv[v] = NULL;
        if ((st = ai_tensor_new_uninit(&p->gradv[v], p->meta[v].dtype, p->meta[v].ndim,
                                       p->meta[v].shape)))
            return st;
    }
    for (int i = 0; i < n_out; i++) {
        int v = g->outputs[i];
        const ai_meta *m = &p->meta[v];
        if (!grad_outputs[i])
            continue;
        const ai_tensor *go = grad_outputs[i];
        bool same = go->ndim == m->ndim && go->dtype == m->dtype;
        for (int d = 0; same && d < m->ndim; d++)
            same = go->shape[d] == m->shape[d];
        if (!same)
            return ai_error(AI_ERR_VALUE,
                            "gradient of output '%s' must be %s of the output's shape "
                            "(rank %d), got %s of rank %d", g->values[v].name,
                            ai_dtype_name(m->dtype), m->ndim, ai_dtype_name(go->dtype),
                            go->ndim);
        if (!p->needs_grad[v]) /* checked all the same: a wrong gradient is an error */
            continue;
        if (p->grad_borrow[v] && p->gradv[v] && b->n < BORROW_MAX && ai_tensor_is_contiguous(go)) {
            ai_tensor *view = &b->view[b->n];
            *view = *p->gradv[v]; /* the planned view's shape, the caller's data */
            view->data = go->data;
            view->storage = NULL; /* owns nothing; only read (no kernel writes dout) */
            b->v[b->n] = v;
            b->planned[b->n++] = p->gradv[v];
            p->gradv[v] = view;
            p->grad_ready[v] = true;
            continue;
        }
        ai_tensor *tmp = NULL;
        bool assign;
        ai_tensor *dst = grad_of(g, p, v, true, &assign);
        if (!ai_tensor_is_contiguous(go)) {
            if ((st = ai_tensor_clone(&tmp, go)))
                return st;
            go = tmp;
        }
        ai_accumulate(dst, go, assign);
        ai_tensor_free(tmp);
    }
    for (int s = p->n_sched - 1; s >= 0; s--) {
        int ni = p->sched[s];
        const ai_node *n = &g->nodes[ni];
        if (!backward_runs(p, n))
            continue;
        if (p->view_node[ni] & VIEW_BACKWARD) {
            /* the input's gradient is the output's buffer: what the copy
             * would assign (zero if nobody wrote it) */
            grad_of(g, p, n->out[0], false, NULL);
            p->grad_ready[n->in[0]] = true;
            continue;
        }
        ai_ctx c;
        ctx_bind(&c, g, p, ni);
        ai_tensor zero_views[AI_MAX_IO];
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            if (p->needs_grad[v]) {
                c.dout[k] = grad_of(g, p, v, false, NULL); /* zero if nobody wrote it */
            } else if (carries_grad(p->meta[v].dtype) && p->zeros) {
                tensor_of_meta(&zero_views[k], &p->meta[v], p->zeros->data);
                c.dout[k] = &zero_views[k];
            }
        }
        /* slots in order: a value in two slots is assigned at most by the first */
        const int n_assign = AI_OP_GRAD_ASSIGN_OF(n->op->flags);
        for (int k = 0; k < n->n_in; k++) {
            const int v = n->in[k];
            if (v < 0 || !p->needs_grad[v])
                continue;
            if ((p->view_node[ni] & (GRAD_IS_DY << k)) &&
                (g->values[v].kind == AI_VAL_ACT || p->passed[v])) {
                p->grad_ready[v] = true; /* dout's buffer (written above), or the caller's */
                continue;
            }
            c.din[k] = grad_of(g, p, v, k < n_assign, &c.din_assign[k]);
        }
        double t0 = g->profile ? ai_seconds() : 0;
        if ((st = node_backward(&c)))
            return st;
        if (g->profile) {
            g->nodes[ni].prof_bwd_s += ai_seconds() - t0;
            g->nodes[ni].prof_bwd_n++;
        }
    }
    for (int i = 0; i < n_in; i++) {
        int v = g->inputs[i];
        if (!p->grad_reaches[v])
            continue;
        const ai_tensor *gv = p->passed[v] ? grad_outputs[p->pass_out[v]] : p->gradv[v];
        if (!p->passed[v])
            grad_of(g, p, v, false, NULL); /* zero when no node wrote it */
        if ((st = ai_tensor_share(&input_grads[i], gv))) {
            for (int k = 0; k < i; k++) {
                ai_tensor_free(input_grads[k]);
                input_grads[k] = NULL;
            }
            return st;
        }
    }
    return AI_OK;
}

ai_status ai_graph_backward(ai_graph *g, int n_out, const ai_tensor *const *grad_outputs,
                            int n_in, ai_tensor **input_grads)
{
    grad_borrows b;
    b.n = 0;
    ai_status st = backward_run(g, n_out, grad_outputs, n_in, input_grads, &b);
    for (int i = b.n - 1; i >= 0; i--) /* last in, first out */
        g->plan->gradv[b.v[i]] = b.planned[i];
    return st;
}

/* ---------------------------------------------------------------- inspection */

ai_status ai_graph_intermediate(ai_graph *g, const char *name, ai_tensor **out)
{
    *out = NULL;
    int v = ai_graph_find_value(g, name);
    if (v < 0)
        return ai_error(AI_ERR_VALUE, "no value named '%s' in the graph", name);
    ai_plan *p = g->plan;
    if (!p || !p->forward_done)
        return ai_error(AI_ERR_VALUE, "value '%s': run forward first", name);
    if (g->values[v].kind == AI_VAL_ACT && !p->folded[v] && !p->kept[v] &&
        p->last_step[v] < p->n_sched)
        return ai_error(AI_ERR_VALUE,
                        "value '%s' was overwritten: its buffer is reused once it is dead; "
                        "set keep_intermediates before forward to keep every value", name);
    ai_tensor *t = runtime(g, p, v);
    if (!t)
        return ai_error(AI_ERR_VALUE, "value '%s' has no data", name);
    return ai_tensor_clone(out, t);
}

bool ai_graph_backward_reads_outputs(const ai_graph *g)
{
    return g->plan && g->plan->outputs_read;
}

bool ai_graph_backward_reads_inputs(const ai_graph *g)
{
    return g->plan && g->plan->inputs_read;
}

bool ai_graph_value_meta(const ai_graph *g, int v, ai_meta *out)
{
    if (!g->plan || v < 0 || v >= g->plan->n_values)
        return false;
    *out = g->plan->meta[v];
    return true;
}

ai_status ai_graph_memory_stats(const ai_graph *g, ai_memory_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int v = 0; v < g->n_values; v++) {
        if (g->values[v].data)
            out->param_bytes += ai_tensor_nbytes(g->values[v].data);
        if (g->values[v].grad)
            out->grad_bytes += ai_tensor_nbytes(g->values[v].grad);
    }
    const ai_plan *p = g->plan;
    if (!p) /* not planned yet: only the parameters are known */
        return AI_OK;
    out->arena_bytes = p->arena_bytes;
    out->workspace_bytes = p->workspace_bytes;
    out->state_bytes = p->state_bytes;
    out->planned_nodes = p->n_sched;
    return AI_OK;
}

void ai_graph_zero_grad(ai_graph *g)
{
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].grad && g->values[v].grad->data)
            memset(g->values[v].grad->data, 0, ai_tensor_nbytes(g->values[v].grad));
}
