/*
 * control.c — control flow: Loop, If and Scan. Their bodies are graphs of their
 * own (attributes of type AI_ATTR_GRAPH, owned by the node), planned and
 * run by the engine like any graph.
 *
 * A body reads nothing from the enclosing graph by name: the importer turns
 * every outer value a body reads (a capture) into an explicit input of the
 * node, after its ONNX inputs, and of the body, after its ONNX inputs. The
 * gradient of a captured parameter (nn.EmbeddingBag's weight) is then an
 * input gradient of the node, as for any operator.
 *
 *   Loop  inputs  M (trip count, optional), cond (optional), N carried
 *                 values, C captures (attribute `captures` = C)
 *         outputs N final carried values, K scan outputs (each iteration's
 *                 value stacked on a new axis 0)
 *         body    (iteration, cond, N carried, C captures) -> (cond, N carried,
 *                 K scan values)
 *   If    inputs  cond, C captures; then_branch and else_branch take the C
 *                 captures and give the node's outputs
 *   Scan  inputs  [sequence_lens (opset 8)], N states, M scan inputs, C captures
 *         outputs N final states, K scan outputs
 *         body    (N states, M slices, C captures) -> (N states, K slices)
 *         Each iteration reads slice t (T - 1 - t in reverse) of each scan
 *         input along its scan_input_axes and writes one of each scan output
 *         along its scan_output_axes. Opset 8 adds a batch axis 0 to every
 *         input and output (the scan axis is 1 then) and runs each batch to
 *         its sequence_lens, the scan outputs zero after it.
 *
 * A body is planned again whenever its input shapes or the values of its
 * integer and bool inputs change (graph.h: ai_graph.subgraph): an
 * iteration's bounds may set its shapes (an EmbeddingBag bag's length).
 * Shape inference plans the body for iteration 0 (ai_graph_infer) with what
 * is known when the enclosing graph is planned; the integer inputs an
 * AI_OP_VALUES_AT_PLAN node depends on are known then (plan.c). A scan
 * output's length is the trip count M, or for a while loop the number of
 * iterations its condition allows when inferred iteration after iteration
 * (loop_count); a run that ends elsewhere is refused.
 *
 * Loop and Scan backward run the iterations in reverse: each one's forward again
 * from the carried values its forward kept (ai_graph.saved), then the body's
 * backward from the carried values' gradients and the scan outputs' slices;
 * the carried gradients go to the iteration before, the captures' gradients
 * add up into the node's (a Scan's slice gradients go to slice t of its scan
 * inputs'). If backward goes through the branch that ran.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"

/* "...: body: <the body's error>", naming the node */
static ai_status body_error(const ai_node *n, ai_status st, const char *what)
{
    return ai_node_error(n, st, "%s: %s", what, ai_last_error());
}

static bool same_meta(const ai_meta *a, const ai_tensor *t)
{
    return a->dtype == t->dtype && a->ndim == t->ndim &&
           !memcmp(a->shape, t->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static void meta_text(char *buf, size_t size, ai_dtype dtype, int ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(buf, size, "%s(", ai_dtype_name(dtype));
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", d ? ", " : "",
                               (long long)shape[d]);
    if (at < size)
        snprintf(buf + at, size - at, ")");
}

/* The subgraph attribute `name` of node n, finalized and marked a subgraph
 * that takes n_in inputs and gives n_out outputs. */
static ai_status subgraph_attr(ai_node *n, const char *name, int n_in, int n_out,
                               ai_graph **out)
{
    const ai_attr *a = ai_node_attr(n, name);
    if (!a || a->type != AI_ATTR_GRAPH)
        return ai_node_error(n, AI_ERR_VALUE, "needs the graph attribute '%s'", name);
    ai_graph *b = a->graph;
    b->subgraph = true;
    ai_status st = ai_graph_finalize(b);
    if (st)
        return body_error(n, st, name);
    if (b->n_inputs != n_in || b->n_outputs != n_out)
        return ai_node_error(n, AI_ERR_VALUE, "%s takes %d inputs and gives %d outputs; "
                             "%d and %d expected", name, b->n_inputs, b->n_outputs, n_in,
                             n_out);
    *out = b;
    return AI_OK;
}

/* A scalar of the body's input dtype (integer or bool) holding v. */
static ai_status scalar_new(ai_tensor **out, ai_dtype dtype, int64_t v)
{
    const int64_t none[1] = {0};
    ai_status st = ai_tensor_new(out, dtype, 0, none);
    if (st)
        return st;
    switch (dtype) {
    case AI_I64: *(int64_t *)(*out)->data = v; break;
    case AI_I32: *(int32_t *)(*out)->data = (int32_t)v; break;
    default: *(uint8_t *)(*out)->data = (uint8_t)(v != 0); break;
    }
    return AI_OK;
}

static void scalar_set(ai_tensor *t, int64_t v)
{
    switch (t->dtype) {
    case AI_I64: *(int64_t *)t->data = v; break;
    case AI_I32: *(int32_t *)t->data = (int32_t)v; break;
    default: *(uint8_t *)t->data = (uint8_t)(v != 0); break;
    }
}

static void free_all(ai_tensor **t, int n)
{
    for (int i = 0; i < n; i++) {
        ai_tensor_free(t[i]);
        t[i] = NULL;
    }
}

/* din += g (same meta); nothing when either is absent */
static void add_grad(ai_tensor *din, const ai_tensor *g)
{
    if (din && g)
        ai_accumulate(din, g, false);
}

/* ---------------------------------------------------------------- Loop */

typedef struct {
    ai_graph *body;
    int n_carried, n_scan, n_captures;
    bool redraws; /* the body has Dropout or BatchNormalization (see draws_again) */
} loop_params;

/* Whether running graph b again in training mode would not repeat its
 * first run: a node draws random numbers or updates its state
 * (AI_OP_NO_FOLD: Dropout, BatchNormalization), in b or in its subgraphs.
 * Loop backward runs each iteration again, so it refuses these. */
static bool draws_again(const ai_graph *b)
{
    for (int i = 0; i < b->n_nodes; i++) {
        const ai_node *n = &b->nodes[i];
        if (n->op->flags & AI_OP_NO_FOLD)
            return true;
        for (int k = 0; k < n->n_attrs; k++)
            if (n->attrs[k].type == AI_ATTR_GRAPH && draws_again(n->attrs[k].graph))
                return true;
    }
    return false;
}

typedef struct {
    int64_t iterations; /* of the last forward */
} loop_state;

static ai_status loop_init(ai_node *n)
{
    int64_t captures;
    ai_status st = ai_attr_int(n, "captures", 0, &captures);
    if (st)
        return st;
    if (n->n_in < 2 || captures < 0 || captures > n->n_in - 2)
        return ai_node_error(n, AI_ERR_VALUE, "has %d inputs and %lld captures; a Loop "
                             "takes M, cond, its carried values, then the captures",
                             n->n_in, (long long)captures);
    for (int k = 2; k < n->n_in; k++)
        if (n->in[k] < 0)
            return ai_node_error(n, AI_ERR_VALUE, "input %d is empty; only M and cond "
                                 "may be", k);
    const int N = n->n_in - 2 - (int)captures, K = n->n_out - N;
    if (K < 0)
        return ai_node_error(n, AI_ERR_VALUE, "has %d outputs for %d loop-carried values",
                             n->n_out, N);
    ai_graph *b;
    if ((st = subgraph_attr(n, "body", n->n_in, 1 + N + K, &b)))
        return st;
    const ai_dtype it = b->values[b->inputs[0]].dtype, cd = b->values[b->inputs[1]].dtype;
    if ((it != AI_I64 && it != AI_I32) || cd != AI_BOOL)
        return ai_node_error(n, AI_ERR_TYPE, "body inputs 0 and 1 (iteration number, "
                             "condition) must be int64 and bool, not %s and %s",
                             ai_dtype_name(it), ai_dtype_name(cd));
    loop_params *p = malloc(sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    *p = (loop_params){b, N, K, (int)captures, draws_again(b)};
    n->params = p;
    return AI_OK;
}

/* The trip count M (INT64_MAX when absent) and the initial condition. */
static ai_status loop_limits(const ai_ctx *c, const ai_tensor *m, const ai_tensor *cond,
                             int64_t *trips, bool *go)
{
    *trips = INT64_MAX;
    *go = true;
    if (c->in[0]) {
        if (ai_tensor_numel(c->in[0]) != 1 || ai_dtype_is_float(c->in[0]->dtype) ||
            c->in[0]->dtype == AI_BOOL)
            return ai_node_error(c->node, AI_ERR_VALUE, "trip count M must be one integer");
        if (m)
            *trips = ai_tensor_get_flat_i64(m, 0) < 0 ? 0 : ai_tensor_get_flat_i64(m, 0);
    }
    if (c->in[1]) {
        if (ai_tensor_numel(c->in[1]) != 1)
            return ai_node_error(c->node, AI_ERR_VALUE, "condition must be one value");
        if (cond)
            *go = ai_tensor_get_flat(cond, 0) != 0;
    }
    if (!c->in[0] && !c->in[1])
        return ai_node_error(c->node, AI_ERR_VALUE, "has neither a trip count M nor a "
                             "condition: it would never end");
    return AI_OK;
}

/* A while loop's number of iterations when the graph is planned: the body
 * inferred iteration after iteration (ai_graph_infer) while its condition
 * and the carried values it depends on fold (EmbeddingBag's loop over bags
 * in the dynamo export: `i + 1 < number of bags`); -1 when a condition is
 * not known then. Each iteration plans the body (10-25 us for a small
 * one), so the bound keeps a condition that never turns false to a fraction
 * of a second (a million iterations took 13 s). */
#define PLANNED_ITERATIONS_MAX 10000
static ai_status loop_count(const ai_ctx *c, ai_tensor *it, ai_tensor *ct, int64_t *count)
{
    const loop_params *P = c->node->params;
    const int N = P->n_carried, n_bout = 1 + N + P->n_scan;
    ai_tensor *carried[AI_MAX_IO] = {0}, *vals[AI_MAX_IO] = {0}, shapes[AI_MAX_IO];
    const ai_tensor *ins[AI_MAX_IO];
    ai_meta bm[AI_MAX_IO];
    ai_status st = AI_OK;
    *count = -1;
    for (int j = 0; j < N && !st; j++) { /* known values, or their dtypes and shapes */
        shapes[j] = *c->in[2 + j];
        if (c->in[2 + j]->storage)
            st = ai_tensor_share(&carried[j], c->in[2 + j]);
    }
    for (int64_t i = 0; !st; i++) {
        if (i == PLANNED_ITERATIONS_MAX) {
            st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "its condition is still true "
                               "after %d iterations when the graph is planned",
                               PLANNED_ITERATIONS_MAX);
            break;
        }
        scalar_set(it, i);
        ins[0] = it;
        ins[1] = ct;
        for (int j = 0; j < N; j++)
            ins[2 + j] = carried[j] ? carried[j] : &shapes[j];
        for (int k = 2 + N; k < c->n_in; k++)
            ins[k] = c->in[k];
        if ((st = ai_graph_infer(P->body, c->n_in, ins, bm, vals))) {
            st = body_error(c->node, st, "body");
            break;
        }
        if (!vals[0])
            break; /* not known now */
        for (int j = 0; j < N; j++) { /* the next iteration's carried values */
            ai_tensor_free(carried[j]);
            carried[j] = vals[1 + j];
            vals[1 + j] = NULL;
            if (!carried[j]) { /* its dtype and shape only */
                memset(&shapes[j], 0, sizeof shapes[j]);
                shapes[j].dtype = bm[1 + j].dtype;
                shapes[j].ndim = bm[1 + j].ndim;
                memcpy(shapes[j].shape, bm[1 + j].shape, sizeof bm[1 + j].shape);
            }
        }
        const bool go = ai_tensor_numel(vals[0]) == 1 && ai_tensor_get_flat(vals[0], 0) != 0;
        free_all(vals, n_bout);
        if (!go) {
            *count = i + 1;
            break;
        }
    }
    free_all(vals, n_bout);
    free_all(carried, N);
    return st;
}

static ai_status loop_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state_bytes)
{
    const loop_params *P = c->node->params;
    const int N = P->n_carried, K = P->n_scan, n_in = c->n_in;
    ai_graph *b = P->body;
    (void)ws;
    *state_bytes = sizeof(loop_state);
    const ai_tensor *m = ai_ctx_const(c, 0), *cond = ai_ctx_const(c, 1);
    int64_t trips;
    bool go;
    ai_status st = loop_limits(c, m, cond, &trips, &go);
    if (st)
        return st;
    if (!go)
        trips = 0;
    /* the body for iteration 0 (it runs with cond true), with the values
     * known now: the others give their shapes only */
    ai_tensor *it = NULL, *ct = NULL;
    ai_meta bm[AI_MAX_IO];
    const ai_tensor *ins[AI_MAX_IO];
    if ((st = scalar_new(&it, b->values[b->inputs[0]].dtype, 0)) ||
        (st = scalar_new(&ct, AI_BOOL, 1)))
        goto done;
    ins[0] = it;
    ins[1] = ct;
    for (int k = 2; k < n_in; k++)
        ins[k] = c->in[k];
    if ((st = ai_graph_infer(b, n_in, ins, bm, NULL))) {
        st = body_error(c->node, st, "body");
        goto done;
    }
    if (K > 0 && trips == INT64_MAX) { /* a while loop: its length, if it folds */
        int64_t count;
        if ((st = loop_count(c, it, ct, &count)))
            goto done;
        if (count < 0) {
            st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                               "its %d scan output%s need%s the number of iterations when the "
                               "graph is planned; the trip count M is %s and the condition "
                               "is not known then. The engine takes an M that is a constant "
                               "or computed from shapes and integer inputs, or a condition "
                               "computed from them", K, K > 1 ? "s" : "", K > 1 ? "" : "s",
                               c->in[0] ? "computed at run time" : "absent (a while loop)");
            goto done;
        }
        trips = count;
    }
    if (bm[0].dtype != AI_BOOL) {
        st = ai_node_error(c->node, AI_ERR_TYPE, "the body's condition output is %s; bool "
                           "expected", ai_dtype_name(bm[0].dtype));
        goto done;
    }
    for (int j = 0; j < N; j++) {
        const ai_tensor *x = c->in[2 + j];
        if (!same_meta(&bm[1 + j], x)) {
            char a[AI_MAX_DIMS * 24], o[AI_MAX_DIMS * 24];
            meta_text(a, sizeof a, x->dtype, x->ndim, x->shape);
            meta_text(o, sizeof o, bm[1 + j].dtype, bm[1 + j].ndim, bm[1 + j].shape);
            st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                               "loop-carried value %d comes in as %s and leaves the body as "
                               "%s; the engine keeps a carried value's dtype and shape",
                               j, a, o);
            goto done;
        }
        out[j].dtype = x->dtype;
        out[j].ndim = x->ndim;
        memcpy(out[j].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    }
    for (int k = 0; k < K; k++) {
        const ai_meta *s = &bm[1 + N + k];
        if (s->ndim + 1 > AI_MAX_DIMS) {
            st = ai_node_error(c->node, AI_ERR_VALUE, "scan output %d has rank %d", k,
                               s->ndim + 1);
            goto done;
        }
        out[N + k].dtype = s->dtype;
        out[N + k].ndim = s->ndim + 1;
        out[N + k].shape[0] = trips;
        memcpy(out[N + k].shape + 1, s->shape, sizeof(int64_t) * (size_t)s->ndim);
    }
done:
    ai_tensor_free(it);
    ai_tensor_free(ct);
    return st;
}

/* The body's inputs for iteration i: (it, ct, carried, the node's captures). */
static void loop_inputs(const ai_ctx *c, ai_tensor *it, ai_tensor *ct, ai_tensor *const *carried,
                        const ai_tensor **ins)
{
    const loop_params *P = c->node->params;
    ins[0] = it;
    ins[1] = ct;
    for (int j = 0; j < P->n_carried; j++)
        ins[2 + j] = carried[j];
    for (int k = 2 + P->n_carried; k < c->n_in; k++)
        ins[k] = c->in[k];
}

static ai_status loop_forward(ai_ctx *c)
{
    const loop_params *P = c->node->params;
    const int N = P->n_carried, K = P->n_scan, n_bout = 1 + N + K;
    ai_graph *b = P->body;
    const bool save = c->g->need_backward;
    int64_t trips, i = 0;
    bool go;
    ai_status st = loop_limits(c, c->in[0], c->in[1], &trips, &go);
    if (st)
        return st;
    if (save && c->training && P->redraws)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "its body has Dropout or BatchNormalization, which would draw or "
                             "update again when backward runs an iteration again: training "
                             "through it is not supported (eval mode, or no gradient, runs)");
    b->training = c->training;
    b->need_backward = false; /* backward runs each iteration again */
    b->input_grads = false;
    ai_graph_saved_clear(b);
    ai_tensor *it = NULL, *ct = NULL, *carried[AI_MAX_IO] = {0}, *outs[AI_MAX_IO] = {0};
    const ai_tensor *ins[AI_MAX_IO];
    if ((st = scalar_new(&it, b->values[b->inputs[0]].dtype, 0)) ||
        (st = scalar_new(&ct, AI_BOOL, 1)))
        goto done;
    for (int j = 0; j < N; j++)
        if ((st = ai_tensor_share(&carried[j], c->in[2 + j])))
            goto done;
    const int64_t planned = K > 0 ? c->out[N]->shape[0] : -1;
    for (; i < trips && go; i++) {
        if (i == planned) { /* (only a condition that stays true gets here) */
            st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "iteration %lld: the scan "
                               "outputs were planned for %lld iterations (the trip count M, "
                               "or the iterations the condition allowed when planning)",
                               (long long)i, (long long)planned);
            goto done;
        }
        scalar_set(it, i);
        for (int j = 0; j < N && save; j++)
            if ((st = ai_graph_save(b, carried[j])))
                goto done;
        loop_inputs(c, it, ct, carried, ins);
        if ((st = ai_graph_forward(b, c->n_in, ins, n_bout, outs))) {
            char what[64];
            snprintf(what, sizeof what, "body, iteration %lld", (long long)i);
            st = body_error(c->node, st, what);
            goto done;
        }
        if (ai_tensor_numel(outs[0]) != 1) {
            st = ai_node_error(c->node, AI_ERR_VALUE, "iteration %lld: the body's condition "
                               "has %lld elements; one expected", (long long)i,
                               (long long)ai_tensor_numel(outs[0]));
            goto done;
        }
        go = ai_tensor_get_flat(outs[0], 0) != 0;
        for (int j = 0; j < N; j++) {
            ai_meta m = {c->out[j]->dtype, c->out[j]->ndim, {0}};
            memcpy(m.shape, c->out[j]->shape, sizeof(int64_t) * (size_t)m.ndim);
            if (!same_meta(&m, outs[1 + j])) { /* (iteration 0 was checked when planning) */
                st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "iteration %lld: "
                                   "loop-carried value %d changes its dtype or shape; the "
                                   "engine keeps them", (long long)i, j);
                goto done;
            }
            ai_tensor_free(carried[j]);
            carried[j] = outs[1 + j];
            outs[1 + j] = NULL;
        }
        for (int k = 0; k < K; k++) {
            ai_tensor *y = c->out[N + k], *s = outs[1 + N + k];
            ai_meta slice = {y->dtype, y->ndim - 1, {0}};
            memcpy(slice.shape, y->shape + 1, sizeof(int64_t) * (size_t)slice.ndim);
            if (!same_meta(&slice, s)) {
                char a[AI_MAX_DIMS * 24], o[AI_MAX_DIMS * 24];
                meta_text(a, sizeof a, slice.dtype, slice.ndim, slice.shape);
                meta_text(o, sizeof o, s->dtype, s->ndim, s->shape);
                st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                                   "scan output %d is %s at iteration %lld and %s at "
                                   "iteration 0; the engine stacks scan values of one shape",
                                   k, o, (long long)i, a);
                goto done;
            }
            const size_t bytes = ai_tensor_nbytes(s);
            if (bytes)
                memcpy((char *)y->data + (size_t)i * bytes, s->data, bytes);
        }
        free_all(outs, n_bout);
    }
    if (K > 0 && i != planned) {
        st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                           "the loop ended after %lld iterations, and its scan outputs were "
                           "planned for %lld: the engine fixes their length when planning "
                           "(the trip count M, or the iterations the condition allowed then)",
                           (long long)i, (long long)planned);
        goto done;
    }
    for (int j = 0; j < N; j++)
        if ((st = ai_tensor_copy(c->out[j], carried[j])))
            goto done;
    ((loop_state *)c->state)->iterations = i;
done:
    free_all(outs, n_bout);
    free_all(carried, N);
    ai_tensor_free(it);
    ai_tensor_free(ct);
    return st;
}

static ai_status loop_backward(ai_ctx *c)
{
    const loop_params *P = c->node->params;
    const int N = P->n_carried, K = P->n_scan, n_bout = 1 + N + K, n_in = c->n_in;
    ai_graph *b = P->body;
    const int64_t iterations = ((const loop_state *)c->state)->iterations;
    if (b->n_saved != iterations * N)
        return ai_node_error(c->node, AI_ERR_VALUE, "backward needs the values of the "
                             "forward before it (run forward with gradients enabled)");
    b->training = c->training;
    b->need_backward = true;
    b->input_grads = true;
    ai_status st = AI_OK;
    ai_tensor *it = NULL, *ct = NULL, *outs[AI_MAX_IO] = {0}, *gin[AI_MAX_IO] = {0};
    ai_tensor *dcarry[AI_MAX_IO] = {0}, *slices[AI_MAX_IO] = {0};
    const ai_tensor *ins[AI_MAX_IO], *gout[AI_MAX_IO];
    if ((st = scalar_new(&it, b->values[b->inputs[0]].dtype, 0)) ||
        (st = scalar_new(&ct, AI_BOOL, 1)))
        goto done;
    for (int j = 0; j < N; j++) /* the gradients of the final carried values */
        if (c->dout[j] && (st = ai_tensor_clone(&dcarry[j], c->dout[j])))
            goto done;
    for (int64_t i = iterations - 1; i >= 0; i--) {
        scalar_set(it, i);
        loop_inputs(c, it, ct, N ? b->saved + i * N : NULL, ins);
        char what[64];
        snprintf(what, sizeof what, "body, iteration %lld", (long long)i);
        if ((st = ai_graph_forward(b, n_in, ins, n_bout, outs))) {
            st = body_error(c->node, st, what);
            goto done;
        }
        free_all(outs, n_bout);
        gout[0] = NULL;
        for (int j = 0; j < N; j++)
            gout[1 + j] = dcarry[j];
        for (int k = 0; k < K; k++) { /* slice i of the scan output's gradient */
            const ai_tensor *d = c->dout[N + k];
            gout[1 + N + k] = NULL;
            if (!d)
                continue;
            const size_t bytes = ai_tensor_nbytes(d) / (size_t)(d->shape[0] ? d->shape[0] : 1);
            if ((st = ai_tensor_borrow(&slices[k], (char *)d->data + (size_t)i * bytes,
                                       d->dtype, d->ndim - 1, d->shape + 1, NULL,
                                       AI_TENSOR_READONLY, false, NULL, NULL)))
                goto done;
            gout[1 + N + k] = slices[k];
        }
        st = ai_graph_backward(b, n_bout, gout, n_in, gin);
        free_all(slices, K);
        if (st) {
            st = body_error(c->node, st, what);
            goto done;
        }
        for (int j = 0; j < N; j++) { /* to the iteration before */
            ai_tensor_free(dcarry[j]);
            dcarry[j] = gin[2 + j];
            gin[2 + j] = NULL;
        }
        for (int k = 2 + N; k < n_in; k++)
            add_grad(c->din[k], gin[k]);
        free_all(gin, n_in);
    }
    for (int j = 0; j < N; j++)
        add_grad(c->din[2 + j], dcarry[j]);
done:
    free_all(outs, n_bout);
    free_all(gin, n_in);
    free_all(slices, K);
    free_all(dcarry, N);
    ai_tensor_free(it);
    ai_tensor_free(ct);
    return st;
}

/* ---------------------------------------------------------------- If */

typedef struct {
    ai_graph *branch[2]; /* else, then */
} if_params;

typedef struct {
    int ran; /* the branch of the last forward: 1 then, 0 else */
} if_state;

static const char *const branch_name[2] = {"else_branch", "then_branch"};

static ai_status if_init(ai_node *n)
{
    ai_graph *t = NULL, *e = NULL;
    ai_status st;
    if ((st = subgraph_attr(n, "then_branch", n->n_in - 1, n->n_out, &t)) ||
        (st = subgraph_attr(n, "else_branch", n->n_in - 1, n->n_out, &e)))
        return st;
    if (t == e)
        return ai_node_error(n, AI_ERR_VALUE, "then_branch and else_branch are one graph");
    if_params *p = malloc(sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    *p = (if_params){{e, t}};
    n->params = p;
    return AI_OK;
}

static ai_status if_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state_bytes)
{
    const if_params *P = c->node->params;
    (void)ws;
    *state_bytes = sizeof(if_state);
    if (ai_tensor_numel(c->in[0]) != 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "condition must be one value");
    const ai_tensor *cond = ai_ctx_const(c, 0);
    ai_meta m[2][AI_MAX_IO];
    for (int br = 0; br < 2; br++) {
        if (cond && (ai_tensor_get_flat(cond, 0) != 0) != br)
            continue; /* known now: only the branch taken is planned */
        ai_status st = ai_graph_infer(P->branch[br], c->n_in - 1,
                                      (const ai_tensor *const *)c->in + 1, m[br], NULL);
        if (st)
            return body_error(c->node, st, branch_name[br]);
        memcpy(out, m[br], sizeof(ai_meta) * (size_t)c->n_out);
    }
    for (int k = 0; !cond && k < c->n_out; k++) {
        const ai_meta *a = &m[1][k], *e = &m[0][k];
        if (a->dtype == e->dtype && a->ndim == e->ndim &&
            !memcmp(a->shape, e->shape, sizeof(int64_t) * (size_t)a->ndim))
            continue;
        char ta[AI_MAX_DIMS * 24], te[AI_MAX_DIMS * 24];
        meta_text(ta, sizeof ta, a->dtype, a->ndim, a->shape);
        meta_text(te, sizeof te, e->dtype, e->ndim, e->shape);
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "output %d is %s in then_branch and %s in else_branch; with a "
                             "condition known only at run time the engine needs both "
                             "branches to give the same dtypes and shapes", k, ta, te);
    }
    return AI_OK;
}

static ai_status if_forward(ai_ctx *c)
{
    const if_params *P = c->node->params;
    const int br = ai_tensor_get_flat(c->in[0], 0) != 0;
    ai_graph *b = P->branch[br];
    b->training = c->training;
    b->need_backward = c->g->need_backward;
    b->input_grads = c->g->need_backward;
    ai_tensor *outs[AI_MAX_IO] = {0};
    ai_status st = ai_graph_forward(b, c->n_in - 1, (const ai_tensor *const *)c->in + 1,
                                    c->n_out, outs);
    if (st)
        return body_error(c->node, st, branch_name[br]);
    for (int k = 0; k < c->n_out && !st; k++) {
        ai_meta m = {c->out[k]->dtype, c->out[k]->ndim, {0}};
        memcpy(m.shape, c->out[k]->shape, sizeof(int64_t) * (size_t)m.ndim);
        st = same_meta(&m, outs[k]) ? ai_tensor_copy(c->out[k], outs[k])
                                    : ai_node_error(c->node, AI_ERR_VALUE,
                                                    "%s's output %d changed shape since "
                                                    "the graph was planned",
                                                    branch_name[br], k);
    }
    free_all(outs, c->n_out);
    ((if_state *)c->state)->ran = br;
    return st;
}

static ai_status if_backward(ai_ctx *c)
{
    const if_params *P = c->node->params;
    const int br = ((const if_state *)c->state)->ran;
    ai_graph *b = P->branch[br];
    ai_tensor *gin[AI_MAX_IO] = {0};
    const ai_tensor *gout[AI_MAX_IO];
    for (int k = 0; k < c->n_out; k++)
        gout[k] = c->dout[k];
    ai_status st = ai_graph_backward(b, c->n_out, gout, c->n_in - 1, gin);
    if (st)
        return body_error(c->node, st, branch_name[br]);
    for (int k = 1; k < c->n_in; k++)
        add_grad(c->din[k], gin[k - 1]);
    free_all(gin, c->n_in - 1);
    return AI_OK;
}

/* ---------------------------------------------------------------- Scan */

typedef struct {
    ai_graph *body;
    int first;   /* the first state's input: 1 in opset 8 (sequence_lens first) */
    int n_state, n_scan_in, n_scan_out, n_captures; /* N, M, K, C */
    bool batched; /* opset 8: axis 0 of every input and output is a batch */
    bool redraws;
    int64_t in_axis[AI_MAX_IO], out_axis[AI_MAX_IO]; /* as the attributes give them */
    bool in_rev[AI_MAX_IO], out_rev[AI_MAX_IO];
} scan_params;

/* what forward keeps for backward; lens[b]: batch b's iterations */
typedef struct {
    int64_t batch, length;
    int in_axis[AI_MAX_IO], out_axis[AI_MAX_IO]; /* normalised, within a batch */
    int64_t lens[];
} scan_state;

/* ints attribute `name` of n entries (0 each when absent) into out */
static ai_status scan_flags(ai_node *n, const char *name, int count, int64_t *out)
{
    const int64_t *v;
    int64_t len;
    ai_status st = ai_attr_ints(n, name, &v, &len);
    if (st)
        return st;
    if (len >= 0 && len != count)
        return ai_node_error(n, AI_ERR_VALUE, "%s has %lld values for %d %s", name,
                             (long long)len, count,
                             strstr(name, "output") ? "scan outputs" : "scan inputs");
    for (int i = 0; i < count; i++)
        out[i] = len >= 0 ? v[i] : 0;
    return AI_OK;
}

static ai_status scan_init(ai_node *n)
{
    int64_t captures, m;
    ai_status st;
    if ((st = ai_attr_int(n, "captures", 0, &captures)) ||
        (st = ai_attr_int(n, "num_scan_inputs", -1, &m)))
        return st;
    const bool batched = n->opset < 9;
    const int first = batched ? 1 : 0;
    const int own = n->n_in - first - (int)captures; /* N + M */
    if (m < 1 || captures < 0 || own < m)
        return ai_node_error(n, AI_ERR_VALUE, "has %d inputs, %lld captures and "
                             "num_scan_inputs %lld; a Scan takes %sits state variables, "
                             "then num_scan_inputs (at least 1) scan inputs, then the "
                             "captures", n->n_in, (long long)captures, (long long)m,
                             batched ? "sequence_lens (opset 8), " : "");
    for (int k = first; k < n->n_in; k++)
        if (n->in[k] < 0)
            return ai_node_error(n, AI_ERR_VALUE, "input %d is empty; only sequence_lens "
                                 "may be", k);
    scan_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    p->first = first;
    p->batched = batched;
    p->n_scan_in = (int)m;
    p->n_state = own - (int)m;
    p->n_captures = (int)captures;
    p->n_scan_out = n->n_out - p->n_state;
    int64_t flags[2 * AI_MAX_IO]; /* the input directions, then the output ones */
    if (p->n_scan_out < 0)
        st = ai_node_error(n, AI_ERR_VALUE, "has %d outputs for %d state variables",
                           n->n_out, p->n_state);
    else if (batched)
        st = scan_flags(n, "directions", p->n_scan_in, flags);
    else if (!(st = scan_flags(n, "scan_input_directions", p->n_scan_in, flags)) &&
             !(st = scan_flags(n, "scan_input_axes", p->n_scan_in, p->in_axis)) &&
             !(st = scan_flags(n, "scan_output_axes", p->n_scan_out, p->out_axis)))
        st = scan_flags(n, "scan_output_directions", p->n_scan_out, flags + p->n_scan_in);
    for (int i = 0; !st && i < p->n_scan_in + (batched ? 0 : p->n_scan_out); i++) {
        if (flags[i] != 0 && flags[i] != 1)
            st = ai_node_error(n, AI_ERR_VALUE, "a direction is %lld; 0 (forward) or 1 "
                               "(reverse) expected", (long long)flags[i]);
        else if (i < p->n_scan_in)
            p->in_rev[i] = flags[i];
        else
            p->out_rev[i - p->n_scan_in] = flags[i];
    }
    if (!st)
        st = subgraph_attr(n, "body", own + (int)captures, p->n_state + p->n_scan_out,
                           &p->body);
    if (st) {
        free(p);
        return st;
    }
    p->redraws = draws_again(p->body);
    n->params = p;
    return AI_OK;
}

/* A metadata-only tensor (data NULL) of dtype and shape, for ai_graph_infer */
static void meta_tensor(ai_tensor *t, ai_dtype dtype, int ndim, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    ai_contiguous_strides(ndim, shape, t->strides);
}

/* Input or output tensor t seen by one batch: t itself, or (opset 8) its
 * batch b as a view. */
static ai_status batch_view(ai_tensor **v, const ai_tensor *t, bool batched, int64_t b)
{
    const int drop = batched ? 1 : 0;
    const size_t bytes = batched && t->shape[0] ? ai_tensor_nbytes(t) / (size_t)t->shape[0] : 0;
    return ai_tensor_borrow(v, t->data ? (char *)t->data + (size_t)b * bytes : NULL, t->dtype,
                            t->ndim - drop, t->shape + drop, NULL, 0, false, NULL, NULL);
}

enum { SLICE_GET, SLICE_PUT, SLICE_ADD };

/* Between slice `at` of axis `axis` of f and the contiguous slice s: s =
 * f[.., at, ..] (GET), f[.., at, ..] = s (PUT) or += s (ADD, f32/f64). */
static void slice_move(ai_tensor *f, ai_tensor *s, int axis, int64_t at, int how)
{
    const size_t es = ai_dtype_size(f->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++)
        outer *= f->shape[d];
    for (int d = axis + 1; d < f->ndim; d++)
        inner *= f->shape[d];
    const int64_t len = f->shape[axis];
    for (int64_t o = 0; o < outer; o++) {
        char *fp = (char *)f->data + (size_t)((o * len + at) * inner) * es;
        char *sp = (char *)s->data + (size_t)(o * inner) * es;
        if (how == SLICE_GET)
            memcpy(sp, fp, (size_t)inner * es);
        else if (how == SLICE_PUT)
            memcpy(fp, sp, (size_t)inner * es);
        else if (f->dtype == AI_F32)
            for (int64_t i = 0; i < inner; i++)
                ((float *)fp)[i] += ((const float *)sp)[i];
        else
            for (int64_t i = 0; i < inner; i++)
                ((double *)fp)[i] += ((const double *)sp)[i];
    }
}

/* The shape of t (one batch's) without axis `axis` */
static void drop_axis(const ai_tensor *t, int axis, int *ndim, int64_t *shape)
{
    *ndim = 0;
    for (int d = 0; d < t->ndim; d++)
        if (d != axis)
            shape[(*ndim)++] = t->shape[d];
}

static ai_status scan_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state_bytes)
{
    const scan_params *P = c->node->params;
    const int N = P->n_state, M = P->n_scan_in, K = P->n_scan_out, F = P->first;
    const int n_bin = c->n_in - F;
    (void)ws;
    int64_t batch = 1, length = -1;
    ai_tensor metas[AI_MAX_IO];
    const ai_tensor *ins[AI_MAX_IO];
    ai_meta bm[AI_MAX_IO];
    for (int k = 0; k < n_bin; k++) {
        const ai_tensor *x = c->in[F + k];
        ins[k] = x;
        if (k >= N + M) /* a capture */
            continue;
        const bool scanned = k >= N;
        if (P->batched) {
            if (x->ndim < (scanned ? 2 : 1))
                return ai_node_error(c->node, AI_ERR_VALUE, "%s %d has rank %d; opset 8 "
                                     "needs a batch axis%s", scanned ? "scan input" : "state",
                                     scanned ? k - N : k, x->ndim,
                                     scanned ? " and a sequence axis" : "");
            if (k == 0)
                batch = x->shape[0];
            else if (x->shape[0] != batch)
                return ai_node_error(c->node, AI_ERR_VALUE, "input %d has batch %lld, "
                                     "input %d %lld", F + k, (long long)x->shape[0], F,
                                     (long long)batch);
        }
        const int drop = P->batched ? 1 : 0;
        if (!scanned) {
            if (P->batched) {
                meta_tensor(&metas[k], x->dtype, x->ndim - 1, x->shape + 1);
                ins[k] = &metas[k];
            }
            continue;
        }
        const int r = x->ndim - drop;
        int a;
        ai_status st = ai_norm_axis(c->node, P->in_axis[k - N], r, &a);
        if (st)
            return st;
        const int64_t len = x->shape[drop + a];
        if (length >= 0 && len != length)
            return ai_node_error(c->node, AI_ERR_VALUE, "scan input %d has %lld steps along "
                                 "its scan axis, scan input 0 %lld", k - N, (long long)len,
                                 (long long)length);
        length = len;
        int nd;
        int64_t shp[AI_MAX_DIMS];
        drop_axis(x, drop + a, &nd, shp);
        if (P->batched) { /* drop_axis kept the batch: drop it too */
            nd--;
            memmove(shp, shp + 1, sizeof(int64_t) * (size_t)nd);
        }
        meta_tensor(&metas[k], x->dtype, nd, shp);
        ins[k] = &metas[k];
    }
    ai_status st = ai_graph_infer(P->body, n_bin, ins, bm, NULL);
    if (st)
        return body_error(c->node, st, "body");
    for (int j = 0; j < N; j++) {
        const ai_tensor *x = ins[j];
        if (!same_meta(&bm[j], x)) {
            char a[AI_MAX_DIMS * 24], o[AI_MAX_DIMS * 24];
            meta_text(a, sizeof a, x->dtype, x->ndim, x->shape);
            meta_text(o, sizeof o, bm[j].dtype, bm[j].ndim, bm[j].shape);
            return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "state variable %d comes in "
                                 "as %s and leaves the body as %s; the engine keeps a state's "
                                 "dtype and shape", j, a, o);
        }
        const ai_tensor *y = c->in[F + j];
        out[j].dtype = y->dtype;
        out[j].ndim = y->ndim;
        memcpy(out[j].shape, y->shape, sizeof(int64_t) * (size_t)y->ndim);
    }
    for (int k = 0; k < K; k++) {
        const ai_meta *s = &bm[N + k];
        const int drop = P->batched ? 1 : 0;
        if (s->ndim + 1 + drop > AI_MAX_DIMS)
            return ai_node_error(c->node, AI_ERR_VALUE, "scan output %d has rank %d", k,
                                 s->ndim + 1 + drop);
        int a;
        if ((st = ai_norm_axis(c->node, P->out_axis[k], s->ndim + 1, &a)))
            return st;
        ai_meta *y = &out[N + k];
        y->dtype = s->dtype;
        y->ndim = s->ndim + 1 + drop;
        y->shape[0] = batch;
        for (int d = 0, from = 0; d < s->ndim + 1; d++)
            y->shape[drop + d] = d == a ? (length < 0 ? 0 : length) : s->shape[from++];
    }
    *state_bytes = sizeof(scan_state) + sizeof(int64_t) * (size_t)batch;
    return AI_OK;
}

/* The run's batches, length, normalised axes and each batch's iterations
 * (opset 8's sequence_lens, else the scan inputs' length). */
static ai_status scan_geometry(const ai_ctx *c, scan_state *S)
{
    const scan_params *P = c->node->params;
    const int N = P->n_state, F = P->first, drop = P->batched ? 1 : 0;
    ai_status st;
    S->batch = P->batched ? c->in[F]->shape[0] : 1;
    for (int i = 0; i < P->n_scan_in; i++) {
        const ai_tensor *x = c->in[F + N + i];
        if ((st = ai_norm_axis(c->node, P->in_axis[i], x->ndim - drop, &S->in_axis[i])))
            return st;
        S->length = x->shape[drop + S->in_axis[i]];
    }
    for (int k = 0; k < P->n_scan_out; k++)
        if ((st = ai_norm_axis(c->node, P->out_axis[k], c->out[N + k]->ndim - drop,
                               &S->out_axis[k])))
            return st;
    const ai_tensor *lens = P->batched ? c->in[0] : NULL;
    if (lens && (ai_tensor_numel(lens) != S->batch || ai_dtype_is_float(lens->dtype)))
        return ai_node_error(c->node, AI_ERR_VALUE, "sequence_lens has %lld values for a "
                             "batch of %lld; integers expected",
                             (long long)ai_tensor_numel(lens), (long long)S->batch);
    for (int64_t b = 0; b < S->batch; b++) {
        S->lens[b] = lens ? ai_tensor_get_flat_i64(lens, b) : S->length;
        if (S->lens[b] < 0 || S->lens[b] > S->length)
            return ai_node_error(c->node, AI_ERR_VALUE, "sequence_lens[%lld] is %lld; 0 to "
                                 "the sequence length %lld expected", (long long)b,
                                 (long long)S->lens[b], (long long)S->length);
    }
    return AI_OK;
}

/* Views of one batch's tensors: the node's states and scan inputs (`in`),
 * outputs (`out`) or their gradients; NULL stays NULL. */
static ai_status scan_views(const scan_params *P, ai_tensor *const *t, int n, int64_t b,
                            ai_tensor **v)
{
    for (int k = 0; k < n; k++) {
        v[k] = NULL;
        ai_status st = t[k] ? batch_view(&v[k], t[k], P->batched, b) : AI_OK;
        if (st)
            return st;
    }
    return AI_OK;
}

/* New tensors for slice `axis` of each of the n views */
static ai_status scan_slices(ai_tensor *const *v, const int *axis, int n, ai_tensor **s)
{
    for (int k = 0; k < n; k++) {
        int nd;
        int64_t shape[AI_MAX_DIMS];
        s[k] = NULL;
        if (!v[k])
            continue;
        drop_axis(v[k], axis[k], &nd, shape);
        ai_status st = ai_tensor_new(&s[k], v[k]->dtype, nd, shape);
        if (st)
            return st;
    }
    return AI_OK;
}

/* The body's inputs at iteration t of a batch of T: states, slices of the
 * scan inputs (read), then the node's captures. */
static void scan_inputs(const ai_ctx *c, const scan_state *S, ai_tensor *const *state,
                        ai_tensor *const *views, ai_tensor *const *slices, int64_t t,
                        int64_t T, const ai_tensor **ins)
{
    const scan_params *P = c->node->params;
    const int N = P->n_state, M = P->n_scan_in;
    for (int j = 0; j < N; j++)
        ins[j] = state[j];
    for (int i = 0; i < M; i++) {
        slice_move(views[N + i], slices[i], S->in_axis[i], P->in_rev[i] ? T - 1 - t : t,
                   SLICE_GET);
        ins[N + i] = slices[i];
    }
    for (int k = P->first + N + M; k < c->n_in; k++)
        ins[k - P->first] = c->in[k];
}

static ai_status scan_forward(ai_ctx *c)
{
    const scan_params *P = c->node->params;
    const int N = P->n_state, M = P->n_scan_in, K = P->n_scan_out, F = P->first;
    const int n_bin = c->n_in - F, n_bout = N + K;
    ai_graph *b = P->body;
    scan_state *S = c->state;
    const bool save = c->g->need_backward;
    if (save && c->training && P->redraws)
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "its body has Dropout or BatchNormalization, which would draw or "
                             "update again when backward runs an iteration again: training "
                             "through it is not supported (eval mode, or no gradient, runs)");
    ai_status st = scan_geometry(c, S);
    if (st)
        return st;
    b->training = c->training;
    b->need_backward = false; /* backward runs each iteration again */
    b->input_grads = false;
    ai_graph_saved_clear(b);
    ai_tensor *views[AI_MAX_IO] = {0}, *oviews[AI_MAX_IO] = {0}, *slices[AI_MAX_IO] = {0};
    ai_tensor *state[AI_MAX_IO] = {0}, *outs[AI_MAX_IO] = {0};
    const ai_tensor *ins[AI_MAX_IO];
    for (int64_t bt = 0; bt < S->batch && !st; bt++) {
        const int64_t T = S->lens[bt];
        if ((st = scan_views(P, c->in + F, N + M, bt, views)) ||
            (st = scan_views(P, c->out, n_bout, bt, oviews)) ||
            (st = scan_slices(views + N, S->in_axis, M, slices)))
            break;
        for (int j = 0; j < N && !st; j++)
            st = ai_tensor_share(&state[j], views[j]);
        for (int k = 0; k < K && T < S->length; k++) /* padding after a short sequence */
            if (ai_tensor_nbytes(oviews[N + k]))
                memset(oviews[N + k]->data, 0, ai_tensor_nbytes(oviews[N + k]));
        for (int64_t t = 0; t < T && !st; t++) {
            for (int j = 0; j < N && save && !st; j++)
                st = ai_graph_save(b, state[j]);
            if (st)
                break;
            scan_inputs(c, S, state, views, slices, t, T, ins);
            if ((st = ai_graph_forward(b, n_bin, ins, n_bout, outs))) {
                char what[64];
                snprintf(what, sizeof what, "body, iteration %lld", (long long)t);
                st = body_error(c->node, st, what);
                break;
            }
            for (int j = 0; j < n_bout && !st; j++) { /* shapes as planned */
                ai_meta m = {oviews[j]->dtype, 0, {0}};
                const int axis = j < N ? -1 : S->out_axis[j - N];
                drop_axis(oviews[j], axis, &m.ndim, m.shape);
                if (!same_meta(&m, outs[j]))
                    st = ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED, "iteration %lld: "
                                       "%s %d changes its dtype or shape; the engine keeps "
                                       "them", (long long)t, j < N ? "state variable" :
                                       "scan output", j < N ? j : j - N);
            }
            for (int k = 0; k < K && !st; k++)
                slice_move(oviews[N + k], outs[N + k], S->out_axis[k],
                           P->out_rev[k] ? T - 1 - t : t, SLICE_PUT);
            for (int j = 0; j < N && !st; j++) {
                ai_tensor_free(state[j]);
                state[j] = outs[j];
                outs[j] = NULL;
            }
            free_all(outs, n_bout);
        }
        for (int j = 0; j < N && !st; j++)
            st = ai_tensor_copy(oviews[j], state[j]);
        free_all(state, N);
        free_all(slices, M);
        free_all(views, N + M);
        free_all(oviews, n_bout);
    }
    free_all(outs, n_bout);
    free_all(state, N);
    free_all(slices, M);
    free_all(views, N + M);
    free_all(oviews, n_bout);
    return st;
}

static ai_status scan_backward(ai_ctx *c)
{
    const scan_params *P = c->node->params;
    const int N = P->n_state, M = P->n_scan_in, K = P->n_scan_out, F = P->first;
    const int n_bin = c->n_in - F, n_bout = N + K;
    ai_graph *b = P->body;
    const scan_state *S = c->state;
    int64_t total = 0;
    for (int64_t bt = 0; bt < S->batch; bt++)
        total += S->lens[bt];
    if (b->n_saved != total * N)
        return ai_node_error(c->node, AI_ERR_VALUE, "backward needs the values of the "
                             "forward before it (run forward with gradients enabled)");
    b->training = c->training;
    b->need_backward = true;
    b->input_grads = true;
    ai_status st = AI_OK;
    ai_tensor *views[AI_MAX_IO] = {0}, *dviews[AI_MAX_IO] = {0}, *gviews[AI_MAX_IO] = {0};
    ai_tensor *slices[AI_MAX_IO] = {0}, *gslices[AI_MAX_IO] = {0}, *dstate[AI_MAX_IO] = {0};
    ai_tensor *outs[AI_MAX_IO] = {0}, *gin[AI_MAX_IO] = {0};
    const ai_tensor *ins[AI_MAX_IO], *gout[AI_MAX_IO];
    int64_t done = 0; /* iterations of the batches before */
    for (int64_t bt = 0; bt < S->batch && !st; done += S->lens[bt], bt++) {
        const int64_t T = S->lens[bt];
        if ((st = scan_views(P, c->in + F, N + M, bt, views)) ||
            (st = scan_views(P, c->din + F, N + M, bt, dviews)) ||
            (st = scan_views(P, c->dout, n_bout, bt, gviews)) ||
            (st = scan_slices(views + N, S->in_axis, M, slices)) ||
            (st = scan_slices(gviews + N, S->out_axis, K, gslices)))
            break;
        for (int j = 0; j < N && !st; j++) /* the gradients of the final states */
            if (gviews[j])
                st = ai_tensor_clone(&dstate[j], gviews[j]);
        for (int64_t t = T - 1; t >= 0 && !st; t--) {
            char what[64];
            snprintf(what, sizeof what, "body, iteration %lld", (long long)t);
            scan_inputs(c, S, b->saved + (done + t) * N, views, slices, t, T, ins);
            if ((st = ai_graph_forward(b, n_bin, ins, n_bout, outs))) {
                st = body_error(c->node, st, what);
                break;
            }
            free_all(outs, n_bout);
            for (int j = 0; j < N; j++)
                gout[j] = dstate[j];
            for (int k = 0; k < K; k++) {
                gout[N + k] = gslices[k];
                if (gslices[k])
                    slice_move(gviews[N + k], gslices[k], S->out_axis[k],
                               P->out_rev[k] ? T - 1 - t : t, SLICE_GET);
            }
            if ((st = ai_graph_backward(b, n_bout, gout, n_bin, gin))) {
                st = body_error(c->node, st, what);
                break;
            }
            for (int j = 0; j < N; j++) { /* to the iteration before */
                ai_tensor_free(dstate[j]);
                dstate[j] = gin[j];
                gin[j] = NULL;
            }
            for (int i = 0; i < M; i++)
                if (dviews[N + i] && gin[N + i])
                    slice_move(dviews[N + i], gin[N + i], S->in_axis[i],
                               P->in_rev[i] ? T - 1 - t : t, SLICE_ADD);
            for (int k = N + M; k < n_bin; k++)
                add_grad(c->din[F + k], gin[k]);
            free_all(gin, n_bin);
        }
        for (int j = 0; j < N && !st; j++)
            add_grad(dviews[j], dstate[j]);
        free_all(dstate, N);
        free_all(slices, M);
        free_all(gslices, K);
        free_all(views, N + M);
        free_all(dviews, N + M);
        free_all(gviews, n_bout);
    }
    free_all(outs, n_bout);
    free_all(gin, n_bin);
    free_all(dstate, N);
    free_all(slices, M);
    free_all(gslices, K);
    free_all(views, N + M);
    free_all(dviews, N + M);
    free_all(gviews, n_bout);
    return st;
}

/* Backward reads the inputs (a Loop's captures; an If's branch keeps views
 * of them), never the outputs. */
static const ai_op_def op_loop = {"Loop", "", 2, AI_MAX_IO, 1, AI_MAX_IO,
                                  AI_OP_VALUES_AT_PLAN | AI_OP_EMPTY_INPUTS | AI_OP_BWD_NO_Y |
                                      AI_OP_HALF | AI_OP_HALF_GRAD,
                                  loop_init,
                                  loop_shape, loop_forward, loop_backward};
static const ai_op_def op_scan = {"Scan", "", 1, AI_MAX_IO, 1, AI_MAX_IO,
                                  AI_OP_VALUES_AT_PLAN | AI_OP_EMPTY_INPUTS | AI_OP_BWD_NO_Y,
                                  scan_init, scan_shape, scan_forward, scan_backward};
static const ai_op_def op_if = {"If", "", 1, AI_MAX_IO, 1, AI_MAX_IO,
                                AI_OP_VALUES_AT_PLAN | AI_OP_BWD_NO_Y | AI_OP_HALF |
                                    AI_OP_HALF_GRAD,
                                if_init, if_shape,
                                if_forward, if_backward};

const ai_op_def *const ai_ops_control[] = {&op_loop, &op_if, &op_scan, NULL};
