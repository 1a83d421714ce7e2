/*
 * ml.c — operators of ONNX's ai.onnx.ml domain over numeric tensors:
 * ArrayFeatureExtractor, Binarizer, TreeEnsemble. (Those over strings —
 * LabelEncoder's string maps, ... — stay out: the engine has no strings.)
 *
 * ArrayFeatureExtractor(X, Y): X's last axis gathered at the int64 indices Y
 * (all of Y's elements, flattened): [..., k]; a 1-D X gives [1, k], as ONNX
 * Runtime does. Binarizer(X): 1 where X > threshold, else 0, in X's dtype.
 *
 * TreeEnsemble (opset 5) X [N, F] -> Y [N, n_targets]: each tree of
 * tree_roots walks from its root: node i compares feature
 * nodes_featureids[i] with nodes_splits[i] by nodes_modes[i] (0 <=, 1 <,
 * 2 >=, 3 >, 4 ==, 5 !=, 6 member of its set in membership_values, the sets
 * separated by NaN), NaN going the true way where
 * nodes_missing_value_tracks_true[i]; the branch taken is a node, or a leaf
 * where nodes_trueleafs/nodes_falseleafs say so (a root whose two branches
 * are the same leaf is that leaf). Leaf j adds leaf_weights[j] to target
 * leaf_targetids[j], aggregated over the trees by aggregate_function (0
 * average, 1 sum, 2 min, 3 max; a target no leaf reaches is 0, or the
 * dtype's largest / lowest finite value for min / max). post_transform other than 0 (none) is
 * refused. No gradient flows through these operators.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"

/* ---------------------------------------------------------------- ArrayFeatureExtractor */

static ai_status afe_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0], *y = c->in[1];
    if (y->dtype != AI_I64)
        return ai_node_error(c->node, AI_ERR_TYPE, "indices are %s; int64 expected",
                             ai_dtype_name(y->dtype));
    if (x->ndim < 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "X is a scalar; at least 1-D expected");
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim == 1 ? 2 : x->ndim;
    if (x->ndim == 1)
        out[0].shape[0] = 1;
    else
        memcpy(out[0].shape, x->shape, sizeof(int64_t) * (size_t)(x->ndim - 1));
    out[0].shape[out[0].ndim - 1] = ai_tensor_numel(y);
    return AI_OK;
}

static ai_status afe_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0], *y = c->in[1];
    const int64_t last = x->shape[x->ndim - 1], k = ai_tensor_numel(y);
    const int64_t rows = last ? ai_tensor_numel(x) / last : 0;
    const size_t es = ai_dtype_size(x->dtype);
    for (int64_t j = 0; j < k; j++) {
        int64_t at = ai_tensor_get_flat_i64(y, j);
        if (at < 0 || at >= last)
            return ai_node_error(c->node, AI_ERR_VALUE, "index %lld is out of [0, %lld)",
                                 (long long)at, (long long)last);
        for (int64_t r = 0; r < rows; r++)
            memcpy((char *)c->out[0]->data + (size_t)(r * k + j) * es,
                   (const char *)x->data + (size_t)(r * last + at) * es, es);
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- Binarizer */

static ai_status binarizer_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_F32 && x->dtype != AI_F64 && x->dtype != AI_I32 && x->dtype != AI_I64)
        return ai_node_error(c->node, AI_ERR_TYPE, "X is %s; float32, float64, int32 or int64 "
                             "expected", ai_dtype_name(x->dtype));
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    return AI_OK;
}

static ai_status binarizer_forward(ai_ctx *c)
{
    double threshold;
    ai_status st = ai_attr_float(c->node, "threshold", 0.0, &threshold);
    if (st)
        return st;
    const ai_tensor *x = c->in[0];
    void *y = c->out[0]->data;
    for (int64_t i = 0, n = ai_tensor_numel(x); i < n; i++) {
        const bool on = ai_tensor_get_flat(x, i) > threshold;
        switch (x->dtype) {
        case AI_F32: ((float *)y)[i] = on; break;
        case AI_F64: ((double *)y)[i] = on; break;
        case AI_I32: ((int32_t *)y)[i] = on; break;
        default: ((int64_t *)y)[i] = on; break;
        }
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- TreeEnsemble */

typedef struct {
    const ai_tensor *splits, *modes, *leaf_weights, *members;
    const int64_t *feature, *true_id, *false_id, *true_leaf, *false_leaf, *missing_true;
    const int64_t *leaf_target, *roots;
    int64_t n_nodes, n_leaves, n_roots, n_targets, n_missing, aggregate;
    int64_t *set_start; /* per node: where its set begins in members (MEMBER nodes) */
} tree_args;

/* Reads and checks the attributes; set_start must hold n_nodes entries. */
static ai_status tree_args_of(const ai_node *n, tree_args *t, int64_t n_features)
{
    static const char *tensors[] = {"nodes_splits", "nodes_modes", "leaf_weights"};
    const ai_tensor **dst[] = {&t->splits, &t->modes, &t->leaf_weights};
    for (int i = 0; i < 3; i++) {
        const ai_attr *a = ai_node_attr(n, tensors[i]);
        if (!a || a->type != AI_ATTR_TENSOR)
            return ai_node_error(n, AI_ERR_VALUE, "attribute %s (a tensor) is required",
                                 tensors[i]);
        *dst[i] = a->t;
    }
    const ai_attr *m = ai_node_attr(n, "membership_values");
    t->members = m && m->type == AI_ATTR_TENSOR ? m->t : NULL;
    int64_t post, len[8];
    static const char *ints[] = {"nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids",
                                 "nodes_trueleafs", "nodes_falseleafs", "leaf_targetids",
                                 "tree_roots", "nodes_missing_value_tracks_true"};
    const int64_t **idst[] = {&t->feature, &t->true_id, &t->false_id, &t->true_leaf,
                              &t->false_leaf, &t->leaf_target, &t->roots, &t->missing_true};
    ai_status st;
    for (int i = 0; i < 8; i++)
        if ((st = ai_attr_ints(n, ints[i], idst[i], &len[i])))
            return st;
    if ((st = ai_attr_int(n, "n_targets", -1, &t->n_targets)) ||
        (st = ai_attr_int(n, "aggregate_function", 1, &t->aggregate)) ||
        (st = ai_attr_int(n, "post_transform", 0, &post)))
        return st;
    if (post != 0)
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "post_transform %lld; only 0 (none) "
                             "is supported", (long long)post);
    if (t->aggregate < 0 || t->aggregate > 3)
        return ai_node_error(n, AI_ERR_VALUE, "aggregate_function %lld; 0 to 3 expected",
                             (long long)t->aggregate);
    t->n_nodes = ai_tensor_numel(t->splits);
    t->n_leaves = ai_tensor_numel(t->leaf_weights);
    t->n_roots = len[6];
    t->n_missing = len[7] < 0 ? 0 : len[7];
    if (t->n_targets < 1 || t->n_roots < 1 || ai_tensor_numel(t->modes) != t->n_nodes ||
        t->modes->dtype != AI_U8 || len[5] != t->n_leaves)
        return ai_node_error(n, AI_ERR_VALUE, "n_targets, tree_roots, nodes_modes (uint8, one "
                             "per split) and leaf_targetids (one per leaf weight) are "
                             "required");
    for (int i = 0; i < 5; i++)
        if (len[i] != t->n_nodes)
            return ai_node_error(n, AI_ERR_VALUE, "%s has %lld entries for %lld nodes",
                                 ints[i], (long long)len[i], (long long)t->n_nodes);
    if (t->n_missing && t->n_missing != t->n_nodes)
        return ai_node_error(n, AI_ERR_VALUE, "nodes_missing_value_tracks_true has %lld "
                             "entries for %lld nodes", (long long)t->n_missing,
                             (long long)t->n_nodes);
    int64_t pos = 0, n_members = t->members ? ai_tensor_numel(t->members) : 0;
    for (int64_t i = 0; i < t->n_nodes; i++) {
        if (t->feature[i] < 0 || t->feature[i] >= n_features)
            return ai_node_error(n, AI_ERR_VALUE, "node %lld reads feature %lld of %lld",
                                 (long long)i, (long long)t->feature[i],
                                 (long long)n_features);
        const int mode = (int)ai_tensor_get_flat_i64(t->modes, i);
        if (mode < 0 || mode > 6)
            return ai_node_error(n, AI_ERR_VALUE, "node %lld has mode %d; 0 to 6 expected",
                                 (long long)i, mode);
        for (int side = 0; side < 2; side++) {
            int64_t to = (side ? t->false_id : t->true_id)[i];
            int64_t bound = (side ? t->false_leaf : t->true_leaf)[i] ? t->n_leaves : t->n_nodes;
            if (to < 0 || to >= bound)
                return ai_node_error(n, AI_ERR_VALUE, "node %lld's %s branch %lld is out of "
                                     "[0, %lld)", (long long)i, side ? "false" : "true",
                                     (long long)to, (long long)bound);
        }
        if (mode == 6) {
            t->set_start[i] = pos;
            while (pos < n_members && !isnan(ai_tensor_get_flat(t->members, pos)))
                pos++;
            if (pos++ >= n_members)
                return ai_node_error(n, AI_ERR_VALUE, "membership_values has no NaN-ended "
                                     "set for node %lld", (long long)i);
        }
    }
    for (int64_t i = 0; i < t->n_leaves; i++)
        if (t->leaf_target[i] < 0 || t->leaf_target[i] >= t->n_targets)
            return ai_node_error(n, AI_ERR_VALUE, "leaf %lld targets %lld of %lld",
                                 (long long)i, (long long)t->leaf_target[i],
                                 (long long)t->n_targets);
    for (int64_t r = 0; r < t->n_roots; r++)
        if (t->roots[r] < 0 || t->roots[r] >= t->n_nodes)
            return ai_node_error(n, AI_ERR_VALUE, "tree root %lld is out of [0, %lld)",
                                 (long long)t->roots[r], (long long)t->n_nodes);
    return AI_OK;
}

static ai_status tree_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const ai_tensor *x = c->in[0];
    if (!ai_dtype_is_float(x->dtype) || x->dtype == AI_F16 || x->ndim != 2)
        return ai_node_error(c->node, AI_ERR_TYPE, "X is %s of rank %d; float32 or float64 "
                             "[N, F] expected", ai_dtype_name(x->dtype), x->ndim);
    const ai_attr *s = ai_node_attr(c->node, "nodes_splits");
    const int64_t n_nodes = s && s->type == AI_ATTR_TENSOR ? ai_tensor_numel(s->t) : 0;
    *ws = sizeof(int64_t) * (size_t)(n_nodes + 1);
    tree_args t = {.set_start = malloc(*ws)}; /* checked now with forward's scratch size */
    if (!t.set_start)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    ai_status st = tree_args_of(c->node, &t, x->shape[1]);
    free(t.set_start);
    if (st)
        return st;
    out[0].dtype = x->dtype;
    out[0].ndim = 2;
    out[0].shape[0] = x->shape[0];
    out[0].shape[1] = t.n_targets;
    return AI_OK;
}

static bool tree_goes_true(const tree_args *t, int64_t i, double v)
{
    if (isnan(v) && t->n_missing && t->missing_true[i])
        return true;
    const double s = ai_tensor_get_flat(t->splits, i);
    switch ((int)ai_tensor_get_flat_i64(t->modes, i)) {
    case 0: return v <= s;
    case 1: return v < s;
    case 2: return v >= s;
    case 3: return v > s;
    case 4: return v == s;
    case 5: return v != s;
    default:
        for (int64_t k = t->set_start[i]; !isnan(ai_tensor_get_flat(t->members, k)); k++)
            if (ai_tensor_get_flat(t->members, k) == v)
                return true;
        return false;
    }
}

static ai_status tree_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    tree_args t = {.set_start = c->workspace};
    ai_status st = tree_args_of(c->node, &t, x->shape[1]);
    if (st)
        return st;
    const int64_t N = x->shape[0], F = x->shape[1];
    ai_tensor *y = c->out[0];
    /* a target no leaf reaches keeps the start: the dtype's largest (min) or
     * lowest (max) finite value, as ONNX's reference */
    const double big = x->dtype == AI_F32 ? FLT_MAX : DBL_MAX;
    const double init = t.aggregate == 2 ? big : t.aggregate == 3 ? -big : 0.0;
    for (int64_t r = 0; r < N; r++) {
        for (int64_t k = 0; k < t.n_targets; k++)
            ai_float_set(y, r * t.n_targets + k, init);
        for (int64_t root = 0; root < t.n_roots; root++) {
            int64_t i = t.roots[root], steps = 0;
            bool leaf = t.true_leaf[i] && t.false_leaf[i] && t.true_id[i] == t.false_id[i];
            while (!leaf) {
                if (++steps > t.n_nodes)
                    return ai_node_error(c->node, AI_ERR_VALUE, "tree %lld has a cycle",
                                         (long long)root);
                bool go = tree_goes_true(&t, i, ai_tensor_get_flat(x, r * F + t.feature[i]));
                leaf = (go ? t.true_leaf : t.false_leaf)[i];
                i = (go ? t.true_id : t.false_id)[i];
            }
            const int64_t at = r * t.n_targets + t.leaf_target[i];
            const double w = ai_tensor_get_flat(t.leaf_weights, i), cur = ai_float_at(y, at);
            ai_float_set(y, at, t.aggregate == 0 ? cur + w / (double)t.n_roots
                                : t.aggregate == 1 ? cur + w
                                : t.aggregate == 2 ? fmin(cur, w) : fmax(cur, w));
        }
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

#define ML_OP(VAR, NAME, MIN_IN, MAX_IN, SHAPE, FWD)                                     \
    static const ai_op_def VAR = {NAME, "ai.onnx.ml", MIN_IN, MAX_IN, 1, 1, 0, NULL,      \
                                  SHAPE, FWD, NULL};

ML_OP(op_afe, "ArrayFeatureExtractor", 2, 2, afe_shape, afe_forward)
ML_OP(op_binarizer, "Binarizer", 1, 1, binarizer_shape, binarizer_forward)
ML_OP(op_tree, "TreeEnsemble", 1, 1, tree_shape, tree_forward)

const ai_op_def *const ai_ops_ml[] = {&op_afe, &op_binarizer, &op_tree, NULL};
