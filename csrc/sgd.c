/*
 * sgd.c — stochastic gradient descent with torch.optim.SGD semantics:
 *
 *   d = (maximize ? -g : g) + weight_decay * p
 *   buf = d                                    (first step)
 *   buf = momentum * buf + (1 - dampening) * d  (later steps)
 *   d = nesterov ? d + momentum * buf : buf     (when momentum != 0)
 *   p -= lr * d
 *
 * computed in the parameter's type, one flat loop per parameter. A float16
 * or bfloat16 parameter (and its momentum buffer) is computed in float32,
 * 256 elements at a time, and rounded once per step: torch keeps half
 * parameters too, but rounds after each of the operations above.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "kernels/simd.h"
#include "parallel.h"

/* FMA like torch's vectorised kernels (a.add_(b, alpha) is fmadd(b, alpha, a)),
 * so that both sides round alike. */
#define DEFINE_SGD(NAME, T, FMA)                                                      \
    AI_FMA_CLONES static void NAME(const ai_sgd_config *c, int64_t n, T *p,           \
                                   const T *g, T *buf, bool first)                    \
    {                                                                                 \
        const T wd = (T)c->weight_decay, mom = (T)c->momentum;                        \
        const T damp = (T)(1.0 - c->dampening);                                       \
        const T lr = (T)-c->lr;                                                       \
        const bool maximize = c->maximize, nesterov = c->nesterov;                    \
        if (!maximize && wd == 0 && mom == 0) { /* plain SGD: vectorises */        \
            for (int64_t i = 0; i < n; i++)                                           \
                p[i] = FMA(g[i], lr, p[i]);                                           \
            return;                                                                   \
        }                                                                             \
        for (int64_t i = 0; i < n; i++) {                                             \
            T d = maximize ? -g[i] : g[i];                                            \
            if (wd != 0)                                                              \
                d = FMA(p[i], wd, d);                                                 \
            if (mom != 0) {                                                           \
                buf[i] = first ? d : FMA(d, damp, buf[i] * mom);                      \
                d = nesterov ? FMA(buf[i], mom, d) : buf[i];                          \
            }                                                                         \
            p[i] = FMA(d, lr, p[i]);                                                  \
        }                                                                             \
    }

DEFINE_SGD(sgd_f32, float, fmaf)
DEFINE_SGD(sgd_f64, double, fma)

/* The update of all parameters as one job on the thread pool, split by
 * ranges of their elements counted end to end (a part may span several
 * parameters): one job per step rather than one per parameter, and the
 * small ones (biases, norms) are spread too. Elements are independent, so
 * the values never depend on the split. */
typedef struct {
    const ai_sgd_config *cfg;
    ai_tensor *const *p, *const *buf;
    const ai_tensor *const *g;
    const int64_t *start; /* start[i]: parameter i's first element; start[n]: total */
    int n;
    bool first;
} sgd_job;

static void sgd_half(const sgd_job *j, int i, int64_t lo, int64_t hi)
{
    const ai_dtype dt = j->p[i]->dtype;
    float p[256], g[256], buf[256];
    for (int64_t k = lo; k < hi; k += 256) {
        const int64_t m = hi - k < 256 ? hi - k : 256;
        uint16_t *hp = (uint16_t *)j->p[i]->data + k;
        uint16_t *hb = j->buf && j->buf[i] ? (uint16_t *)j->buf[i]->data + k : NULL;
        ai_half_to_f32(dt, hp, p, m);
        ai_half_to_f32(dt, (const uint16_t *)j->g[i]->data + k, g, m);
        if (hb)
            ai_half_to_f32(dt, hb, buf, m);
        sgd_f32(j->cfg, m, p, g, hb ? buf : NULL, j->first);
        ai_f32_to_half(dt, p, hp, m);
        if (hb)
            ai_f32_to_half(dt, buf, hb, m);
    }
}

/* The first parameter whose elements reach past `at` (start is increasing). */
static int first_param(const int64_t *start, int n, int64_t at)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (start[mid + 1] <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void sgd_range(void *ctx, int64_t lo, int64_t hi)
{
    const sgd_job *j = ctx;
    for (int i = first_param(j->start, j->n, lo); i < j->n && j->start[i] < hi; i++) {
        const int64_t a = (lo > j->start[i] ? lo : j->start[i]) - j->start[i];
        const int64_t b = (hi < j->start[i + 1] ? hi : j->start[i + 1]) - j->start[i];
        ai_tensor *p = j->p[i], *buf = j->buf ? j->buf[i] : NULL;
        if (a >= b)
            continue;
        if (ai_dtype_is_half(p->dtype))
            sgd_half(j, i, a, b);
        else if (p->dtype == AI_F32)
            sgd_f32(j->cfg, b - a, (float *)p->data + a, (const float *)j->g[i]->data + a,
                    buf ? (float *)buf->data + a : NULL, j->first);
        else
            sgd_f64(j->cfg, b - a, (double *)p->data + a, (const double *)j->g[i]->data + a,
                    buf ? (double *)buf->data + a : NULL, j->first);
    }
}

ai_status ai_sgd_step(const ai_sgd_config *cfg, int n, ai_tensor *const *p,
                      const ai_tensor *const *g, ai_tensor *const *buf, bool *started)
{
    if (!(cfg->lr >= 0))
        return ai_error(AI_ERR_VALUE, "invalid learning rate %g", cfg->lr);
    if (!(cfg->momentum >= 0) || !(cfg->weight_decay >= 0))
        return ai_error(AI_ERR_VALUE, "momentum and weight_decay must be >= 0");
    if (cfg->nesterov && (cfg->momentum <= 0 || cfg->dampening != 0))
        return ai_error(AI_ERR_VALUE, "Nesterov momentum requires a momentum and zero "
                        "dampening");
    for (int i = 0; i < n; i++) {
        int64_t np = ai_tensor_numel(p[i]);
        if (!ai_dtype_is_float(p[i]->dtype))
            return ai_error(AI_ERR_TYPE, "parameter %d is %s; SGD takes float types",
                            i, ai_dtype_name(p[i]->dtype));
        if (g[i]->dtype != p[i]->dtype || ai_tensor_numel(g[i]) != np ||
            !ai_tensor_is_contiguous(p[i]) || !ai_tensor_is_contiguous(g[i]))
            return ai_error(AI_ERR_VALUE, "gradient %d does not match its parameter", i);
        if (cfg->momentum != 0 &&
            (!buf || !buf[i] || buf[i]->dtype != p[i]->dtype || ai_tensor_numel(buf[i]) != np ||
             !ai_tensor_is_contiguous(buf[i])))
            return ai_error(AI_ERR_VALUE, "momentum buffer %d does not match its parameter", i);
        if (p[i]->flags & AI_TENSOR_READONLY)
            return ai_error(AI_ERR_VALUE, "parameter %d is read-only", i);
    }
    int64_t *start = malloc(sizeof *start * (size_t)(n + 1));
    if (!start)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    start[0] = 0;
    for (int i = 0; i < n; i++)
        start[i + 1] = start[i] + ai_tensor_numel(p[i]);
    sgd_job j = {cfg, p, buf, g, start, n, !*started};
    ai_parallel_for(start[n], AI_GRAIN_ELEMS, sgd_range, &j);
    free(start);
    *started = true;
    return AI_OK;
}

/* Zeroing, as one job over the tensors' bytes counted end to end (the same
 * split as the update above). */
typedef struct {
    ai_tensor *const *t;
    const int64_t *start; /* in bytes */
    int n;
} zero_job;

static void zero_range(void *ctx, int64_t lo, int64_t hi)
{
    const zero_job *j = ctx;
    for (int i = first_param(j->start, j->n, lo); i < j->n && j->start[i] < hi; i++) {
        const int64_t a = (lo > j->start[i] ? lo : j->start[i]) - j->start[i];
        const int64_t b = (hi < j->start[i + 1] ? hi : j->start[i + 1]) - j->start[i];
        if (a < b)
            memset((char *)j->t[i]->data + a, 0, (size_t)(b - a));
    }
}

ai_status ai_zero_tensors(int n, ai_tensor *const *t)
{
    for (int i = 0; i < n; i++)
        if (!ai_tensor_is_contiguous(t[i]) || (t[i]->flags & AI_TENSOR_READONLY))
            return ai_error(AI_ERR_VALUE, "tensor %d is not contiguous and writable", i);
    if (n <= 0)
        return AI_OK;
    int64_t *start = malloc(sizeof *start * (size_t)(n + 1));
    if (!start)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    start[0] = 0;
    for (int i = 0; i < n; i++) /* a tensor without data has no bytes */
        start[i + 1] = start[i] + (t[i]->data ? (int64_t)ai_tensor_nbytes(t[i]) : 0);
    zero_job j = {t, start, n};
    ai_parallel_for(start[n], AI_GRAIN_ELEMS * (int64_t)sizeof(float), zero_range, &j);
    free(start);
    return AI_OK;
}
