/*
 * recipes.c — graph rewrites: fold BatchNorm into Conv/Gemm, drop Flatten
 * before Gemm, fuse Conv/Gemm with their activation, undo those fusions,
 * fold constant subgraphs, run conv chains in blocked channels, read a
 * Linear's weight in place and add its bias in its product. See graph.h
 * for the list and ops/fused.c for the fused operators.
 *
 * Every recipe first decides, node by node, what it can rewrite (reasons
 * for what it cannot go to report->skipped), then edits: the graph is
 * unfinalized, nodes are rewired in place (a fused node takes over the
 * output value of the node it absorbs, so value names downstream and the
 * graph outputs are kept), absorbed nodes and the values nothing uses any
 * more are removed, and the graph is finalized again. The node array stays
 * in topological order (new nodes are inserted next to the node they come
 * from). Arithmetic on weights is done in double and written back to the
 * engine's parameter storage in place.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "kernels/conv.h"
#include "plan.h"

#define FUSED_DOMAIN "aidge_interop"

/* ---------------------------------------------------------------- report */

static char *format(const char *fmt, va_list ap)
{
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf) + 1;
    char *s = malloc(n);
    if (s)
        memcpy(s, buf, n);
    return s;
}

static ai_status report(ai_recipe_report *r, bool done, const char *node, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static ai_status report(ai_recipe_report *r, bool done, const char *node, const char *fmt, ...)
{
    ai_recipe_entry **list = done ? &r->done : &r->skipped;
    int *n = done ? &r->n_done : &r->n_skipped, *cap = done ? &r->cap_done : &r->cap_skipped;
    if (*n == *cap) {
        int ncap = *cap ? 2 * *cap : 8;
        ai_recipe_entry *p = realloc(*list, sizeof **list * (size_t)ncap);
        if (!p)
            return ai_error(AI_ERR_NOMEM, "out of memory for a recipe report");
        *list = p;
        *cap = ncap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *text = format(fmt, ap);
    va_end(ap);
    size_t len = strlen(node) + 1;
    char *name = malloc(len);
    if (!text || !name) {
        free(text);
        free(name);
        return ai_error(AI_ERR_NOMEM, "out of memory for a recipe report");
    }
    memcpy(name, node, len);
    (*list)[(*n)++] = (ai_recipe_entry){name, text};
    return AI_OK;
}

void ai_recipe_report_free(ai_recipe_report *r)
{
    for (int i = 0; i < r->n_done; i++) {
        free(r->done[i].node);
        free(r->done[i].text);
    }
    for (int i = 0; i < r->n_skipped; i++) {
        free(r->skipped[i].node);
        free(r->skipped[i].text);
    }
    free(r->done);
    free(r->skipped);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- helpers */

static bool is_op(const ai_node *n, const char *domain, const char *op_type)
{
    const char *d = strcmp(n->domain, "ai.onnx") == 0 ? "" : n->domain;
    return strcmp(d, domain) == 0 && strcmp(n->op_type, op_type) == 0;
}

enum { BASE_NONE, BASE_CONV, BASE_GEMM };

/* Conv or Gemm, plain or fused; *activation says whether a fused one
 * already ends with an activation. */
static int base_kind(const ai_node *n, bool *activation)
{
    const char *act = "";
    *activation = false;
    if (is_op(n, "", "Conv"))
        return BASE_CONV;
    if (is_op(n, "", "Gemm"))
        return BASE_GEMM;
    bool conv = is_op(n, FUSED_DOMAIN, "FusedConv"), gemm = is_op(n, FUSED_DOMAIN, "FusedGemm");
    if (!conv && !gemm)
        return BASE_NONE;
    const ai_attr *a = ai_node_attr(n, "activation");
    if (a && a->type == AI_ATTR_STRING && a->s)
        act = a->s;
    *activation = act[0] != 0;
    return conv ? BASE_CONV : BASE_GEMM;
}

/* How many node inputs read value v; *is_output when it is a graph output. */
static int uses(const ai_graph *g, int v, bool *is_output)
{
    int count = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            count += g->nodes[i].in[k] == v;
    *is_output = false;
    for (int i = 0; i < g->n_outputs; i++)
        *is_output |= g->outputs[i] == v;
    return count;
}

static bool has_data(const ai_graph *g, int v)
{
    return v >= 0 && g->values[v].kind != AI_VAL_INPUT && g->values[v].kind != AI_VAL_ACT &&
           g->values[v].data;
}

static bool is_constant(const ai_graph *g, int v)
{
    return v >= 0 && g->values[v].kind == AI_VAL_CONST && g->values[v].data;
}

/* Element i of a contiguous float tensor (any float dtype) set to v. */
static void set_flat(ai_tensor *t, int64_t i, double v)
{
    if (t->dtype == AI_F32)
        ((float *)t->data)[i] = (float)v;
    else if (t->dtype == AI_F64)
        ((double *)t->data)[i] = v;
    else /* float16, bfloat16 */
        ((uint16_t *)t->data)[i] = t->dtype == AI_BF16 ? ai_f32_to_bf16((float)v)
                                                       : ai_f32_to_f16((float)v);
}

/* Unfinalizes, for edits that add nodes or values (the plan's shapes are
 * gone from then on). */
static void begin_edit(ai_graph *g, bool *editing)
{
    if (!*editing)
        ai_graph_unfinalize(g);
    *editing = true;
}

/* Unfinalizes (when begin_edit did not), removes the flagged nodes and what
 * nothing uses any more, and finalizes again. */
static ai_status end_edit(ai_graph *g, bool editing, const bool *remove)
{
    if (!editing)
        return AI_OK;
    if (g->finalized)
        ai_graph_unfinalize(g);
    ai_status st = ai_graph_compact(g, remove);
    return st ? st : ai_graph_finalize(g);
}

static ai_status check_finalized(const ai_graph *g, const char *recipe)
{
    if (!g->finalized)
        return ai_error(AI_ERR_VALUE, "%s: the graph is not finalized", recipe);
    return AI_OK;
}

/* Checks the graph; *remove: one flag per node (removed at end_edit). */
static ai_status start(const ai_graph *g, const char *recipe, bool **remove)
{
    ai_status st = check_finalized(g, recipe);
    if (st)
        return st;
    if (!(*remove = calloc((size_t)g->n_nodes + 1, sizeof(bool))))
        return ai_error(AI_ERR_NOMEM, "out of memory");
    return AI_OK;
}

/* Makes node p write value v (the output of a node it absorbs). */
static void take_output(ai_graph *g, int p, int v)
{
    g->values[g->nodes[p].out[0]].producer = -1;
    g->nodes[p].out[0] = v;
    g->values[v].producer = p;
    g->values[v].producer_slot = 0;
}

static ai_status set_string(ai_node *n, const char *name, const char *s)
{
    ai_attr a = {.name = (char *)name, .type = AI_ATTR_STRING, .s = (char *)s};
    return ai_node_set_attr(n, &a);
}

static ai_status set_number(ai_node *n, const char *name, ai_attr_type type, double v)
{
    ai_attr a = {.name = (char *)name, .type = type, .i = (int64_t)v, .f = v};
    return ai_node_set_attr(n, &a);
}

/* ---------------------------------------------------------------- fuse_batchnorm */

/* Why BatchNormalization node i cannot be folded into its producer (NULL
 * if it can); *p is the producer. */
static const char *bn_obstacle(const ai_graph *g, int i, int *p, int64_t *channels,
                               bool rewrites_weights)
{
    const ai_node *bn = &g->nodes[i];
    bool act, out;
    int64_t training_mode = 0;
    *p = g->values[bn->in[0]].producer;
    if (*p < 0)
        return "its input is not computed by a node";
    const ai_node *n = &g->nodes[*p];
    int kind = base_kind(n, &act);
    if (kind == BASE_NONE)
        return "it does not follow a Conv or Gemm";
    if (act)
        return "the node before it ends with an activation";
    if (uses(g, bn->in[0], &out) != 1 || out)
        return "the output of the node before it is also read elsewhere";
    for (int k = 1; k < bn->n_out; k++)
        if (uses(g, bn->out[k], &out) || out)
            return "its running-statistics outputs are used";
    ai_attr_int(bn, "training_mode", 0, &training_mode);
    if (training_mode)
        return "training_mode=1: it normalises with batch statistics";
    const int w = n->in[1];
    if (!has_data(g, w) || !ai_dtype_is_float(g->values[w].data->dtype))
        return "the weight is not a float initializer";
    if (rewrites_weights && (uses(g, w, &out) != 1 || out))
        return "the weight is shared with other nodes";
    const ai_tensor *W = g->values[w].data;
    if (kind == BASE_CONV) {
        *channels = W->ndim >= 1 ? W->shape[0] : 0;
    } else {
        int64_t tb = 0;
        ai_attr_int(n, "transB", 0, &tb);
        if (W->ndim != 2)
            return "the Gemm's B is not 2-D";
        *channels = W->shape[tb ? 0 : 1];
    }
    for (int k = 1; k <= 4; k++) {
        int v = bn->in[k];
        if (v < 0)
            return "it lacks an input";
        if (!rewrites_weights && !has_data(g, v)) /* computed: read at each forward */
            continue;
        if (!has_data(g, v) || !ai_dtype_is_float(g->values[v].data->dtype))
            return "its scale, bias, mean and variance are not all float initializers";
        if (ai_tensor_numel(g->values[v].data) != *channels)
            return "its statistics do not have one value per output channel";
    }
    if (*channels < 1)
        return "the weight has no output channels";
    if (n->n_in > 2 && n->in[2] >= 0) {
        int b = n->in[2];
        const ai_tensor *B = has_data(g, b) ? g->values[b].data : NULL;
        if (!B || !ai_dtype_is_float(B->dtype))
            return "the bias is not a float initializer";
        if (rewrites_weights && (uses(g, b, &out) != 1 || out))
            return "the bias is shared with other nodes";
        int64_t nb = ai_tensor_numel(B);
        if (nb != *channels && !(kind == BASE_GEMM && nb == 1))
            return "the bias does not have one value per output channel";
        if (kind == BASE_GEMM && B->ndim == 2 && B->shape[0] != 1)
            return "the Gemm's C has one row per sample";
    }
    return NULL;
}

/* A new float initializer "<weight stem>.bias" of `channels` values for node p. */
static ai_status new_bias(ai_graph *g, int p, int64_t channels, int *out)
{
    const ai_value *w = &g->values[g->nodes[p].in[1]];
    char stem[520], name[600];
    snprintf(stem, sizeof stem, "%s", w->name);
    size_t len = strlen(stem);
    if (len > 7 && strcmp(stem + len - 7, ".weight") == 0)
        stem[len - 7] = 0;
    snprintf(name, sizeof name, "%s.bias", stem);
    for (int k = 1; ai_graph_find_value(g, name) >= 0; k++)
        snprintf(name, sizeof name, "%s.bias:%d", stem, k);
    ai_tensor *t;
    ai_status st = ai_tensor_new(&t, w->data->dtype, 1, &channels);
    if (st || (st = ai_graph_add_initializer(g, name, w->kind, t)))
        return st;
    *out = ai_graph_find_value(g, name);
    return AI_OK;
}

static ai_status fold_bn(ai_graph *g, int i, int p, int64_t C)
{
    ai_node *bn = &g->nodes[i];
    double eps = 1e-5, alpha = 1.0, beta = 1.0;
    int64_t tb = 0;
    ai_attr_float(bn, "epsilon", 1e-5, &eps);
    bool act;
    const bool gemm = base_kind(&g->nodes[p], &act) == BASE_GEMM;
    if (gemm) {
        ai_attr_float(&g->nodes[p], "alpha", 1.0, &alpha);
        ai_attr_float(&g->nodes[p], "beta", 1.0, &beta);
        ai_attr_int(&g->nodes[p], "transB", 0, &tb);
    }
    const ai_tensor *scale = g->values[bn->in[1]].data, *shift = g->values[bn->in[2]].data;
    const ai_tensor *mean = g->values[bn->in[3]].data, *var = g->values[bn->in[4]].data;
    double *s = malloc(sizeof(double) * (size_t)(C ? C : 1));
    if (!s)
        return ai_error(AI_ERR_NOMEM, "out of memory folding a BatchNormalization");
    for (int64_t c = 0; c < C; c++)
        s[c] = ai_tensor_get_flat(scale, c) / sqrt(ai_tensor_get_flat(var, c) + eps);
    /* weight: output channel c scaled by s[c] */
    ai_tensor *W = g->values[g->nodes[p].in[1]].data;
    const int64_t nw = ai_tensor_numel(W);
    for (int64_t k = 0; k < nw; k++) {
        int64_t c = gemm && !tb ? k % C : k / (nw / C);
        set_flat(W, k, ai_tensor_get_flat(W, k) * s[c]);
    }
    /* bias: (beta * b - mean) * s + shift, a new (C,) value when there is none
     * or when Gemm's C is one broadcast scalar */
    ai_node *n = &g->nodes[p];
    int b = n->n_in > 2 ? n->in[2] : -1;
    double scalar = 0;
    ai_status st = AI_OK;
    if (b >= 0 && ai_tensor_numel(g->values[b].data) == 1 && C != 1) {
        scalar = ai_tensor_get_flat(g->values[b].data, 0);
        b = -2; /* replaced below */
    }
    if (b < 0) {
        int nb;
        if ((st = new_bias(g, p, C, &nb)))
            goto done;
        n = &g->nodes[p];
        ai_tensor *B = g->values[nb].data;
        for (int64_t c = 0; c < C; c++)
            set_flat(B, c, b == -2 ? scalar : 0.0);
        n->in[2] = nb;
        n->n_in = 3;
        b = nb;
    }
    ai_tensor *B = g->values[b].data;
    for (int64_t c = 0; c < C; c++)
        set_flat(B, c, (beta * ai_tensor_get_flat(B, c) - ai_tensor_get_flat(mean, c)) * s[c] +
                           ai_tensor_get_flat(shift, c));
    if (gemm && beta != 1.0)
        st = set_number(n, "beta", AI_ATTR_FLOAT, 1.0);
    (void)alpha; /* op(A) @ op(B) keeps its alpha: the scale went into B */
    take_output(g, p, g->nodes[i].out[0]);
done:
    free(s);
    return st;
}

/* ---------------------------------------------------------------- batchnorm_epilogue */

/* BatchNormalization node i becomes the epilogue of its producer p:
 * FusedConv/FusedGemm with the BatchNorm's inputs 1..4 as inputs 3..6. */
static ai_status absorb_bn(ai_graph *g, int i, int p)
{
    char bn_name[512], bn_in[512];
    const ai_node *bn = &g->nodes[i];
    double eps = 1e-5;
    ai_attr_float(bn, "epsilon", 1e-5, &eps);
    snprintf(bn_name, sizeof bn_name, "%s", bn->name);
    snprintf(bn_in, sizeof bn_in, "%s", g->values[bn->in[0]].name);
    ai_node *n = &g->nodes[p];
    bool act;
    ai_status st = AI_OK;
    if (is_op(n, "", "Conv") || is_op(n, "", "Gemm"))
        st = ai_node_set_op(n, FUSED_DOMAIN,
                            base_kind(n, &act) == BASE_CONV ? "FusedConv" : "FusedGemm");
    if (st || (st = set_number(n, "bn_epsilon", AI_ATTR_FLOAT, eps)) ||
        (st = set_string(n, "bn_node", bn_name)) || (st = set_string(n, "bn_input", bn_in)))
        return st;
    while (n->n_in < 3)
        n->in[n->n_in++] = -1;
    for (int k = 1; k <= 4; k++)
        n->in[2 + k] = bn->in[k];
    n->n_in = 7;
    take_output(g, p, bn->out[0]);
    return AI_OK;
}

/* fuse_batchnorm (fold: the weights rescaled) and batchnorm_epilogue (the
 * BatchNorm moved into its producer): the same candidates, the same walk. */
static ai_status batchnorm_recipe(ai_graph *g, ai_recipe_report *r, bool fold)
{
    const char *name = fold ? "fuse_batchnorm" : "batchnorm_epilogue";
    if (g->training)
        return ai_error(AI_ERR_VALUE,
                        "%s: the graph is in training mode, where BatchNormalization "
                        "normalises with batch statistics%s; set training = False (eval) "
                        "first", name, fold ? " and cannot be folded" : "");
    bool *remove, editing = false;
    ai_status st = start(g, name, &remove);
    if (st)
        return st;
    for (int i = 0; i < g->n_nodes && !st; i++) {
        if (!is_op(&g->nodes[i], "", "BatchNormalization"))
            continue;
        int p;
        int64_t C = 0;
        const char *why = bn_obstacle(g, i, &p, &C, fold);
        if (why) {
            st = report(r, false, g->nodes[i].name, "BatchNormalization '%s' %s: %s",
                        g->nodes[i].name, fold ? "not folded" : "kept", why);
            continue;
        }
        begin_edit(g, &editing);
        if ((st = fold ? fold_bn(g, i, p, C) : absorb_bn(g, i, p)))
            break;
        remove[i] = true;
        const ai_node *n = &g->nodes[p];
        if (fold)
            st = report(r, true, n->name, "BatchNormalization '%s' folded into %s '%s' (weight "
                        "'%s' and bias '%s' rescaled)", g->nodes[i].name, n->op_type, n->name,
                        g->values[n->in[1]].name, g->values[n->in[2]].name);
        else
            st = report(r, true, n->name, "BatchNormalization '%s' applied by %s '%s' to its "
                        "output (weights unchanged)", g->nodes[i].name, n->op_type, n->name);
    }
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}

ai_status ai_recipe_fuse_batchnorm(ai_graph *g, ai_recipe_report *r)
{
    return batchnorm_recipe(g, r, true);
}

ai_status ai_recipe_batchnorm_epilogue(ai_graph *g, ai_recipe_report *r)
{
    return batchnorm_recipe(g, r, false);
}

/* ---------------------------------------------------------------- remove_flatten */

/* Flatten axis equivalent to Flatten/Reshape node f, or a reason. */
static const char *flatten_axis_of(const ai_graph *g, const ai_node *f, int64_t *axis)
{
    ai_meta m;
    bool known = ai_graph_value_meta(g, f->in[0], &m);
    if (is_op(f, "", "Flatten")) {
        ai_attr_int(f, "axis", 1, axis);
        if (*axis < 0 && !known)
            return "its axis is negative and the input's rank is unknown (run a forward first)";
        if (*axis < 0)
            *axis += m.ndim;
        return *axis < 0 ? "its axis is out of range" : NULL;
    }
    int sv = f->n_in > 1 ? f->in[1] : -1;
    if (!is_constant(g, sv))
        return "its target shape is computed, not a constant (run constant_fold first)";
    const ai_tensor *s = g->values[sv].data;
    int64_t allowzero = 0;
    ai_attr_int(f, "allowzero", 0, &allowzero);
    if (ai_tensor_numel(s) != 2)
        return "its target shape is not 2-D";
    if (!known)
        return "the input's shape is unknown (run a forward first)";
    const int64_t s0 = ai_tensor_get_flat_i64(s, 0), s1 = ai_tensor_get_flat_i64(s, 1);
    for (int k = 1; k <= m.ndim; k++) {
        int64_t tail = 1;
        for (int d = k; d < m.ndim; d++)
            tail *= m.shape[d];
        /* the batch dimension must be inferred (-1) or copied (0), never written */
        bool lead = s0 == -1 || (s0 == 0 && !allowzero && k == 1);
        bool cols = s1 == tail || (s1 == -1 && s0 == 0 && !allowzero && k == 1);
        if (lead && cols) {
            *axis = k;
            return NULL;
        }
    }
    return "its target shape is not a flatten that keeps the batch dimension free (-1 or 0 first)";
}

ai_status ai_recipe_remove_flatten(ai_graph *g, ai_recipe_report *r)
{
    bool *remove, editing = false;
    ai_status st = start(g, "remove_flatten", &remove);
    if (st)
        return st;
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const ai_node *f = &g->nodes[i];
        if (!is_op(f, "", "Flatten") && !is_op(f, "", "Reshape"))
            continue;
        const int v = f->out[0];
        bool out, gemms = true, act;
        int n_uses = uses(g, v, &out);
        for (int j = 0; j < g->n_nodes; j++)
            for (int k = 0; k < g->nodes[j].n_in; k++)
                if (g->nodes[j].in[k] == v)
                    gemms &= k == 0 && base_kind(&g->nodes[j], &act) == BASE_GEMM &&
                             !ai_node_attr(&g->nodes[j], "flatten_axis");
        int64_t axis = 1;
        const char *why = out ? "its output is a graph output"
                        : !n_uses || !gemms ? "it does not feed only Gemm nodes (as A)"
                                            : flatten_axis_of(g, f, &axis);
        if (why) {
            st = report(r, false, f->name, "%s '%s' kept: %s", f->op_type, f->name, why);
            continue;
        }
        editing = true; /* unfinalized at the end: Reshapes read the planned shapes */
        for (int j = 0; j < g->n_nodes && !st; j++) {
            ai_node *n = &g->nodes[j];
            if (n->n_in < 1 || n->in[0] != v)
                continue;
            n->in[0] = g->nodes[i].in[0];
            if ((st = ai_node_set_op(n, FUSED_DOMAIN, "FusedGemm")) ||
                (st = set_number(n, "flatten_axis", AI_ATTR_INT, (double)axis)) ||
                (st = set_string(n, "flatten_node", g->nodes[i].name)) ||
                (st = set_string(n, "flatten_output", g->values[v].name)) ||
                (st = report(r, true, n->name, "%s '%s' removed: Gemm '%s' reads its input "
                             "flattened at axis %lld (FusedGemm)", g->nodes[i].op_type,
                             g->nodes[i].name, n->name, (long long)axis)))
                break;
        }
        remove[i] = true;
    }
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}

/* ---------------------------------------------------------------- fuse_activation */

/* Clip bounds from attributes (opset < 11) or constant inputs; false when
 * a bound is computed. */
static bool clip_bounds(const ai_graph *g, const ai_node *n, double *lo, double *hi)
{
    *lo = -INFINITY;
    *hi = INFINITY;
    if (n->opset < 11) {
        ai_attr_float(n, "min", -INFINITY, lo);
        ai_attr_float(n, "max", INFINITY, hi);
        return true;
    }
    for (int k = 1; k <= 2 && k < n->n_in; k++) {
        int v = n->in[k];
        if (v < 0)
            continue;
        if (!is_constant(g, v) || ai_tensor_numel(g->values[v].data) != 1)
            return false;
        *(k == 1 ? lo : hi) = ai_tensor_get_flat(g->values[v].data, 0);
    }
    return true;
}

ai_status ai_recipe_fuse_activation(ai_graph *g, ai_recipe_report *r)
{
    bool *remove, editing = false;
    ai_status st = start(g, "fuse_activation", &remove);
    if (st)
        return st;
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const ai_node *a = &g->nodes[i];
        bool relu = is_op(a, "", "Relu"), clip = is_op(a, "", "Clip"), out, act;
        if ((!relu && !clip) || a->in[0] < 0)
            continue;
        const int x = a->in[0], p = g->values[x].producer;
        int kind = p >= 0 ? base_kind(&g->nodes[p], &act) : BASE_NONE;
        if (kind == BASE_NONE)
            continue; /* not a candidate: nothing to report */
        double lo = 0, hi = 0;
        const char *why = act ? "the node before it already ends with an activation"
                        : uses(g, x, &out) != 1 || out ? "its input is also read elsewhere"
                        : clip && !clip_bounds(g, a, &lo, &hi) ? "its bounds are not constants"
                                                               : NULL;
        if (why) {
            st = report(r, false, a->name, "%s '%s' not fused: %s", a->op_type, a->name, why);
            continue;
        }
        editing = true;
        ai_node *n = &g->nodes[p];
        double bounds[2] = {lo, hi};
        ai_attr params = {.name = "activation_params", .type = AI_ATTR_FLOATS, .n = 2,
                          .floats = bounds};
        char *old_type = n->op_type;
        if ((st = report(r, true, n->name, "%s '%s' + %s '%s' -> %s '%s'", old_type, n->name,
                         g->nodes[i].op_type, g->nodes[i].name,
                         kind == BASE_CONV ? "FusedConv" : "FusedGemm", n->name)) ||
            (st = ai_node_set_op(n, FUSED_DOMAIN, kind == BASE_CONV ? "FusedConv" : "FusedGemm")) ||
            (st = set_string(n, "activation", relu ? "Relu" : "Clip")) ||
            (clip && (st = ai_node_set_attr(n, &params))) ||
            (st = set_string(n, "activation_node", g->nodes[i].name)) ||
            (st = set_string(n, "activation_input", g->values[x].name)))
            break;
        take_output(g, p, g->nodes[i].out[0]);
        remove[i] = true;
    }
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}

/* ---------------------------------------------------------------- fuse_pad */

/* The spatial pads of Pad node f, zero padding of a rank-`nd` tensor
 * (before[d], after[d] for each axis), or why it is not one a Conv can
 * take: constant mode, value +0, constant pads, nothing on the batch and
 * channel axes, nothing cropped. */
static const char *zero_pad_of(const ai_graph *g, const ai_node *f, int nd, int64_t *before,
                               int64_t *after)
{
    const char *mode = "constant";
    const ai_attr *m = ai_node_attr(f, "mode");
    if (m && m->type == AI_ATTR_STRING && m->s)
        mode = m->s;
    if (strcmp(mode, "constant") != 0)
        return "its mode is not 'constant'";
    int64_t pads[2 * AI_MAX_DIMS], axes[AI_MAX_DIMS];
    int64_t np = 0, na = -1;
    double value = 0;
    if (f->opset < 11) {
        const ai_attr *a = ai_node_attr(f, "pads"), *v = ai_node_attr(f, "value");
        if (!a || a->type != AI_ATTR_INTS || a->n > 2 * AI_MAX_DIMS)
            return "its pads attribute is missing or malformed";
        np = a->n;
        memcpy(pads, a->ints, sizeof(int64_t) * (size_t)np);
        value = v ? (v->type == AI_ATTR_FLOAT ? v->f : (double)v->i) : 0;
    } else {
        const int pv = f->n_in > 1 ? f->in[1] : -1, vv = f->n_in > 2 ? f->in[2] : -1;
        const int av = f->n_in > 3 ? f->in[3] : -1;
        if (!is_constant(g, pv) || (av >= 0 && !is_constant(g, av)))
            return "its pads or axes are computed, not constants (run constant_fold first)";
        if (vv >= 0 && (!has_data(g, vv) || ai_tensor_numel(g->values[vv].data) != 1))
            return "its constant value is computed, not a constant";
        np = ai_tensor_numel(g->values[pv].data);
        if (np > 2 * AI_MAX_DIMS)
            return "it has more pads than the engine has dimensions";
        for (int64_t i = 0; i < np; i++)
            pads[i] = ai_tensor_get_flat_i64(g->values[pv].data, i);
        if (av >= 0) {
            na = ai_tensor_numel(g->values[av].data);
            if (na > AI_MAX_DIMS)
                return "it has more axes than the engine has dimensions";
            for (int64_t i = 0; i < na; i++)
                axes[i] = ai_tensor_get_flat_i64(g->values[av].data, i);
        }
        value = vv >= 0 ? ai_tensor_get_flat(g->values[vv].data, 0) : 0;
    }
    if (value != 0 || signbit(value))
        return "it pads with a value other than +0";
    if (na < 0) {
        na = nd;
        for (int i = 0; i < nd; i++)
            axes[i] = i;
    }
    if (np != 2 * na)
        return "its pads do not match the conv input's rank";
    bool seen[AI_MAX_DIMS] = {false};
    for (int d = 0; d < nd; d++)
        before[d] = after[d] = 0;
    for (int64_t i = 0; i < na; i++) {
        const int64_t a = axes[i] < 0 ? axes[i] + nd : axes[i];
        if (a < 0 || a >= nd || seen[a])
            return "an axis is out of range or repeated";
        seen[a] = true;
        before[a] = pads[i];
        after[a] = pads[na + i];
    }
    for (int d = 0; d < nd; d++) {
        if (d < 2 && (before[d] || after[d]))
            return "it pads the batch or channel axis";
        if (before[d] < 0 || after[d] < 0)
            return "it crops (negative pads)";
    }
    return NULL;
}

/* Why conv node n cannot take input 0's padding in its pads (NULL when it
 * can); *nd: its input's rank (its weight's). */
static const char *pad_taker_obstacle(const ai_graph *g, const ai_node *n, int k, int *nd)
{
    bool act;
    if (base_kind(n, &act) != BASE_CONV || k != 0)
        return "it is read by a node other than a Conv (as its input)";
    if (ai_node_attr(n, "x_blocked"))
        return "a Conv reading it reads blocked channels";
    const ai_attr *ap = ai_node_attr(n, "auto_pad");
    if (ap && ap->type == AI_ATTR_STRING && ap->s && strcmp(ap->s, "NOTSET") != 0)
        return "a Conv reading it sets auto_pad";
    if (n->n_in < 2 || !has_data(g, n->in[1]))
        return "a Conv reading it has no weight of known shape";
    *nd = g->values[n->in[1]].data->ndim;
    const ai_attr *pads = ai_node_attr(n, "pads");
    if (*nd < 3 || (pads && (pads->type != AI_ATTR_INTS || pads->n != 2 * (*nd - 2))))
        return "a Conv reading it has pads that do not match its rank";
    return NULL;
}

ai_status ai_recipe_fuse_pad(ai_graph *g, ai_recipe_report *r)
{
    bool *remove, editing = false;
    ai_status st = start(g, "fuse_pad", &remove);
    if (st)
        return st;
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const ai_node *f = &g->nodes[i];
        if (!is_op(f, "", "Pad") || f->in[0] < 0)
            continue;
        const int v = f->out[0];
        bool out;
        int n_uses = uses(g, v, &out), nd = -1;
        const char *why = out ? "its output is a graph output"
                                : !n_uses ? "nothing reads its output" : NULL;
        for (int j = 0; j < g->n_nodes && !why; j++)
            for (int k = 0; k < g->nodes[j].n_in && !why; k++) {
                int nd_j = 0;
                if (g->nodes[j].in[k] != v)
                    continue;
                why = pad_taker_obstacle(g, &g->nodes[j], k, &nd_j);
                if (!why && nd >= 0 && nd_j != nd)
                    why = "the Convs reading it have different ranks";
                nd = nd_j;
            }
        int64_t before[AI_MAX_DIMS], after[AI_MAX_DIMS];
        if (!why)
            why = zero_pad_of(g, f, nd, before, after);
        if (why) {
            st = report(r, false, f->name, "Pad '%s' kept: %s", f->name, why);
            continue;
        }
        editing = true;
        for (int j = 0; j < g->n_nodes && !st; j++) {
            ai_node *n = &g->nodes[j];
            if (n->n_in < 1 || n->in[0] != v)
                continue;
            const int nsp = nd - 2;
            const ai_attr *old = ai_node_attr(n, "pads");
            int64_t pads[2 * AI_MAX_DIMS];
            for (int d = 0; d < nsp; d++) {
                pads[d] = (old ? old->ints[d] : 0) + before[2 + d];
                pads[nsp + d] = (old ? old->ints[nsp + d] : 0) + after[2 + d];
            }
            ai_attr a = {.name = "pads", .type = AI_ATTR_INTS, .n = 2 * nsp, .ints = pads};
            n->in[0] = g->nodes[i].in[0];
            if ((st = ai_node_set_attr(n, &a)) ||
                (st = report(r, true, n->name, "Pad '%s' removed: %s '%s' pads its input "
                             "itself", g->nodes[i].name, n->op_type, n->name)))
                break;
        }
        remove[i] = true;
    }
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}

/* ---------------------------------------------------------------- block_channels */

/* Conv node n, plain or fused: whether it may run in blocked channels
 * (NULL) or why not; *M: its output channels. */
static const char *block_obstacle(const ai_graph *g, const ai_node *n, int64_t *M)
{
    bool act;
    if (base_kind(n, &act) != BASE_CONV)
        return "not a Conv";
    const int w = n->in[1];
    const ai_tensor *W = has_data(g, w) ? g->values[w].data : NULL;
    if (!W || W->dtype != AI_F32 || W->ndim != 4)
        return "its weight is not a float32 2-D conv initializer";
    int64_t group = 1, xb = 0;
    ai_attr_int(n, "group", 1, &group);
    ai_attr_int(n, "x_blocked", 0, &xb);
    if (xb || ai_node_attr(n, "y_blocked"))
        return "already in blocked channels";
    const int64_t C = W->shape[1] * group;
    *M = W->shape[0];
    if (!ai_conv_blocked_fast(C, *M, group, W->shape[2] * W->shape[3]))
        return "no blocked kernel for it (groups other than 1 or depthwise, or over 640 taps)";
    return NULL;
}

/* Node n's data inputs (Add: both; Relu: the first) all blocked with
 * `channels` each: it runs on the blocks as they are (Add broadcasts over
 * the batch and the positions only, which the lanes keep). */
static bool elementwise_blocked(const ai_node *n, const int64_t *blocked, int64_t *channels)
{
    const bool add = is_op(n, "", "Add") && n->n_in == 2, relu = is_op(n, "", "Relu");
    if (!add && !relu)
        return false;
    *channels = 0;
    for (int k = 0; k < n->n_in; k++) {
        const int v = n->in[k];
        if (v < 0 || !blocked[v] || (*channels && blocked[v] != *channels))
            return false;
        *channels = blocked[v];
    }
    return *channels > 0;
}

/* Whether node n averages each channel over all its positions: a
 * GlobalAveragePool, or an AveragePool whose window is the planned input's
 * whole plane (no padding, no dilation): it can read blocked channels
 * (BlockedGlobalAveragePool), with no UnblockChannels of its input. */
static bool channel_mean(const ai_graph *g, const ai_node *n)
{
    if (is_op(n, "", "GlobalAveragePool"))
        return n->n_in == 1;
    ai_meta m;
    const int64_t *k, *pads, *dil;
    int64_t nk, np = 0, nd = 0;
    const char *auto_pad = "NOTSET";
    if (!is_op(n, "", "AveragePool") || n->n_in != 1 ||
        !ai_graph_value_meta(g, n->in[0], &m) || m.ndim < 3 ||
        ai_attr_ints(n, "kernel_shape", &k, &nk) || nk != m.ndim - 2 ||
        (ai_node_attr(n, "pads") && ai_attr_ints(n, "pads", &pads, &np)) ||
        (ai_node_attr(n, "dilations") && ai_attr_ints(n, "dilations", &dil, &nd)) ||
        ai_attr_string(n, "auto_pad", "NOTSET", &auto_pad) ||
        (strcmp(auto_pad, "NOTSET") && strcmp(auto_pad, "VALID")))
        return false;
    for (int64_t d = 0; d < nk; d++)
        if (k[d] != m.shape[2 + d])
            return false;
    for (int64_t d = 0; d < np; d++)
        if (pads[d])
            return false;
    for (int64_t d = 0; d < nd; d++)
        if (dil[d] != 1)
            return false;
    return true;
}

/* Why Add node a, blocked, cannot fuse into the conv writing its input s
 * with the other input as the residual (NULL: it can); conv[p]: node p is
 * a conv to be blocked. */
static const char *residual_obstacle(const ai_graph *g, const ai_node *a, int s,
                                     const int64_t *conv)
{
    bool out, act;
    int64_t res = 0;
    const int v = a->in[s], p = v >= 0 ? g->values[v].producer : -1;
    if (p < 0 || !conv[p])
        return "not a conv in blocked channels";
    if (base_kind(&g->nodes[p], &act) != BASE_CONV || act ||
        ai_attr_int(&g->nodes[p], "residual", 0, &res) || res)
        return "the conv already ends with an activation or a residual";
    if (uses(g, v, &out) != 1 || out)
        return "the conv's output is also read elsewhere";
    ai_meta m0, m1;
    if (!ai_graph_value_meta(g, a->in[0], &m0) || !ai_graph_value_meta(g, a->in[1], &m1))
        return "the Add's input shapes are unknown (run a forward first)";
    bool same = m0.ndim == m1.ndim;
    for (int d = 0; same && d < m0.ndim; d++)
        same = m0.shape[d] == m1.shape[d];
    return same ? NULL : "the Add broadcasts";
}

/* Add(conv, R) in blocked channels, and the Relu after it when it is the
 * Add's only reader: the conv (no activation) takes R as a residual (input
 * 7, blocked too) and the Relu as its activation; the Add and the Relu are
 * detached (no inputs, no outputs: removed at the end). When both inputs
 * qualify, the conv that runs last takes the other's output. On the
 * planned graph (the shapes must be equal). */
static ai_status fuse_residuals(ai_graph *g, const int64_t *conv, const int64_t *blocked,
                                ai_recipe_report *r)
{
    ai_status st = AI_OK;
    int *pos = calloc((size_t)g->n_nodes + 1, sizeof(int)); /* place in the order */
    if (!pos)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    for (int oi = 0; oi < g->n_nodes; oi++)
        pos[g->order[oi]] = oi;
    for (int oi = 0; oi < g->n_nodes && !st; oi++) {
        ai_node *a = &g->nodes[g->order[oi]];
        if (!is_op(a, "", "Add") || a->n_in != 2 || a->n_out != 1 || !blocked[a->out[0]])
            continue;
        const char *why[2] = {residual_obstacle(g, a, 0, conv),
                              residual_obstacle(g, a, 1, conv)};
        if (why[0] && why[1]) {
            if (why[0] == why[1])
                st = report(r, false, a->name, "Add '%s' not fused into a conv: %s", a->name,
                            why[0]);
            else
                st = report(r, false, a->name, "Add '%s' not fused into a conv: input 0: %s; "
                            "input 1: %s", a->name, why[0], why[1]);
            continue;
        }
        int s = why[0] ? 1 : 0;
        if (!why[0] && !why[1] &&
            pos[g->values[a->in[1]].producer] > pos[g->values[a->in[0]].producer])
            s = 1;
        const int p = g->values[a->in[s]].producer, rv = a->in[1 - s];
        ai_node *n = &g->nodes[p], *relu = NULL; /* the Relu, the Add's only reader */
        bool out;
        if (uses(g, a->out[0], &out) == 1 && !out)
            for (int k = 0; k < g->n_nodes; k++)
                if (is_op(&g->nodes[k], "", "Relu") && g->nodes[k].in[0] == a->out[0])
                    relu = &g->nodes[k];
        if ((st = report(r, true, n->name, "%s '%s' + Add '%s'%s%s%s -> FusedConv '%s' adding "
                         "'%s' before its activation", n->op_type, n->name, a->name,
                         relu ? " + Relu '" : "", relu ? relu->name : "", relu ? "'" : "",
                         n->name, g->values[rv].name)) ||
            (st = set_number(n, "residual", AI_ATTR_INT, 1)) ||
            (st = set_string(n, "residual_node", a->name)) ||
            (relu && (st = set_string(n, "activation", "Relu"))))
            break;
        for (int k = n->n_in; k < 7; k++)
            n->in[k] = -1; /* absent: the bias, the BatchNorm's inputs */
        n->in[7] = rv;
        n->n_in = 8;
        take_output(g, p, relu ? relu->out[0] : a->out[0]);
        a->n_in = a->n_out = 0;
        if (relu)
            relu->n_in = relu->n_out = 0;
    }
    free(pos);
    return st;
}

ai_status ai_recipe_block_channels(ai_graph *g, ai_recipe_report *r)
{
    ai_status st = check_finalized(g, "block_channels");
    if (st)
        return st;
    /* blocked[v]: channels of value v when it is to be blocked, else 0;
     * conv[i]: node i is a Conv that can be blocked (its channels) */
    int64_t *blocked = calloc((size_t)g->n_values + 1, sizeof(int64_t));
    int64_t *conv = calloc((size_t)g->n_nodes + 1, sizeof(int64_t));
    if (!blocked || !conv) {
        free(blocked);
        free(conv);
        return ai_error(AI_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const ai_node *n = &g->nodes[i];
        bool act;
        if (base_kind(n, &act) != BASE_CONV)
            continue;
        const char *why = block_obstacle(g, n, &conv[i]);
        if (why) {
            conv[i] = 0;
            st = report(r, false, n->name, "%s '%s' not blocked: %s", n->op_type, n->name, why);
        }
    }
    /* a blockable conv runs blocked when it is next to another blocked
     * node: its input comes from a blockable conv, an Add or a Relu, or one
     * of them reads its output (a lone conv would only move its transposes
     * into reorders). Then, in order, an Add/Relu is blocked when its
     * inputs are. */
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const ai_node *n = &g->nodes[i];
        if (!conv[i])
            continue;
        const int x = n->in[0], px = g->values[x].producer;
        bool next = px >= 0 && (conv[px] || is_op(&g->nodes[px], "", "Add") ||
                                is_op(&g->nodes[px], "", "Relu"));
        for (int k = 0; k < g->n_nodes && !next; k++) {
            const ai_node *m = &g->nodes[k];
            const bool elementwise = is_op(m, "", "Add") || is_op(m, "", "Relu");
            for (int s = 0; s < m->n_in && !next; s++)
                next = m->in[s] == n->out[0] && ((conv[k] && s == 0) || elementwise);
        }
        if (next) {
            blocked[n->out[0]] = conv[i];
            continue;
        }
        conv[i] = 0;
        if ((st = report(r, false, n->name, "%s '%s' not blocked: no conv, Add or Relu next "
                         "to it", n->op_type, n->name)))
            break;
    }
    for (int oi = 0; oi < g->n_nodes; oi++) {
        const int i = g->order[oi];
        int64_t ch;
        if (!conv[i] && elementwise_blocked(&g->nodes[i], blocked, &ch))
            blocked[g->nodes[i].out[0]] = ch;
    }
    if (!st)
        st = fuse_residuals(g, conv, blocked, r);
    bool editing = false;
    const int n_values = g->n_values, n_nodes = g->n_nodes;
    int *moved = calloc((size_t)n_values + 1, sizeof(int)); /* v -> its blocked value */
    bool *mean = calloc((size_t)n_nodes + 1, sizeof(bool)); /* channel means of blocked values */
    if (!moved || !mean)
        st = ai_error(AI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_nodes && !st; i++) /* (before the edit: it reads the plan's shapes) */
        mean[i] = g->nodes[i].n_in == 1 && g->nodes[i].in[0] >= 0 &&
                  blocked[g->nodes[i].in[0]] && channel_mean(g, &g->nodes[i]);
    /* each blocked value gets a new blocked twin written by its producer; the
     * nodes that read it blocked read the twin; the others (and the graph's
     * outputs) read the original, written by an UnblockChannels after the
     * producer */
    for (int v = 0; v < n_values && !st; v++) {
        if (!blocked[v])
            continue;
        char name[600];
        snprintf(name, sizeof name, "%s_blocked", g->values[v].name);
        begin_edit(g, &editing);
        int b;
        if ((st = ai_graph_new_value(g, name, &b)))
            break;
        moved[v] = b + 1;
    }
    for (int i = 0; i < n_nodes && !st; i++) {
        ai_node *n = &g->nodes[i];
        const bool is_conv = conv[i] != 0;
        const int x = n->n_in > 0 ? n->in[0] : -1;
        if (mean[i] && moved[x]) {
            /* the mean of each block's lanes, straight into (N, C, 1, 1) */
            const char *drop[] = {"kernel_shape", "strides", "pads", "dilations", "auto_pad",
                                  "ceil_mode", "count_include_pad"};
            if ((st = report(r, true, n->name, "%s '%s' -> BlockedGlobalAveragePool on the "
                             "blocks of '%s'", n->op_type, n->name, g->values[x].name)) ||
                (st = ai_node_set_op(n, FUSED_DOMAIN, "BlockedGlobalAveragePool")))
                break;
            for (size_t k = 0; k < sizeof drop / sizeof drop[0]; k++)
                ai_node_remove_attr(n, drop[k]);
            if ((st = set_number(n, "channels", AI_ATTR_INT, (double)blocked[x])))
                break;
            n->in[0] = moved[x] - 1;
            continue;
        }
        for (int s = 0; s < n->n_in; s++) {
            const int v = n->in[s];
            if (v >= 0 && moved[v] &&
                (is_conv ? s == 0 || s == 7 /* the residual */ : blocked[n->out[0]] != 0))
                n->in[s] = moved[v] - 1;
        }
        if (!is_conv)
            continue;
        const bool xb = n->in[0] >= n_values; /* rewired just above */
        if ((st = report(r, true, n->name, "%s '%s' -> FusedConv in blocked channels (%s -> "
                         "%lld channels)", n->op_type, n->name, xb ? "blocked" : "NCHW",
                         (long long)conv[i])) ||
            (!is_op(n, FUSED_DOMAIN, "FusedConv") &&
             (st = ai_node_set_op(n, FUSED_DOMAIN, "FusedConv"))) ||
            (st = set_number(n, "y_blocked", AI_ATTR_INT, 1)) ||
            (xb && (st = set_number(n, "x_blocked", AI_ATTR_INT, 1))))
            break;
    }
    /* producers write the twins; an UnblockChannels where the original is still read */
    for (int i = n_nodes - 1; i >= 0 && !st; i--) {
        const int v = g->nodes[i].out[0];
        if (g->nodes[i].n_out < 1 || v < 0 || v >= n_values || !moved[v])
            continue;
        const int b = moved[v] - 1;
        bool out;
        const int readers = uses(g, v, &out);
        g->nodes[i].out[0] = b;
        g->values[b].producer = i;
        g->values[b].producer_slot = 0;
        g->values[v].producer = -1;
        if (!readers && !out)
            continue;
        char name[600];
        snprintf(name, sizeof name, "%s/UnblockChannels", g->nodes[i].name);
        const char *ins[1] = {g->values[b].name}, *outs[1] = {g->values[v].name};
        ai_attr a = {.name = "channels", .type = AI_ATTR_INT, .i = blocked[v]};
        if ((st = ai_graph_add_node(g, name, FUSED_DOMAIN, "UnblockChannels", 1, 1, ins, 1, outs,
                                    1, &a)))
            break;
        ai_graph_move_node(g, g->n_nodes - 1, i + 1);
        st = report(r, true, name, "UnblockChannels '%s' for the readers of '%s' in NCHW", name,
                    g->values[v].name);
    }
    /* the Adds and Relus fuse_residuals detached: the only nodes without outputs */
    bool *remove = st ? NULL : calloc((size_t)g->n_nodes + 1, sizeof(bool));
    if (!st && !remove)
        st = ai_error(AI_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < g->n_nodes; i++)
        remove[i] = g->nodes[i].n_out == 0;
    free(moved);
    free(mean);
    free(blocked);
    free(conv);
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}

/* ---------------------------------------------------------------- expand_metaops */

static const char *string_attr(const ai_node *n, const char *name, const char *dflt)
{
    const ai_attr *a = ai_node_attr(n, name);
    return a && a->type == AI_ATTR_STRING && a->s && a->s[0] ? a->s : dflt;
}

/* Adds node `name` (op_type, one input, one output) and moves it to `pos`. */
static ai_status insert_node(ai_graph *g, int pos, const char *name, const char *op_type,
                             int opset, int in, int out, int n_attrs, const ai_attr *attrs)
{
    const char *ins[1] = {g->values[in].name}, *outs[1] = {g->values[out].name};
    ai_status st = ai_graph_add_node(g, name, "", op_type, opset, 1, ins, 1, outs, n_attrs, attrs);
    if (!st)
        ai_graph_move_node(g, g->n_nodes - 1, pos);
    return st;
}

/* What expand_node takes apart: the fusions (activation, BatchNorm
 * epilogue; expand_metaops) or the Flatten that remove_flatten folded into a
 * FusedGemm (restore_flatten). */
enum expand_part { EXPAND_FUSIONS, EXPAND_FLATTEN };

/* Node i (fused) gives back the nodes of `part`: Flatten? -> node -> BatchNorm?
 * -> activation?; the node becomes Conv/Gemm unless it keeps a fusion of the
 * other part (a FusedGemm with flatten_axis after expand_metaops, with an
 * activation or epilogue after restore_flatten). *i moves to the last node. */
static ai_status expand_node(ai_graph *g, int *i, enum expand_part part, ai_recipe_report *r)
{
    ai_node *n = &g->nodes[*i];
    char name[512], buf[600], flat_node[600], flat_out[600], act_node[600], act_in[600];
    char act[16], bn_node[600], bn_in[600]; /* copies: the attributes are removed below */
    const bool fusions = part == EXPAND_FUSIONS;
    snprintf(act, sizeof act, "%s", fusions ? string_attr(n, "activation", "") : "");
    int64_t axis = -1;
    if (!fusions)
        ai_attr_int(n, "flatten_axis", -1, &axis);
    snprintf(name, sizeof name, "%s", n->name);
    snprintf(buf, sizeof buf, "%s/Flatten", name);
    snprintf(flat_node, sizeof flat_node, "%s", string_attr(n, "flatten_node", buf));
    snprintf(buf, sizeof buf, "%s/Flatten_output_0", name);
    snprintf(flat_out, sizeof flat_out, "%s", string_attr(n, "flatten_output", buf));
    snprintf(buf, sizeof buf, "%s/%s", name, act);
    snprintf(act_node, sizeof act_node, "%s", string_attr(n, "activation_node", buf));
    snprintf(buf, sizeof buf, "%s_output_0", name);
    snprintf(act_in, sizeof act_in, "%s", string_attr(n, "activation_input", buf));
    const bool has_bn = ai_node_attr(n, "bn_epsilon") != NULL && n->n_in == 7;
    const bool bn = fusions && has_bn;
    double eps = 1e-5;
    ai_attr_float(n, "bn_epsilon", 1e-5, &eps);
    snprintf(buf, sizeof buf, "%s/BatchNormalization", name);
    snprintf(bn_node, sizeof bn_node, "%s", string_attr(n, "bn_node", buf));
    snprintf(buf, sizeof buf, "%s_conv_output_0", name);
    snprintf(bn_in, sizeof bn_in, "%s", string_attr(n, "bn_input", buf));
    int bn_ins[4] = {-1, -1, -1, -1};
    if (bn) {
        for (int k = 0; k < 4; k++)
            bn_ins[k] = n->in[3 + k];
        n->n_in = n->in[2] >= 0 ? 3 : 2;
    }
    double lo = -INFINITY, hi = INFINITY;
    const double *params;
    int64_t n_params;
    ai_attr_floats(n, "activation_params", &params, &n_params);
    if (n_params == 2) {
        lo = params[0];
        hi = params[1];
    }
    const bool conv = strcmp(n->op_type, "FusedConv") == 0;
    const bool stays_fused = fusions ? ai_node_attr(n, "flatten_axis") != NULL
                                     : string_attr(n, "activation", "")[0] || has_bn;
    const int opset = n->opset;
    ai_status st = stays_fused ? AI_OK : ai_node_set_op(n, "", conv ? "Conv" : "Gemm");
    static const char *const fusion_attrs[] = {"activation", "activation_params",
                                               "activation_node", "activation_input",
                                               "bn_epsilon", "bn_node", "bn_input"};
    static const char *const flatten_attrs[] = {"flatten_axis", "flatten_node",
                                                "flatten_output"};
    for (size_t k = 0; k < sizeof fusion_attrs / sizeof *fusion_attrs; k++)
        if (fusions || !stays_fused)
            ai_node_remove_attr(n, fusion_attrs[k]);
    for (size_t k = 0; k < sizeof flatten_attrs / sizeof *flatten_attrs; k++)
        if (!fusions || !stays_fused)
            ai_node_remove_attr(n, flatten_attrs[k]);
    if (st)
        return st;
    if (axis >= 0) {
        /* several Gemms may have read one Flatten: the first expansion makes it */
        int v = ai_graph_find_value(g, flat_out), src = n->in[0];
        bool reuse = v >= 0 && g->values[v].producer >= 0 &&
                     is_op(&g->nodes[g->values[v].producer], "", "Flatten") &&
                     g->nodes[g->values[v].producer].in[0] == src;
        if (!reuse) {
            ai_attr a = {.name = "axis", .type = AI_ATTR_INT, .i = axis};
            if ((st = ai_graph_new_value(g, flat_out, &v)) ||
                (st = insert_node(g, *i, flat_node, "Flatten", opset, src, v, 1, &a)))
                return st;
            (*i)++;
        }
        g->nodes[*i].in[0] = v;
    }
    if (bn) {
        int mid, out = g->nodes[*i].out[0];
        if ((st = ai_graph_new_value(g, bn_in, &mid)))
            return st;
        take_output(g, *i, mid);
        const char *ins[5] = {bn_in, g->values[bn_ins[0]].name, g->values[bn_ins[1]].name,
                              g->values[bn_ins[2]].name, g->values[bn_ins[3]].name};
        const char *outs[1] = {g->values[out].name};
        ai_attr e = {.name = "epsilon", .type = AI_ATTR_FLOAT, .f = eps};
        if ((st = ai_graph_add_node(g, bn_node, "", "BatchNormalization", opset, 5, ins, 1,
                                    outs, 1, &e)))
            return st;
        ai_graph_move_node(g, g->n_nodes - 1, *i + 1);
        (*i)++;
    }
    if (act[0]) {
        int mid, out = g->nodes[*i].out[0];
        if ((st = ai_graph_new_value(g, act_in, &mid)))
            return st;
        take_output(g, *i, mid);
        ai_attr bounds[2] = {{.name = "min", .type = AI_ATTR_FLOAT, .f = lo},
                             {.name = "max", .type = AI_ATTR_FLOAT, .f = hi}};
        bool clip = strcmp(act, "Clip") == 0;
        /* Clip with bounds as attributes: the opset 6 form */
        if ((st = insert_node(g, *i + 1, act_node, clip ? "Clip" : "Relu", clip ? 6 : opset,
                              mid, out, clip ? 2 : 0, bounds)))
            return st;
        (*i)++;
    }
    const char *base = stays_fused ? (conv ? "FusedConv" : "FusedGemm") : conv ? "Conv" : "Gemm";
    return report(r, true, name, "%s '%s' expanded into %s%s%s%s%s", conv ? "FusedConv" : "FusedGemm",
                  name, axis >= 0 ? "Flatten, " : "", base, bn ? ", BatchNormalization" : "",
                  act[0] ? ", " : "", act);
}

/* The fused nodes with something of `part` to give back go through
 * expand_node; a fused node with nothing of it is skipped, with the reason. */
static ai_status expand_recipe(ai_graph *g, ai_recipe_report *r, enum expand_part part)
{
    const char *recipe = part == EXPAND_FUSIONS ? "expand_metaops" : "restore_flatten";
    ai_status st = check_finalized(g, recipe);
    bool editing = false;
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const ai_node *n = &g->nodes[i];
        if (!is_op(n, FUSED_DOMAIN, "FusedConv") && !is_op(n, FUSED_DOMAIN, "FusedGemm"))
            continue;
        if (ai_node_attr(n, "y_blocked")) {
            st = ai_error(AI_ERR_VALUE, "%s: FusedConv '%s' runs in blocked channels "
                          "(block_channels), which %s does not undo", recipe, n->name, recipe);
            break;
        }
        const bool flat = ai_node_attr(n, "flatten_axis") != NULL;
        const bool fused = string_attr(n, "activation", "")[0] || ai_node_attr(n, "bn_epsilon");
        if (part == EXPAND_FUSIONS && flat && !fused) {
            st = report(r, false, n->name, "%s '%s' kept: it fuses only a Flatten "
                        "(remove_flatten; restore_flatten gives it back)", n->op_type, n->name);
            continue;
        }
        if (part == EXPAND_FLATTEN && !flat)
            continue; /* nothing of remove_flatten's */
        begin_edit(g, &editing);
        st = expand_node(g, &i, part, r);
    }
    return st ? st : end_edit(g, editing, NULL);
}

ai_status ai_recipe_expand_metaops(ai_graph *g, ai_recipe_report *r)
{
    return expand_recipe(g, r, EXPAND_FUSIONS);
}

ai_status ai_recipe_restore_flatten(ai_graph *g, ai_recipe_report *r)
{
    return expand_recipe(g, r, EXPAND_FLATTEN);
}

/* ---------------------------------------------------------------- constant_fold */

/* Runs node n on its constant inputs; its outputs become constants. */
static ai_status fold_node(ai_graph *g, ai_plan *plan, int ni)
{
    const ai_node *n = &g->nodes[ni];
    ai_ctx c = {.g = g, .node = n, .n_in = n->n_in, .n_out = n->n_out, .training = g->training,
                .plan = plan};
    for (int k = 0; k < n->n_in; k++) {
        c.in[k] = n->in[k] >= 0 ? g->values[n->in[k]].data : NULL;
        if (c.in[k] && ai_dtype_is_half(c.in[k]->dtype) && !(n->op->flags & AI_OP_HALF))
            return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "input %d is %s: the plan folds "
                                 "it (computed in float32)", k, ai_dtype_name(c.in[k]->dtype));
    }
    ai_meta om[AI_MAX_IO];
    memset(om, 0, sizeof om);
    size_t ws = 0, state_bytes = 0;
    ai_status st = n->op->shape(&c, om, &ws, &state_bytes);
    ai_tensor *outs[AI_MAX_IO] = {0};
    void *work = NULL, *state = NULL;
    for (int k = 0; k < n->n_out && !st; k++) {
        int64_t numel;
        if ((unsigned)om[k].dtype >= AI_DTYPE_COUNT ||
            ai_shape_check(om[k].ndim, om[k].shape, ai_dtype_size(om[k].dtype), &numel))
            st = ai_node_error(n, AI_ERR_VALUE, "output %d has an invalid shape", k);
        else
            st = ai_tensor_new(&outs[k], om[k].dtype, om[k].ndim, om[k].shape);
        c.out[k] = outs[k];
    }
    if (!st && ((ws && !(work = calloc(1, ws))) ||
                (state_bytes && !(state = calloc(1, state_bytes)))))
        st = ai_error(AI_ERR_NOMEM, "out of memory folding node '%s'", n->name);
    c.workspace = work;
    c.state = state;
    if (!st)
        st = n->op->forward(&c);
    free(work);
    free(state);
    for (int k = 0; k < n->n_out; k++) {
        if (st) {
            ai_tensor_free(outs[k]);
            continue;
        }
        ai_value *v = &g->values[n->out[k]];
        v->kind = AI_VAL_CONST;
        v->dtype = outs[k]->dtype;
        v->data = outs[k];
        v->producer = -1;
    }
    return st;
}

ai_status ai_recipe_constant_fold(ai_graph *g, ai_recipe_report *r)
{
    bool *remove, editing = false;
    ai_status st = start(g, "constant_fold", &remove);
    if (st)
        return st;
    ai_plan plan = {0}; /* no plan-time values: ai_ctx_const reads constants */
    if (!(plan.folded = calloc((size_t)g->n_values + 1, sizeof(ai_tensor *)))) {
        free(remove);
        return ai_error(AI_ERR_NOMEM, "out of memory");
    }
    for (int oi = 0; oi < g->n_nodes && !st; oi++) {
        const int i = g->order[oi];
        const ai_node *n = &g->nodes[i];
        bool all_const = !(n->op->flags & AI_OP_NO_FOLD), any = false;
        for (int k = 0; k < n->n_in && all_const; k++) {
            all_const = n->in[k] < 0 || is_constant(g, n->in[k]);
            any |= n->in[k] >= 0;
        }
        if (!all_const || !any)
            continue;
        if (fold_node(g, &plan, i)) {
            st = report(r, false, n->name, "%s '%s' not folded: %s", n->op_type, n->name,
                        ai_last_error());
            continue;
        }
        remove[i] = true;
        char shape[200] = "";
        const ai_tensor *t = g->values[n->out[0]].data;
        for (int d = 0, len = 0; d < t->ndim && len < 180; d++)
            len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%lld", d ? "x" : "",
                            (long long)t->shape[d]);
        st = report(r, true, n->name, "%s '%s' folded into constant '%s' (%s%s%s)", n->op_type,
                    n->name, g->values[n->out[0]].name, ai_dtype_name(t->dtype),
                    t->ndim ? " " : ", scalar", shape);
    }
    free(plan.folded);
    for (int i = 0; i < g->n_nodes; i++)
        editing |= remove[i];
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}

/* ---------------------------------------------------------------- fuse_linear */

/* "(256, 1024)": the shape of t. */
static const char *shape_text(const ai_tensor *t, char *buf, size_t size)
{
    int len = snprintf(buf, size, "(");
    for (int d = 0; d < t->ndim && len < (int)size - 24; d++)
        len += snprintf(buf + len, size - (size_t)len, "%s%lld", d ? ", " : "",
                        (long long)t->shape[d]);
    snprintf(buf + len, size - (size_t)len, "%s)", t->ndim == 1 ? "," : "");
    return buf;
}

/* Why Transpose node t cannot be read by a product as its weight in place,
 * transposed (transB), or NULL when it can: a 2-D initializer, its axes
 * swapped. */
static const char *transpose_obstacle(const ai_graph *g, const ai_node *t)
{
    const int64_t *perm;
    int64_t n_perm;
    if (!has_data(g, t->in[0]))
        return "it transposes a graph input or a computed value, not a weight";
    if (g->values[t->in[0]].data->ndim != 2)
        return "its weight is not 2-D";
    if (ai_attr_ints(t, "perm", &perm, &n_perm) ||
        (n_perm >= 0 && !(n_perm == 2 && perm[0] == 1 && perm[1] == 0)))
        return "its perm is not [1, 0]";
    return NULL;
}

/* Why Add node a, reading product y (its only reader, once) with N columns
 * of dtype dt, cannot become the product's bias epilogue (NULL when it
 * can); *bias: its other input. */
static const char *bias_obstacle(const ai_graph *g, const ai_node *a, int y, int64_t N,
                                 ai_dtype dt, int *bias)
{
    *bias = a->in[0] == y ? a->in[1] : a->in[0];
    if (!has_data(g, *bias))
        return "its other input is computed, not a bias initializer";
    const ai_tensor *b = g->values[*bias].data;
    if (b->ndim != 1 || b->shape[0] != N)
        return "its other input is not a vector of one value per output column";
    if (b->dtype != dt)
        return "its bias and the weight differ in dtype";
    return NULL;
}

ai_status ai_recipe_fuse_linear(ai_graph *g, ai_recipe_report *r)
{
    bool *remove, editing = false;
    ai_status st = start(g, "fuse_linear", &remove);
    if (st)
        return st;
    bool *folded = calloc((size_t)g->n_nodes + 1, sizeof(bool)); /* Transposes read in place */
    if (!folded) {
        free(remove);
        return ai_error(AI_ERR_NOMEM, "out of memory");
    }
    char shape[200];
    for (int i = 0; i < g->n_nodes && !st; i++) {
        ai_node *n = &g->nodes[i];
        if (!is_op(n, "", "MatMul"))
            continue;
        const int b = n->in[1], t = g->values[b].producer;
        int w = -1; /* the weight the product reads in place */
        if (t >= 0 && is_op(&g->nodes[t], "", "Transpose")) {
            const char *why = transpose_obstacle(g, &g->nodes[t]);
            if (why) {
                st = report(r, false, n->name, "MatMul '%s': Transpose '%s' not folded: %s",
                            n->name, g->nodes[t].name, why);
                continue;
            }
            w = g->nodes[t].in[0];
        } else if (has_data(g, b) && g->values[b].data->ndim == 2) {
            w = b;
        }
        if (w < 0)
            continue; /* a product of computed values: not a candidate */
        const bool tb = w != b;
        const ai_tensor *W = g->values[w].data;
        const int64_t N = W->shape[tb ? 0 : 1];
        /* an Add of a bias, the product's only reader */
        bool out;
        int add = -1, bias = -1;
        if (uses(g, n->out[0], &out) == 1 && !out)
            for (int j = i + 1; j < g->n_nodes && add < 0; j++)
                for (int k = 0; k < g->nodes[j].n_in; k++)
                    if (g->nodes[j].in[k] == n->out[0] && is_op(&g->nodes[j], "", "Add"))
                        add = j;
        const char *why = add >= 0 ? bias_obstacle(g, &g->nodes[add], n->out[0], N, W->dtype,
                                                   &bias)
                                   : NULL;
        if (why) {
            st = report(r, false, g->nodes[add].name, "Add '%s' not fused into MatMul '%s': "
                        "%s (%s %s, the product has %lld columns)", g->nodes[add].name,
                        n->name, why, g->values[bias].name,
                        has_data(g, bias) ? shape_text(g->values[bias].data, shape, sizeof shape)
                                          : "computed",
                        (long long)N);
            bias = -1;
        }
        if (!tb && bias < 0)
            continue; /* nothing to fuse */
        editing = true;
        n->in[1] = w;
        if ((st = ai_node_set_op(n, FUSED_DOMAIN, "FusedMatMul")) ||
            (tb && (st = set_number(n, "transB", AI_ATTR_INT, 1))))
            break;
        if (bias >= 0) {
            n->in[2] = bias;
            n->n_in = 3;
            take_output(g, i, g->nodes[add].out[0]);
            remove[add] = true;
        }
        if (tb)
            folded[t] = true;
        char what[1300] = "";
        if (tb)
            snprintf(what, sizeof what, "reads weight '%s' %s transposed in place (Transpose "
                     "'%s')", g->values[w].name, shape_text(W, shape, sizeof shape),
                     g->nodes[t].name);
        if (bias >= 0)
            snprintf(what + strlen(what), sizeof what - strlen(what), "%sadds bias '%s' (Add "
                     "'%s')", tb ? ", " : "", g->values[bias].name, g->nodes[add].name);
        st = report(r, true, n->name, "MatMul '%s' -> FusedMatMul: %s", n->name, what);
    }
    /* a Transpose whose output something else still reads stays, for it */
    for (int t = 0; t < g->n_nodes && !st; t++) {
        bool out;
        if (!folded[t])
            continue;
        if (uses(g, g->nodes[t].out[0], &out) || out)
            st = report(r, false, g->nodes[t].name, "Transpose '%s' kept: its output is also "
                        "read elsewhere", g->nodes[t].name);
        else
            remove[t] = true;
    }
    free(folded);
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}

/* ---------------------------------------------------------------- fuse_gelu */

#define SQRT_2_PI 0.79788456080286535588 /* sqrt(2 / pi) */

/* The nodes of one matched subgraph (removed but for its last). */
typedef struct {
    int node[8];
    int n;
} node_set;

/* The value of scalar constant v (one element), or NAN. */
static double scalar_const(const ai_graph *g, int v)
{
    return is_constant(g, v) && ai_tensor_numel(g->values[v].data) == 1
               ? ai_tensor_get_flat(g->values[v].data, 0)
               : NAN;
}

/* Whether x is c to float32 precision (the exporter's constants are
 * float32 roundings of the formula's). */
static bool near(double x, double c)
{
    return fabs(x - c) <= 1e-6 * fabs(c);
}

/* The single node reading value v (v not a graph output), or -1. */
static int sole_reader(const ai_graph *g, int v)
{
    bool out;
    if (v < 0 || uses(g, v, &out) != 1 || out)
        return -1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] == v)
                return i;
    return -1;
}

/* The producer of v when it is a binary `op_type` node that nothing else
 * reads (v read once, not a graph output), added to s; else -1. */
static int sole_producer(const ai_graph *g, int v, const char *op_type, node_set *s)
{
    const int p = v >= 0 ? g->values[v].producer : -1;
    if (p < 0 || !is_op(&g->nodes[p], "", op_type) || g->nodes[p].n_in != 2 ||
        sole_reader(g, v) < 0)
        return -1;
    s->node[s->n++] = p;
    return p;
}

/* The operand of binary node n other than a scalar constant near c, or -1. */
static int scaled(const ai_graph *g, int n, double c)
{
    if (n < 0)
        return -1;
    const int *in = g->nodes[n].in;
    return near(scalar_const(g, in[1]), c) ? in[0] : near(scalar_const(g, in[0]), c) ? in[1] : -1;
}

/* Whether value v is x^3 computed from x alone: Pow(x, 3), x (x x) or (x x) x. */
static bool is_cube(const ai_graph *g, int v, int x, node_set *s)
{
    const int n0 = s->n, pw = sole_producer(g, v, "Pow", s);
    if (pw >= 0)
        return g->nodes[pw].in[0] == x && scalar_const(g, g->nodes[pw].in[1]) == 3;
    const int m = sole_producer(g, v, "Mul", s);
    for (int k = 0; m >= 0 && k < 2; k++) {
        s->n = n0 + 1;
        const int sq = g->nodes[m].in[k] == x ? sole_producer(g, g->nodes[m].in[1 - k], "Mul", s)
                                              : -1;
        if (sq >= 0 && g->nodes[sq].in[0] == x && g->nodes[sq].in[1] == x)
            return true;
    }
    return false;
}

/* The x of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), whose
 * Tanh is node t: Tanh's input Mul(x + Mul(x^3, 0.044715), sqrt(2/pi))
 * (operands in either order), every node between read only by the next
 * (added to s); -1 when t is not one. */
static int gelu_tanh_input(const ai_graph *g, const ai_node *t, node_set *s)
{
    const int inner = scaled(g, sole_producer(g, t->in[0], "Mul", s), SQRT_2_PI);
    const int add = sole_producer(g, inner, "Add", s), n0 = s->n;
    for (int k = 0; add >= 0 && k < 2; k++) {
        s->n = n0;
        const int x = g->nodes[add].in[k];
        const int cube = scaled(g, sole_producer(g, g->nodes[add].in[1 - k], "Mul", s),
                                0.044715);
        if (cube >= 0 && is_cube(g, cube, x, s))
            return x;
    }
    return -1;
}

/* Whether node m is a binary Mul. */
static bool is_mul(const ai_graph *g, int m)
{
    return m >= 0 && is_op(&g->nodes[m], "", "Mul") && g->nodes[m].n_in == 2;
}

/* The node that ends 0.5 x (1 + tanh(u)) given h = 1 + tanh(u):
 * Mul(Mul(x, 0.5), h), Mul(x, Mul(h, 0.5)) or Mul(Mul(x, h), 0.5) (either
 * order in each product; the inner Mul added to s), or -1. */
static int gelu_tanh_output(const ai_graph *g, int h, int x, node_set *s)
{
    const int m = sole_reader(g, h);
    if (!is_mul(g, m))
        return -1;
    const int o = g->nodes[m].in[0] == h ? g->nodes[m].in[1] : g->nodes[m].in[0];
    const int n0 = s->n;
    if (scaled(g, sole_producer(g, o, "Mul", s), 0.5) == x) /* (x 0.5) h */
        return m;
    s->n = n0;
    const int last = sole_reader(g, g->nodes[m].out[0]);
    if (!is_mul(g, last))
        return -1;
    s->node[s->n++] = m;
    const int *in = g->nodes[last].in;
    if (scaled(g, m, 0.5) == h && (in[0] == x || in[1] == x)) /* x (h 0.5) */
        return last;
    if (o == x && scaled(g, last, 0.5) == g->nodes[m].out[0]) /* (x h) 0.5 */
        return last;
    s->n = n0;
    return -1;
}

ai_status ai_recipe_fuse_gelu(ai_graph *g, ai_recipe_report *r)
{
    bool *remove, editing = false;
    ai_status st = start(g, "fuse_gelu", &remove);
    if (st)
        return st;
    for (int i = 0; i < g->n_nodes && !st; i++) {
        const ai_node *t = &g->nodes[i];
        if (!is_op(t, "", "Tanh") || remove[i])
            continue;
        node_set s = {.n = 0};
        const int x = gelu_tanh_input(g, t, &s), a = sole_reader(g, t->out[0]);
        if (x < 0 || a < 0 || !is_op(&g->nodes[a], "", "Add") || g->nodes[a].n_in != 2 ||
            scaled(g, a, 1.0) != t->out[0])
            continue; /* not a GELU: nothing to report */
        const int last = gelu_tanh_output(g, g->nodes[a].out[0], x, &s);
        if (last < 0)
            continue;
        s.node[s.n++] = i;
        s.node[s.n++] = a;
        for (int k = 0; k < s.n; k++)
            remove[s.node[k]] = true;
        editing = true;
        ai_node *n = &g->nodes[last];
        if ((st = report(r, true, n->name, "Tanh '%s' and the %d products and sums around it "
                         "(0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x '%s') -> Gelu "
                         "'%s' (approximate 'tanh')", t->name, s.n - 1, g->values[x].name,
                         n->name)) ||
            (st = ai_node_set_op(n, "", "Gelu")) || (st = set_string(n, "approximate", "tanh")))
            break;
        n->in[0] = x;
        n->in[1] = -1;
        n->n_in = 1;
        if (n->opset < 20) /* Gelu's first opset */
            n->opset = 20;
    }
    if (!st)
        st = end_edit(g, editing, remove);
    free(remove);
    return st;
}
