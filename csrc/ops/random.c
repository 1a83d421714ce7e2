/*
 * random.c — operators that draw random numbers: RandomUniform and
 * RandomNormal (of the `shape` attribute), RandomUniformLike and
 * RandomNormalLike (of the input's shape), Multinomial (class indices drawn
 * from each row of unnormalised log-probabilities), Bernoulli (1 with the
 * probability its input gives, else 0). Bernoulli is native: its ONNX
 * function body (onnx 1.23), Greater(RandomUniformLike(p), p), gives 1 with
 * probability 1 - p.
 *
 * ONNX leaves the generator to the runtime: the values follow the
 * distribution, not numpy's or ONNX Runtime's draws. The stream is
 * splitmix64, as Dropout's: element i of the k-th forward of a node is a
 * function of (seed, k, i), so every forward draws new values and a graph
 * built again draws the same sequence. The seed is the `seed` attribute's
 * (the same seed, the same values), else the graph's seed mixed with the
 * node's name. Outputs float16, float32 or float64 (`dtype`, an ONNX code;
 * the Like operators default to their input's dtype), Multinomial's int32
 * or int64, Bernoulli's any engine dtype (default: its input's). No
 * gradient flows (ONNX: not differentiable); never folded.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "movement.h"

typedef enum { UNIFORM, NORMAL, MULTINOMIAL, BERNOULLI } random_kind;

typedef struct {
    random_kind kind;
    bool like;         /* of the input's shape (the Like forms, Bernoulli) */
    ai_dtype dtype;    /* output dtype */
    bool has_dtype;    /* the dtype attribute given (else the Like input's) */
    double a, b;       /* low, high (uniform); mean, scale (normal) */
    uint64_t seed;
    int64_t ndim, shape[AI_MAX_DIMS]; /* RandomUniform / RandomNormal */
    int64_t sample_size;              /* Multinomial */
    uint64_t calls;    /* forwards so far (the stream's position) */
} random_params;

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* uniform in [0, 1), 53 random bits */
static double uniform01(uint64_t r) { return (double)(r >> 11) * 0x1p-53; }

static ai_status random_init(ai_node *n)
{
    random_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    p->kind = strstr(n->op_type, "Normal") ? NORMAL
              : strcmp(n->op_type, "Multinomial") == 0 ? MULTINOMIAL
              : strcmp(n->op_type, "Bernoulli") == 0   ? BERNOULLI
                                                       : UNIFORM;
    p->like = strstr(n->op_type, "Like") || p->kind == BERNOULLI;
    int64_t code;
    ai_status st = ai_attr_int(n, "dtype", -1, &code);
    if (st)
        return st;
    p->has_dtype = code != -1 || !p->like;
    if (code == -1)
        code = p->kind == MULTINOMIAL ? 6 : 1; /* int32; float */
    if (p->has_dtype) {
        bool ok = ai_dtype_from_onnx(code, &p->dtype);
        if (ok && p->kind != BERNOULLI)
            ok = p->kind == MULTINOMIAL ? p->dtype == AI_I32 || p->dtype == AI_I64
                                        : ai_dtype_is_float(p->dtype);
        if (!ok)
            return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "dtype %lld is not supported (%s)",
                                 (long long)code,
                                 p->kind == MULTINOMIAL ? "int32 or int64"
                                 : p->kind == BERNOULLI ? "an engine data type"
                                                        : "float16, float32 or float64");
    }
    if (p->kind == NORMAL) {
        st = ai_attr_float(n, "mean", 0.0, &p->a);
        if (!st)
            st = ai_attr_float(n, "scale", 1.0, &p->b);
    } else if (p->kind == UNIFORM) {
        st = ai_attr_float(n, "low", 0.0, &p->a);
        if (!st)
            st = ai_attr_float(n, "high", 1.0, &p->b);
    } else if (p->kind == MULTINOMIAL) {
        st = ai_attr_int(n, "sample_size", 1, &p->sample_size);
        if (!st && p->sample_size < 1)
            return ai_node_error(n, AI_ERR_VALUE, "sample_size is %lld; at least 1 expected",
                                 (long long)p->sample_size);
    }
    if (st)
        return st;
    if (!(isfinite(p->a) && isfinite(p->b)))
        return ai_node_error(n, AI_ERR_VALUE, "%s must be finite",
                             p->kind == NORMAL ? "mean and scale" : "low and high");
    double seed;
    if (ai_node_attr(n, "seed")) {
        if ((st = ai_attr_float(n, "seed", 0.0, &seed)))
            return st;
        memcpy(&p->seed, &seed, sizeof seed);
        p->seed = splitmix64(p->seed);
    } else { /* the graph's seed, with the node's name (FNV-1a) */
        uint64_t h = 0xCBF29CE484222325ull;
        for (const char *s = n->name; *s; s++)
            h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
        p->seed = ~h; /* mixed with the graph's seed at each forward */
    }
    if (!p->like && p->kind != MULTINOMIAL) {
        const int64_t *shape;
        if ((st = ai_attr_ints(n, "shape", &shape, &p->ndim)))
            return st;
        if (p->ndim < 0)
            return ai_node_error(n, AI_ERR_VALUE, "the shape attribute is missing");
        if (p->ndim > AI_MAX_DIMS)
            return ai_node_error(n, AI_ERR_VALUE, "shape has %lld dims; at most %d",
                                 (long long)p->ndim, AI_MAX_DIMS);
        for (int64_t i = 0; i < p->ndim; i++) {
            if (shape[i] < 0)
                return ai_node_error(n, AI_ERR_VALUE, "shape[%lld] is %lld", (long long)i,
                                     (long long)shape[i]);
            p->shape[i] = shape[i];
        }
    }
    return AI_OK;
}

static ai_status random_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const random_params *p = c->node->params;
    if (!p->like)
        return ai_set_meta(&out[0], p->dtype, (int)p->ndim, p->shape);
    const ai_dtype in = c->in[0]->dtype;
    if (p->kind == BERNOULLI && !ai_dtype_is_float(in))
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float16, float32 or float64 "
                             "probabilities expected", ai_dtype_name(in));
    ai_dtype dt = p->has_dtype ? p->dtype : in;
    if (!ai_dtype_is_float(dt) && p->kind != BERNOULLI)
        return ai_node_error(c->node, AI_ERR_TYPE, "the input is %s and no dtype is given; "
                             "the output is float16, float32 or float64",
                             ai_dtype_name(dt));
    return ai_set_meta(&out[0], dt, c->in[0]->ndim, c->in[0]->shape);
}

/* The stream of this forward: a new one at each call. */
static uint64_t stream_base(const ai_ctx *c)
{
    random_params *p = c->node->params;
    const bool seeded = ai_node_attr(c->node, "seed") != NULL;
    return splitmix64((seeded ? p->seed : p->seed ^ c->g->seed) + 0x632BE59BD9B4E019ull *
                      p->calls++);
}

static ai_status random_forward(ai_ctx *c)
{
    const random_params *p = c->node->params;
    ai_tensor *y = c->out[0];
    const int64_t n = ai_tensor_numel(y);
    const uint64_t base = stream_base(c);
    const bool normal = p->kind == NORMAL;
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (normal) { /* Box-Muller: u1 in (0, 1], u2 in [0, 1) */
            const double u1 = 1.0 - uniform01(splitmix64(base + 2 * (uint64_t)i));
            const double u2 = uniform01(splitmix64(base + 2 * (uint64_t)i + 1));
            v = p->a + p->b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        } else {
            v = p->a + (p->b - p->a) * uniform01(splitmix64(base + (uint64_t)i));
        }
        switch (y->dtype) {
        case AI_F32: ((float *)y->data)[i] = (float)v; break;
        case AI_F64: ((double *)y->data)[i] = v; break;
        default: ((uint16_t *)y->data)[i] = ai_f32_to_f16((float)v); /* float16 */
        }
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- Bernoulli */

/* y[i] = 1 with probability x[i] (u < x[i], u uniform in [0, 1)), else 0. */
static ai_status bernoulli_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    ai_tensor *y = c->out[0];
    const int64_t n = ai_tensor_numel(y);
    const uint64_t base = stream_base(c);
    const size_t es = ai_dtype_size(y->dtype);
    for (int64_t i = 0; i < n; i++) {
        const double prob = x->dtype == AI_F16 ? ai_f16_to_f32(((const uint16_t *)x->data)[i])
                                               : ai_float_at(x, i);
        const bool one = uniform01(splitmix64(base + (uint64_t)i)) < prob;
        char *at = (char *)y->data + (size_t)i * es;
        switch (y->dtype) {
        case AI_F32: *(float *)at = one; break;
        case AI_F64: *(double *)at = one; break;
        case AI_F16: *(uint16_t *)at = ai_f32_to_f16(one); break;
        case AI_I16: *(int16_t *)at = one; break;
        case AI_I32: *(int32_t *)at = one; break;
        case AI_I64: *(int64_t *)at = one; break;
        case AI_BOOL: *(bool *)at = one; break;
        default: *(uint8_t *)at = one; /* int8, uint8 */
        }
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- Multinomial */

/* input (batch, classes) of unnormalised log-probabilities; output (batch,
 * sample_size) of class indices, each drawn independently with probability
 * exp(x_j) / sum_k exp(x_k). Workspace: the row's cumulative sums. */
static ai_status multinomial_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const random_params *p = c->node->params;
    const ai_tensor *x = c->in[0];
    if (!ai_dtype_is_float(x->dtype) || x->dtype == AI_F16)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    if (x->ndim != 2 || x->shape[1] < 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "input must be (batch, classes) with at "
                             "least one class, got rank %d", x->ndim);
    *ws = (size_t)x->shape[1] * sizeof(double);
    const int64_t shape[2] = {x->shape[0], p->sample_size};
    return ai_set_meta(&out[0], p->dtype, 2, shape);
}

static ai_status multinomial_forward(ai_ctx *c)
{
    const random_params *p = c->node->params;
    const ai_tensor *x = c->in[0];
    ai_tensor *y = c->out[0];
    const int64_t batch = x->shape[0], classes = x->shape[1];
    double *cdf = c->workspace;
    const uint64_t base = stream_base(c);
    for (int64_t b = 0; b < batch; b++) {
        double max = -INFINITY, total = 0;
        for (int64_t j = 0; j < classes; j++)
            max = fmax(max, ai_float_at(x, b * classes + j));
        for (int64_t j = 0; j < classes; j++) {
            total += isfinite(max) ? exp(ai_float_at(x, b * classes + j) - max) : 0.0;
            cdf[j] = total;
        }
        if (!(total > 0 && isfinite(total)))
            return ai_node_error(c->node, AI_ERR_VALUE, "row %lld of the input has no finite "
                                 "largest log-probability", (long long)b);
        for (int64_t s = 0; s < p->sample_size; s++) {
            const double u = total * uniform01(splitmix64(base + (uint64_t)(b * p->sample_size
                                                                            + s)));
            int64_t lo = 0, hi = classes - 1; /* the first j with cdf[j] > u */
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (cdf[mid] > u)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            const int64_t at = b * p->sample_size + s;
            if (y->dtype == AI_I32)
                ((int32_t *)y->data)[at] = (int32_t)lo;
            else
                ((int64_t *)y->data)[at] = lo;
        }
    }
    return AI_OK;
}

/* ---------------------------------------------------------------- registry */

#define RANDOM_OP(var, name, n_in, shape_fn, forward_fn)                                    \
    static const ai_op_def var = {name, "", n_in, n_in, 1, 1, AI_OP_NO_FOLD, random_init,  \
                                  shape_fn, forward_fn, NULL};
RANDOM_OP(op_random_uniform, "RandomUniform", 0, random_shape, random_forward)
RANDOM_OP(op_random_normal, "RandomNormal", 0, random_shape, random_forward)
RANDOM_OP(op_random_uniform_like, "RandomUniformLike", 1, random_shape, random_forward)
RANDOM_OP(op_random_normal_like, "RandomNormalLike", 1, random_shape, random_forward)
RANDOM_OP(op_multinomial, "Multinomial", 1, multinomial_shape, multinomial_forward)
RANDOM_OP(op_bernoulli, "Bernoulli", 1, random_shape, bernoulli_forward)
#undef RANDOM_OP

const ai_op_def *const ai_ops_random[] = {&op_random_uniform, &op_random_normal,
                                          &op_random_uniform_like, &op_random_normal_like,
                                          &op_multinomial, &op_bernoulli, NULL};
