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

/* One parameter's update, split by element ranges on the thread pool. */
typedef struct {
    const ai_sgd_config *cfg;
    ai_tensor *p, *buf;
    const ai_tensor *g;
    bool first;
} sgd_job;

static void sgd_half(const sgd_job *j, int64_t lo, int64_t hi)
{
    const ai_dtype dt = j->p->dtype;
    float p[256], g[256], buf[256];
    for (int64_t i = lo; i < hi; i += 256) {
        const int64_t m = hi - i < 256 ? hi - i : 256;
        uint16_t *hp = (uint16_t *)j->p->data + i, *hb = j->buf ? (uint16_t *)j->buf->data + i
                                                                 : NULL;
        ai_half_to_f32(dt, hp, p, m);
        ai_half_to_f32(dt, (const uint16_t *)j->g->data + i, g, m);
        if (hb)
            ai_half_to_f32(dt, hb, buf, m);
        sgd_f32(j->cfg, m, p, g, hb ? buf : NULL, j->first);
        ai_f32_to_half(dt, p, hp, m);
        if (hb)
            ai_f32_to_half(dt, buf, hb, m);
    }
}

static void sgd_range(void *ctx, int64_t lo, int64_t hi)
{
    const sgd_job *j = ctx;
    if (ai_dtype_is_half(j->p->dtype))
        sgd_half(j, lo, hi);
    else if (j->p->dtype == AI_F32)
        sgd_f32(j->cfg, hi - lo, (float *)j->p->data + lo, (const float *)j->g->data + lo,
                j->buf ? (float *)j->buf->data + lo : NULL, j->first);
    else
        sgd_f64(j->cfg, hi - lo, (double *)j->p->data + lo, (const double *)j->g->data + lo,
                j->buf ? (double *)j->buf->data + lo : NULL, j->first);
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
    for (int i = 0; i < n; i++) {
        sgd_job j = {cfg, p[i], buf ? buf[i] : NULL, g[i], !*started};
        ai_parallel_for(ai_tensor_numel(p[i]), AI_GRAIN_ELEMS, sgd_range, &j);
    }
    *started = true;
    return AI_OK;
}

ai_status ai_zero_tensors(int n, ai_tensor *const *t)
{
    for (int i = 0; i < n; i++)
        if (!ai_tensor_is_contiguous(t[i]) || (t[i]->flags & AI_TENSOR_READONLY))
            return ai_error(AI_ERR_VALUE, "tensor %d is not contiguous and writable", i);
    for (int i = 0; i < n; i++)
        if (t[i]->data)
            memset(t[i]->data, 0, ai_tensor_nbytes(t[i]));
    return AI_OK;
}
