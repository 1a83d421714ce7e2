/*
 * text.c — operators over token ids: TfIdfVectorizer.
 *
 * TfIdfVectorizer(X) counts, in each row of integer token ids X ([C] or
 * [N, C]), the n-grams of a pool given as attributes (pool_int64s: the
 * n-grams of size 1, then of size 2, ..., starting at ngram_counts[k]),
 * with up to max_skip_count tokens skipped between the items of an n-gram
 * (skip s: items s + 1 apart; unigrams are counted once, not per skip).
 * Only n-grams of min_gram_length to max_gram_length are counted; n-gram
 * number i (in pool order, ids counted over every size) lands at output
 * column ngram_indexes[i]. An n-gram in the pool twice counts at its last
 * place (as ONNX's reference). mode TF: the counts; IDF: weights[col] (or
 * 1) where the count is nonzero; TFIDF: weights[col] (or 1) times the
 * count. Output float32, [O] or [N, O] with O = max(ngram_indexes) + 1.
 * String pools (pool_strings) are refused: the engine has no strings.
 * No gradient (the input is integers).
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"

enum { TF_TF, TF_IDF, TF_TFIDF };

typedef struct {
    int mode;
    int64_t min_n, max_n, max_skip, out_size;
    int64_t n_grams;
    /* per counted n-gram (in the same allocation): pool offset, size (0: a
     * later place of it counts instead), output column */
    int64_t *start, *size, *col;
    const int64_t *pool;
    const double *weights;
    int64_t n_weights;
} tfidf_params;

static ai_status tfidf_init(ai_node *n)
{
    const int64_t *counts, *indexes, *pool;
    int64_t n_counts, n_indexes, n_pool, min_n, max_n, skip;
    const char *mode;
    ai_status st;
    if (ai_node_attr(n, "pool_strings"))
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "pool_strings: the engine has no "
                             "string tensors (pool_int64s is supported)");
    if ((st = ai_attr_ints(n, "ngram_counts", &counts, &n_counts)) ||
        (st = ai_attr_ints(n, "ngram_indexes", &indexes, &n_indexes)) ||
        (st = ai_attr_ints(n, "pool_int64s", &pool, &n_pool)) ||
        (st = ai_attr_int(n, "min_gram_length", -1, &min_n)) ||
        (st = ai_attr_int(n, "max_gram_length", -1, &max_n)) ||
        (st = ai_attr_int(n, "max_skip_count", -1, &skip)) ||
        (st = ai_attr_string(n, "mode", NULL, &mode)))
        return st;
    if (!counts || !indexes || !pool || n_pool < 1 || min_n < 1 || max_n < min_n || skip < 0 || !mode)
        return ai_node_error(n, AI_ERR_VALUE, "ngram_counts, ngram_indexes, pool_int64s, "
                             "mode, min_gram_length >= 1, max_gram_length >= min_gram_length "
                             "and max_skip_count >= 0 are required");
    int m = strcmp(mode, "TF") == 0 ? TF_TF : strcmp(mode, "IDF") == 0 ? TF_IDF
            : strcmp(mode, "TFIDF") == 0 ? TF_TFIDF : -1;
    if (m < 0)
        return ai_node_error(n, AI_ERR_VALUE, "mode '%s'; TF, IDF or TFIDF expected", mode);
    if (n_pool < 0)
        n_pool = 0;
    tfidf_params *t = calloc(1, sizeof *t + 3 * sizeof(int64_t) * (size_t)(n_pool + 1));
    if (!t)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = t;
    t->start = (int64_t *)(t + 1);
    t->size = t->start + n_pool + 1;
    t->col = t->size + n_pool + 1;
    t->mode = m;
    t->min_n = min_n, t->max_n = max_n, t->max_skip = skip, t->pool = pool;
    if ((st = ai_attr_floats(n, "weights", &t->weights, &t->n_weights)))
        return st;
    for (int64_t i = 0; i < n_indexes; i++) {
        if (indexes[i] < 0 || indexes[i] >= INT32_MAX)
            return ai_node_error(n, AI_ERR_VALUE, "ngram_indexes[%lld] is %lld; 0 to %d "
                                 "expected", (long long)i, (long long)indexes[i], INT32_MAX - 1);
        if (indexes[i] + 1 > t->out_size)
            t->out_size = indexes[i] + 1;
    }
    if (t->weights && t->n_weights < t->out_size)
        return ai_node_error(n, AI_ERR_VALUE, "weights has %lld values for %lld columns",
                             (long long)t->n_weights, (long long)t->out_size);
    int64_t id = 0;
    for (int64_t k = 0; k < n_counts; k++) {
        int64_t lo = counts[k], hi = k + 1 < n_counts ? counts[k + 1] : n_pool, size = k + 1;
        if (lo < 0 || hi < lo || hi > n_pool)
            return ai_node_error(n, AI_ERR_VALUE, "ngram_counts[%lld] = %lld is out of the "
                                 "pool's %lld items", (long long)k, (long long)lo,
                                 (long long)n_pool);
        for (int64_t at = lo; at + size <= hi; at += size, id++) {
            if (size < min_n || size > max_n)
                continue;
            if (id >= n_indexes)
                return ai_node_error(n, AI_ERR_VALUE, "ngram_indexes has %lld entries; the "
                                     "pool has more n-grams", (long long)n_indexes);
            /* a repeated n-gram counts at its last place */
            for (int64_t j = 0; j < t->n_grams; j++)
                if (t->size[j] == size &&
                    memcmp(pool + t->start[j], pool + at, sizeof(int64_t) * (size_t)size) == 0)
                    t->size[j] = 0;
            t->start[t->n_grams] = at, t->size[t->n_grams] = size;
            t->col[t->n_grams++] = indexes[id];
        }
    }
    return AI_OK;
}

static ai_status tfidf_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const tfidf_params *t = c->node->params;
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_I32 && x->dtype != AI_I64)
        return ai_node_error(c->node, AI_ERR_TYPE, "X is %s; int32 or int64 token ids "
                             "expected", ai_dtype_name(x->dtype));
    if (x->ndim > 2 || (x->ndim == 2 && x->shape[0] < 1))
        return ai_node_error(c->node, AI_ERR_VALUE, "X has rank %d; [C] or [N, C] with N >= 1 "
                             "expected", x->ndim);
    out[0].dtype = AI_F32;
    out[0].ndim = x->ndim == 2 ? 2 : 1;
    out[0].shape[0] = x->ndim == 2 ? x->shape[0] : t->out_size;
    out[0].shape[out[0].ndim - 1] = t->out_size;
    *ws = sizeof(int64_t) * (size_t)t->out_size;
    return AI_OK;
}

/* Occurrences of n-gram g in row x[0..C) with items `step` apart. */
static int64_t tfidf_count(const tfidf_params *t, int64_t g, const ai_tensor *xt,
                           int64_t row, int64_t C, int64_t step)
{
    const int64_t size = t->size[g], *gram = t->pool + t->start[g];
    int64_t n = 0;
    for (int64_t s = 0; s + step * (size - 1) < C; s++) {
        int64_t k = 0;
        while (k < size && ai_tensor_get_flat_i64(xt, row * C + s + k * step) == gram[k])
            k++;
        n += k == size;
    }
    return n;
}

static ai_status tfidf_forward(ai_ctx *c)
{
    const tfidf_params *t = c->node->params;
    const ai_tensor *x = c->in[0];
    const int64_t rows = x->ndim == 2 ? x->shape[0] : 1;
    const int64_t C = x->ndim == 0 ? 1 : x->shape[x->ndim - 1];
    int64_t *freq = c->workspace;
    float *y = c->out[0]->data;
    for (int64_t r = 0; r < rows; r++) {
        memset(freq, 0, sizeof(int64_t) * (size_t)t->out_size);
        for (int64_t g = 0; g < t->n_grams; g++) {
            if (!t->size[g])
                continue;
            /* (a skip of C or more leaves no room for a second item) */
            int64_t steps = t->size[g] == 1 ? 1 : t->max_skip < C ? t->max_skip + 1 : C;
            for (int64_t step = 1; step <= steps; step++)
                freq[t->col[g]] += tfidf_count(t, g, x, r, C, step);
        }
        for (int64_t j = 0; j < t->out_size; j++) {
            double w = t->weights ? t->weights[j] : 1.0;
            double f = (double)freq[j];
            y[r * t->out_size + j] = (float)(t->mode == TF_TF ? f
                                             : t->mode == TF_IDF ? (f > 0 ? w : 0.0)
                                                                 : w * f);
        }
    }
    return AI_OK;
}

static const ai_op_def op_tfidf = {"TfIdfVectorizer", "", 1, 1, 1, 1, 0, tfidf_init,
                                   tfidf_shape, tfidf_forward, NULL};

const ai_op_def *const ai_ops_text[] = {&op_tfidf, NULL};
