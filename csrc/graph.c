/*
 * graph.c — building, checking and ordering a graph (the IR half).
 * Planning and execution are in plan.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "plan.h"

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

ai_status ai_node_error(const ai_node *n, ai_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ai_error(st, "%s node '%s': %s", n->op_type, n->name, msg);
}

/* ---------------------------------------------------------------- lifetime */

ai_status ai_graph_new(ai_graph **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return ai_error(AI_ERR_NOMEM, "out of memory for a graph");
    (*out)->seed = 0x9E3779B97F4A7C15ull;
    (*out)->weights_version = -1;
    return AI_OK;
}

static void attr_clear(ai_attr *a)
{
    free(a->name);
    free(a->ints);
    free(a->floats);
    free(a->s);
    ai_tensor_free(a->t);
    ai_graph_free(a->graph);
}

static void node_clear(ai_node *n)
{
    free(n->name);
    free(n->op_type);
    free(n->domain);
    free(n->params);
    for (int k = 0; k < n->n_attrs; k++)
        attr_clear(&n->attrs[k]);
    free(n->attrs);
}

static void value_clear(ai_value *v)
{
    free(v->name);
    ai_tensor_free(v->data);
    ai_tensor_free(v->grad);
}

void ai_graph_free(ai_graph *g)
{
    if (!g)
        return;
    if (g->refs > 0) {
        g->refs--;
        return;
    }
    ai_graph_saved_clear(g);
    free(g->saved);
    ai_packed_clear(g);
    ai_plan_free(g->plan);
    for (int i = 0; i < g->n_values; i++)
        value_clear(&g->values[i]);
    for (int i = 0; i < g->n_nodes; i++)
        node_clear(&g->nodes[i]);
    free(g->values);
    free(g->nodes);
    free(g->inputs);
    free(g->input_dims);
    free(g->outputs);
    free(g->order);
    free(g);
}

/* ---------------------------------------------------------------- building */

int ai_graph_find_value(const ai_graph *g, const char *name)
{
    for (int i = 0; i < g->n_values; i++)
        if (strcmp(g->values[i].name, name) == 0)
            return i;
    return -1;
}

static ai_status grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return AI_OK;
    int ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory growing the graph");
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(ncap - *cap) * elem);
    *arr = p;
    *cap = ncap;
    return AI_OK;
}

/* The value called `name`, created as a not-yet-produced activation when new. */
static ai_status value_get(ai_graph *g, const char *name, int *out)
{
    int v = ai_graph_find_value(g, name);
    if (v >= 0) {
        *out = v;
        return AI_OK;
    }
    ai_status st = grow((void **)&g->values, &g->cap_values, g->n_values + 1, sizeof(ai_value));
    if (st)
        return st;
    ai_value *val = &g->values[g->n_values];
    memset(val, 0, sizeof *val);
    if (!(val->name = dupstr(name)))
        return ai_error(AI_ERR_NOMEM, "out of memory for a value name");
    val->kind = AI_VAL_ACT;
    val->dtype = AI_F32;
    val->producer = -1;
    *out = g->n_values++;
    return AI_OK;
}

static ai_status check_building(ai_graph *g)
{
    if (g->finalized)
        return ai_error(AI_ERR_VALUE, "the graph is finalized; it cannot be changed");
    return AI_OK;
}

/* A new value for an input or initializer: its name must be unused. */
static ai_status value_define(ai_graph *g, const char *name, int *out)
{
    if (!name[0])
        return ai_error(AI_ERR_VALUE, "a graph input or initializer has an empty name");
    int v = ai_graph_find_value(g, name);
    if (v >= 0 && (g->values[v].kind != AI_VAL_ACT || g->values[v].producer >= 0))
        return ai_error(AI_ERR_VALUE, "value '%s' is defined twice", name);
    return value_get(g, name, out);
}

ai_status ai_graph_add_input(ai_graph *g, const char *name, ai_dtype dtype)
{
    ai_status st;
    int v;
    if ((st = check_building(g)) || (st = value_define(g, name, &v)))
        return st;
    if ((unsigned)dtype >= AI_DTYPE_COUNT)
        return ai_error(AI_ERR_TYPE, "graph input '%s' has an invalid dtype", name);
    int *p = realloc(g->inputs, sizeof(int) * (size_t)(g->n_inputs + 1));
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    g->inputs = p;
    int64_t(*d)[AI_MAX_DIMS + 1] = realloc(g->input_dims,
                                           sizeof *d * (size_t)(g->n_inputs + 1));
    if (!d)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    g->input_dims = d;
    g->input_dims[g->n_inputs][0] = -1;
    g->inputs[g->n_inputs++] = v;
    g->values[v].kind = AI_VAL_INPUT;
    g->values[v].dtype = dtype;
    return AI_OK;
}

ai_status ai_graph_set_input_dims(ai_graph *g, const char *name, int ndim,
                                  const int64_t *dims)
{
    ai_status st = check_building(g);
    if (st)
        return st;
    if (ndim < 0 || ndim > AI_MAX_DIMS)
        return ai_error(AI_ERR_VALUE, "graph input '%s': rank %d is out of range", name, ndim);
    for (int i = 0; i < g->n_inputs; i++) {
        if (strcmp(g->values[g->inputs[i]].name, name) != 0)
            continue;
        g->input_dims[i][0] = ndim;
        for (int d = 0; d < ndim; d++)
            g->input_dims[i][1 + d] = dims[d] >= 0 ? dims[d] : -1;
        return AI_OK;
    }
    return ai_error(AI_ERR_VALUE, "the graph has no input '%s'", name);
}

ai_status ai_graph_share_grad(ai_graph *g, const char *name, const ai_tensor *grad)
{
    ai_status st;
    int v;
    if ((st = check_building(g)) || (st = value_get(g, name, &v)))
        return st;
    ai_value *val = &g->values[v];
    if (val->kind != AI_VAL_PARAM)
        return ai_error(AI_ERR_VALUE, "'%s' is not a parameter: it has no gradient", name);
    if (grad->dtype != val->dtype || grad->ndim != val->data->ndim ||
        memcmp(grad->shape, val->data->shape, sizeof(int64_t) * (size_t)grad->ndim) ||
        !ai_tensor_is_contiguous(grad) || (grad->flags & AI_TENSOR_READONLY))
        return ai_error(AI_ERR_VALUE, "the gradient shared with parameter '%s' must be a "
                        "contiguous, writable %s tensor of its shape", name,
                        ai_dtype_name(val->dtype));
    ai_tensor *t;
    if ((st = ai_tensor_share(&t, grad)))
        return st;
    ai_tensor_free(val->grad);
    val->grad = t;
    return AI_OK;
}

ai_status ai_graph_add_initializer(ai_graph *g, const char *name, ai_value_kind kind,
                                   ai_tensor *t)
{
    ai_status st;
    int v;
    if ((st = check_building(g)) || (st = value_define(g, name, &v))) {
        ai_tensor_free(t);
        return st;
    }
    if (kind != AI_VAL_PARAM && kind != AI_VAL_BUFFER && kind != AI_VAL_CONST) {
        ai_tensor_free(t);
        return ai_error(AI_ERR_VALUE, "initializer '%s': invalid kind", name);
    }
    if (kind == AI_VAL_PARAM && !ai_dtype_is_float(t->dtype)) {
        ai_tensor_free(t);
        return ai_error(AI_ERR_TYPE, "parameter '%s' has dtype %s; parameters are float",
                        name, ai_dtype_name(t->dtype));
    }
    /* the graph keeps its own contiguous, writable copy unless it already
     * owns one (values are updated in place by SGD and BatchNorm) */
    ai_value *val = &g->values[v];
    if (!ai_tensor_is_contiguous(t) || (t->flags & AI_TENSOR_READONLY)) {
        ai_tensor *c;
        st = ai_tensor_clone(&c, t);
        ai_tensor_free(t);
        if (st)
            return st;
        t = c;
    }
    val->kind = kind;
    val->dtype = t->dtype;
    val->data = t;
    if (kind == AI_VAL_PARAM)
        return ai_tensor_new(&val->grad, t->dtype, t->ndim, t->shape);
    return AI_OK;
}

static ai_status attr_copy(ai_attr *dst, const ai_attr *src)
{
    memset(dst, 0, sizeof *dst);
    dst->type = src->type;
    dst->i = src->i;
    dst->f = src->f;
    dst->n = src->n;
    if (!(dst->name = dupstr(src->name)))
        goto nomem;
    if (src->ints && src->n > 0) {
        if (!(dst->ints = malloc(sizeof(int64_t) * (size_t)src->n)))
            goto nomem;
        memcpy(dst->ints, src->ints, sizeof(int64_t) * (size_t)src->n);
    }
    if (src->floats && src->n > 0) {
        if (!(dst->floats = malloc(sizeof(double) * (size_t)src->n)))
            goto nomem;
        memcpy(dst->floats, src->floats, sizeof(double) * (size_t)src->n);
    }
    if (src->s && !(dst->s = dupstr(src->s)))
        goto nomem;
    if (src->t) {
        ai_status st = ai_tensor_clone(&dst->t, src->t);
        if (st)
            return st;
    }
    if (src->graph) { /* one subgraph, one more owner */
        dst->graph = src->graph;
        dst->graph->refs++;
    }
    return AI_OK;
nomem:
    return ai_error(AI_ERR_NOMEM, "out of memory copying an attribute");
}

ai_status ai_graph_add_node(ai_graph *g, const char *name, const char *domain,
                            const char *op_type, int opset, int n_in,
                            const char *const *inputs, int n_out,
                            const char *const *outputs, int n_attrs,
                            const ai_attr *attrs)
{
    ai_status st;
    if ((st = check_building(g)))
        return st;
    if (n_in < 0 || n_in > AI_MAX_IO || n_out < 1 || n_out > AI_MAX_IO)
        return ai_error(AI_ERR_VALUE,
                        "%s node '%s' has %d inputs and %d outputs (at most %d each, "
                        "at least one output)", op_type, name, n_in, n_out, AI_MAX_IO);
    if ((st = grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(ai_node))))
        return st;
    ai_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->opset = opset;
    n->n_in = n_in;
    n->n_out = n_out;
    if (!(n->name = dupstr(name)) || !(n->op_type = dupstr(op_type)) ||
        !(n->domain = dupstr(domain ? domain : ""))) {
        st = ai_error(AI_ERR_NOMEM, "out of memory for a node");
        goto fail;
    }
    for (int i = 0; i < n_in; i++) {
        if (!inputs[i][0]) {
            n->in[i] = -1;
        } else if ((st = value_get(g, inputs[i], &n->in[i]))) {
            goto fail;
        }
    }
    for (int i = 0; i < n_out; i++) {
        if (!outputs[i][0]) { /* unused optional output: a private name */
            char buf[600];
            snprintf(buf, sizeof buf, "%s:unused_output_%d", name, i);
            if ((st = value_get(g, buf, &n->out[i])))
                goto fail;
        } else if ((st = value_get(g, outputs[i], &n->out[i]))) {
            goto fail;
        }
        ai_value *v = &g->values[n->out[i]];
        if (v->kind != AI_VAL_ACT || v->producer >= 0) {
            st = ai_node_error(n, AI_ERR_VALUE, "output '%s' is already defined elsewhere",
                               v->name);
            goto fail;
        }
        v->producer = g->n_nodes;
        v->producer_slot = i;
    }
    if (n_attrs > 0) {
        if (!(n->attrs = calloc((size_t)n_attrs, sizeof(ai_attr)))) {
            st = ai_error(AI_ERR_NOMEM, "out of memory for attributes");
            goto fail;
        }
        for (int i = 0; i < n_attrs; i++) {
            n->n_attrs = i + 1;
            if ((st = attr_copy(&n->attrs[i], &attrs[i])))
                goto fail;
        }
    }
    g->n_nodes++;
    return AI_OK;
fail:
    for (int i = 0; i < n_out; i++) /* undo producer marks */
        if (n->out[i] >= 0 && n->out[i] < g->n_values &&
            g->values[n->out[i]].producer == g->n_nodes)
            g->values[n->out[i]].producer = -1;
    free(n->name);
    free(n->op_type);
    free(n->domain);
    for (int k = 0; k < n->n_attrs; k++)
        attr_clear(&n->attrs[k]);
    free(n->attrs);
    memset(n, 0, sizeof *n);
    return st;
}

ai_status ai_graph_set_outputs(ai_graph *g, int n, const char *const *names)
{
    ai_status st;
    if ((st = check_building(g)))
        return st;
    if (n < 1)
        return ai_error(AI_ERR_VALUE, "a graph needs at least one output");
    int *p = malloc(sizeof(int) * (size_t)n);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        int v = ai_graph_find_value(g, names[i]);
        if (v < 0) {
            free(p);
            return ai_error(AI_ERR_VALUE, "graph output '%s' is not produced by any node, "
                            "input or initializer", names[i]);
        }
        p[i] = v;
    }
    free(g->outputs);
    g->outputs = p;
    g->n_outputs = n;
    return AI_OK;
}

/* ---------------------------------------------------------------- finalize */

ai_status ai_graph_finalize(ai_graph *g)
{
    ai_status st;
    if (g->finalized)
        return AI_OK;
    if (!g->n_outputs)
        return ai_error(AI_ERR_VALUE, "the graph has no outputs");
    for (int i = 0; i < g->n_nodes; i++) {
        ai_node *n = &g->nodes[i];
        const ai_op_def *op = ai_op_find(n->domain, n->op_type);
        if (!op)
            return ai_error(AI_ERR_NOT_IMPLEMENTED,
                            "operator %s%s%s (node '%s', opset %d) is not supported by "
                            "the engine", n->domain[0] ? n->domain : "",
                            n->domain[0] ? "." : "", n->op_type, n->name, n->opset);
        n->op = op;
        if (n->n_in < op->min_in || n->n_in > op->max_in)
            return ai_node_error(n, AI_ERR_VALUE, "has %d inputs; %s takes %d to %d",
                                 n->n_in, op->name, op->min_in, op->max_in);
        if (n->n_out < op->min_out || n->n_out > op->max_out)
            return ai_node_error(n, AI_ERR_VALUE, "has %d outputs; %s gives %d to %d",
                                 n->n_out, op->name, op->min_out, op->max_out);
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < 0 && !(op->flags & AI_OP_EMPTY_INPUTS) &&
                (k < op->min_in || op->max_in == AI_MAX_IO)) /* variadic: all */
                return ai_node_error(n, AI_ERR_VALUE, "input %d is empty, but %s needs it",
                                     k, op->name);
            if (v >= 0 && g->values[v].kind == AI_VAL_ACT && g->values[v].producer < 0)
                return ai_node_error(n, AI_ERR_VALUE,
                                     "input '%s' is not a graph input, an initializer or "
                                     "the output of any node (dangling value)",
                                     g->values[v].name);
        }
        if (op->init && (st = op->init(n)))
            return st;
    }
    for (int i = 0; i < g->n_outputs; i++) {
        const ai_value *v = &g->values[g->outputs[i]];
        if (v->kind == AI_VAL_ACT && v->producer < 0)
            return ai_error(AI_ERR_VALUE, "graph output '%s' is never produced", v->name);
    }
    /* Kahn's algorithm over node dependencies */
    int *indeg = calloc((size_t)g->n_nodes + 1, sizeof(int));
    int *order = malloc(sizeof(int) * ((size_t)g->n_nodes + 1));
    if (!indeg || !order) {
        free(indeg);
        free(order);
        return ai_error(AI_ERR_NOMEM, "out of memory ordering the graph");
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int v = g->nodes[i].in[k];
            if (v >= 0 && g->values[v].producer >= 0)
                indeg[i]++;
        }
    int head = 0, tail = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!indeg[i])
            order[tail++] = i;
    while (head < tail) {
        const ai_node *n = &g->nodes[order[head++]];
        for (int o = 0; o < n->n_out; o++)
            for (int j = 0; j < g->n_nodes; j++)
                for (int k = 0; k < g->nodes[j].n_in; k++)
                    if (g->nodes[j].in[k] == n->out[o] && --indeg[j] == 0)
                        order[tail++] = j;
    }
    if (tail < g->n_nodes) {
        int bad = 0;
        while (bad < g->n_nodes && !indeg[bad])
            bad++;
        free(indeg);
        free(order);
        return ai_node_error(&g->nodes[bad], AI_ERR_VALUE,
                             "is part of a cycle (the graph must be acyclic)");
    }
    free(indeg);
    g->order = order;
    g->finalized = true;
    g->int_values_at_plan = 0;
    return AI_OK;
}

/* ---------------------------------------------------------------- attributes */

const ai_attr *ai_node_attr(const ai_node *n, const char *name)
{
    /* (the first letters compared inline: fused ops read theirs at every
     * forward, and most names differ there) */
    for (int i = 0; i < n->n_attrs; i++)
        if (n->attrs[i].name[0] == name[0] && strcmp(n->attrs[i].name, name) == 0)
            return &n->attrs[i];
    return NULL;
}

static const char *attr_type_name(ai_attr_type t)
{
    static const char *names[] = {"int", "float", "ints", "floats", "string", "tensor",
                                  "graph"};
    return (unsigned)t < 7 ? names[t] : "?";
}

static ai_status attr_typed(const ai_node *n, const char *name, ai_attr_type want,
                            const ai_attr **out)
{
    *out = ai_node_attr(n, name);
    if (*out && (*out)->type != want)
        return ai_node_error(n, AI_ERR_VALUE, "attribute '%s' is a %s; expected a %s",
                             name, attr_type_name((*out)->type), attr_type_name(want));
    return AI_OK;
}

ai_status ai_attr_int(const ai_node *n, const char *name, int64_t dflt, int64_t *out)
{
    const ai_attr *a;
    ai_status st = attr_typed(n, name, AI_ATTR_INT, &a);
    *out = a ? a->i : dflt;
    return st;
}

ai_status ai_attr_int_in(const ai_node *n, const char *name, int64_t dflt, int64_t lo, int64_t hi,
                         int64_t *out)
{
    ai_status st = ai_attr_int(n, name, dflt, out);
    if (!st && (*out < lo || *out > hi))
        st = ai_node_error(n, AI_ERR_VALUE, "%s is %lld; must be in [%lld, %lld]", name,
                           (long long)*out, (long long)lo, (long long)hi);
    return st;
}

ai_status ai_attr_choice(const ai_node *n, const char *name, const char *dflt,
                         const char *const *names, int count, int *out)
{
    const char *s;
    ai_status st = ai_attr_string(n, name, dflt, &s);
    if (st)
        return st;
    char choices[256] = "";
    size_t used = 0;
    for (int k = 0; k < count; k++) {
        if (strcmp(s, names[k]) == 0) {
            *out = k;
            return AI_OK;
        }
        int w = snprintf(choices + used, sizeof choices - used, "%s'%s'", k ? ", " : "", names[k]);
        if (w > 0 && (size_t)w < sizeof choices - used)
            used += (size_t)w;
    }
    return ai_node_error(n, AI_ERR_VALUE, "%s '%s'; one of %s expected", name, s, choices);
}

ai_status ai_attr_float(const ai_node *n, const char *name, double dflt, double *out)
{
    const ai_attr *a = ai_node_attr(n, name);
    if (a && a->type == AI_ATTR_INT) { /* exporters sometimes write 1 for 1.0 */
        *out = (double)a->i;
        return AI_OK;
    }
    ai_status st = attr_typed(n, name, AI_ATTR_FLOAT, &a);
    *out = a ? a->f : dflt;
    return st;
}

ai_status ai_attr_ints(const ai_node *n, const char *name, const int64_t **out, int64_t *len)
{
    const ai_attr *a;
    ai_status st = attr_typed(n, name, AI_ATTR_INTS, &a);
    *out = a ? a->ints : NULL;
    *len = a ? a->n : -1;
    return st;
}

ai_status ai_attr_floats(const ai_node *n, const char *name, const double **out, int64_t *len)
{
    const ai_attr *a;
    ai_status st = attr_typed(n, name, AI_ATTR_FLOATS, &a);
    *out = a ? a->floats : NULL;
    *len = a ? a->n : -1;
    return st;
}

ai_status ai_attr_string(const ai_node *n, const char *name, const char *dflt, const char **out)
{
    const ai_attr *a;
    ai_status st = attr_typed(n, name, AI_ATTR_STRING, &a);
    *out = a ? a->s : dflt;
    return st;
}

ai_status ai_norm_axis(const ai_node *n, int64_t axis, int rank, int *out)
{
    if (axis < -rank || axis >= (rank > 0 ? rank : 1))
        return ai_node_error(n, AI_ERR_VALUE, "axis %lld is out of range for rank %d",
                             (long long)axis, rank);
    *out = (int)(axis < 0 ? axis + rank : axis);
    return AI_OK;
}

/* ---------------------------------------------------------------- saved tensors */

ai_status ai_graph_save(ai_graph *g, const ai_tensor *t)
{
    ai_status st = grow((void **)&g->saved, &g->cap_saved, g->n_saved + 1, sizeof(ai_tensor *));
    if (st || (st = ai_tensor_share(&g->saved[g->n_saved], t)))
        return st;
    g->n_saved++;
    return AI_OK;
}

void ai_graph_saved_clear(ai_graph *g)
{
    for (int i = 0; i < g->n_saved; i++)
        ai_tensor_free(g->saved[i]);
    g->n_saved = 0;
}

/* ---------------------------------------------------------------- editing */

void ai_graph_unfinalize(ai_graph *g)
{
    ai_packed_clear(g); /* (an edit may renumber or replace the values) */
    ai_plan_free(g->plan);
    g->plan = NULL;
    free(g->order);
    g->order = NULL;
    for (int i = 0; i < g->n_nodes; i++) {
        free(g->nodes[i].params);
        g->nodes[i].params = NULL;
        g->nodes[i].op = NULL;
    }
    g->finalized = false;
}

ai_status ai_graph_new_value(ai_graph *g, const char *base, int *out)
{
    char buf[600];
    snprintf(buf, sizeof buf, "%s", base);
    for (int k = 1; ai_graph_find_value(g, buf) >= 0; k++)
        snprintf(buf, sizeof buf, "%s:%d", base, k);
    return value_get(g, buf, out);
}

void ai_graph_move_node(ai_graph *g, int from, int to)
{
    if (from == to)
        return;
    ai_node moved = g->nodes[from];
    if (from < to)
        memmove(&g->nodes[from], &g->nodes[from + 1], sizeof(ai_node) * (size_t)(to - from));
    else
        memmove(&g->nodes[to + 1], &g->nodes[to], sizeof(ai_node) * (size_t)(from - to));
    g->nodes[to] = moved;
    int lo = from < to ? from : to, hi = from < to ? to : from;
    for (int i = lo; i <= hi; i++)
        for (int k = 0; k < g->nodes[i].n_out; k++)
            g->values[g->nodes[i].out[k]].producer = i;
}

ai_status ai_graph_compact(ai_graph *g, const bool *remove)
{
    if (g->finalized)
        return ai_error(AI_ERR_VALUE, "compact: unfinalize the graph first");
    int kept = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (remove && remove[i]) {
            for (int k = 0; k < g->nodes[i].n_out; k++)
                if (g->values[g->nodes[i].out[k]].producer == i)
                    g->values[g->nodes[i].out[k]].producer = -1;
            node_clear(&g->nodes[i]);
            continue;
        }
        g->nodes[kept] = g->nodes[i];
        for (int k = 0; k < g->nodes[kept].n_out; k++)
            g->values[g->nodes[kept].out[k]].producer = kept;
        kept++;
    }
    g->n_nodes = kept;
    /* values nothing refers to any more */
    int *remap = calloc((size_t)g->n_values + 1, sizeof(int));
    if (!remap)
        return ai_error(AI_ERR_NOMEM, "out of memory compacting the graph");
    for (int i = 0; i < g->n_nodes; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0)
                remap[g->nodes[i].in[k]] = 1;
        for (int k = 0; k < g->nodes[i].n_out; k++)
            remap[g->nodes[i].out[k]] = 1;
    }
    for (int i = 0; i < g->n_inputs; i++)
        remap[g->inputs[i]] = 1;
    for (int i = 0; i < g->n_outputs; i++)
        remap[g->outputs[i]] = 1;
    int nv = 0;
    for (int v = 0; v < g->n_values; v++) {
        if (!remap[v]) {
            value_clear(&g->values[v]);
            remap[v] = -1;
            continue;
        }
        g->values[nv] = g->values[v];
        remap[v] = nv++;
    }
    g->n_values = nv;
    for (int i = 0; i < g->n_nodes; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0)
                g->nodes[i].in[k] = remap[g->nodes[i].in[k]];
        for (int k = 0; k < g->nodes[i].n_out; k++)
            g->nodes[i].out[k] = remap[g->nodes[i].out[k]];
    }
    for (int i = 0; i < g->n_inputs; i++)
        g->inputs[i] = remap[g->inputs[i]];
    for (int i = 0; i < g->n_outputs; i++)
        g->outputs[i] = remap[g->outputs[i]];
    free(remap);
    return AI_OK;
}

ai_status ai_node_set_attr(ai_node *n, const ai_attr *a)
{
    ai_attr copy;
    ai_status st = attr_copy(&copy, a);
    if (st) {
        attr_clear(&copy);
        return st;
    }
    for (int i = 0; i < n->n_attrs; i++) {
        if (strcmp(n->attrs[i].name, a->name) == 0) {
            attr_clear(&n->attrs[i]);
            n->attrs[i] = copy;
            return AI_OK;
        }
    }
    ai_attr *p = realloc(n->attrs, sizeof(ai_attr) * (size_t)(n->n_attrs + 1));
    if (!p) {
        attr_clear(&copy);
        return ai_error(AI_ERR_NOMEM, "out of memory for an attribute");
    }
    n->attrs = p;
    n->attrs[n->n_attrs++] = copy;
    return AI_OK;
}

void ai_node_remove_attr(ai_node *n, const char *name)
{
    for (int i = 0; i < n->n_attrs; i++) {
        if (strcmp(n->attrs[i].name, name) == 0) {
            attr_clear(&n->attrs[i]);
            n->attrs[i] = n->attrs[--n->n_attrs];
            return;
        }
    }
}

ai_status ai_node_set_op(ai_node *n, const char *domain, const char *op_type)
{
    char *d = dupstr(domain), *t = dupstr(op_type);
    if (!d || !t) {
        free(d);
        free(t);
        return ai_error(AI_ERR_NOMEM, "out of memory renaming a node's operator");
    }
    free(n->domain);
    free(n->op_type);
    n->domain = d;
    n->op_type = t;
    return AI_OK;
}
