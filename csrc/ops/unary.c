/*
 * unary.c — elementwise operators of one tensor: activations (Relu,
 * LeakyRelu, Sigmoid, Tanh, Gelu, Softplus, HardSwish, HardSigmoid, Elu,
 * Selu, Celu, Softsign, Mish, Swish, ThresholdedRelu, Shrink) and math
 * functions (trigonometric and hyperbolic among them), Clip, Identity,
 * Dropout, Cast; Not, IsNaN, IsInf; BitwiseNot.
 *
 * Each function is one line of forward and one of derivative, computed in
 * double and stored in the tensor's type (float32 or float64). Backward
 * accumulates dx += dy * f'(x) (f' may use the saved output y), or assigns
 * dx = dy * f'(x) on the gradient's first write (AI_OP_GRAD_ASSIGN).
 * Derivatives at kinks follow torch: relu'(0) = 0, |x|'(0) = 0, clamp passes
 * the gradient at its bounds, floor/ceil/round have zero gradient.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../kernels/fastmath.h"
#include "../kernels/simd.h"
#include "../parallel.h"

typedef struct {
    double alpha; /* LeakyRelu slope, Elu/Celu/Selu/Swish alpha, HardSigmoid slope,
                     ThresholdedRelu threshold */
    double beta;  /* HardSigmoid offset */
    double gamma; /* Selu scale */
    double lambd, bias; /* Shrink */
    int tanh;     /* Gelu approximate == "tanh" */
} unary_params;

static const double SQRT1_2 = 0.70710678118654752440;
static const double SQRT_2_PI = 0.79788456080286535588; /* sqrt(2/pi) */
static const double INV_SQRT_2PI = 0.39894228040143267794;
static const double TWO_INV_SQRT_PI = 1.12837916709551257390;

/* The operands of one elementwise job: x, y (forward's input and output),
 * and in backward dy, dx; split by element ranges on the thread pool. */
typedef struct {
    const unary_params *P;
    bool f64, assign; /* assign: backward writes dx instead of adding to it */
    const void *x, *dy;
    void *y, *dx;
} unary_job;

static unary_job unary_job_of(const ai_ctx *c, bool backward)
{
    return (unary_job){c->node->params, c->in[0]->dtype == AI_F64,
                       backward && c->din_assign[0], c->in[0]->data,
                       backward ? c->dout[0]->data : NULL, c->out[0]->data,
                       backward ? c->din[0]->data : NULL};
}

/* One backward loop body for both modes: dx[i] = or += GRAD, in two loops
 * (a branch per element would keep them from vectorising). */
#define GRAD_LOOP(ASSIGN, N, DX, GRAD)                                                 \
    do {                                                                               \
        if (ASSIGN)                                                                    \
            for (int64_t i = 0; i < (N); i++)                                          \
                (DX)[i] = (GRAD);                                                      \
        else                                                                           \
            for (int64_t i = 0; i < (N); i++)                                          \
                (DX)[i] += (GRAD);                                                     \
    } while (0)

static double gelu_tanh_deriv(double x)
{
    double u = SQRT_2_PI * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * SQRT_2_PI * (1 + 3 * 0.044715 * x * x);
}

/* float32 Gelu(tanh) as x s with s = 1 / (1 + exp(-2u)) = (1 + tanh(u)) / 2,
 * u = sqrt(2/pi) (x + 0.044715 x^3): no cancellation in 1 + tanh(u) for
 * u << 0; its derivative s + x s (1 - s) 2u'. Both vectorise (ai_expf). */
static inline float gelu_tanh_sf(float xf)
{
    return 1.0f / (1.0f + ai_expf(-2.0f * (float)SQRT_2_PI * (xf + 0.044715f * xf * xf * xf)));
}

static inline float gelu_tanh_deriv_f(float xf)
{
    const float s = gelu_tanh_sf(xf);
    return s + xf * s * (1.0f - s) * 2.0f * (float)SQRT_2_PI * (1.0f + 3 * 0.044715f * xf * xf);
}

/* FWD(x) computes y; DER(x, y) is dy/dx, in double; P is the node's
 * unary_params. UNARY_KERNELS2 gives float32 its own expressions FWD32 and
 * DER32 of xf, yf (floats), for functions where float arithmetic gives the
 * same values (selects, sqrt, one rounding) or stays within torch's own float
 * accuracy (ai_expf), and vectorises; the float64 path keeps FWD and DER.
 * Where PASS(x) is false the gradient is not dy * DER but nothing at all, as
 * torch selects it (ReLU below 0, Floor): a NaN or Inf in dy stays out;
 * UNARY_KERNELS2_PASS2 gives float32 its own PASS32 of xf. */
#define UNARY_KERNELS(NAME, FWD, DER) UNARY_KERNELS2(NAME, FWD, DER, FWD, DER)
#define UNARY_KERNELS_PASS(NAME, FWD, DER, PASS) \
    UNARY_KERNELS2_PASS(NAME, FWD, DER, FWD, DER, PASS)
#define UNARY_KERNELS2(NAME, FWD32, DER32, FWD, DER) \
    UNARY_KERNELS2_PASS(NAME, FWD32, DER32, FWD, DER, 1)
#define UNARY_KERNELS2_PASS(NAME, FWD32, DER32, FWD, DER, PASS) \
    UNARY_KERNELS2_PASS2(NAME, FWD32, DER32, PASS, FWD, DER, PASS)
#define UNARY_KERNELS2_PASS2(NAME, FWD32, DER32, PASS32, FWD, DER, PASS)              \
    AI_WIDE_CLONES static void NAME##_f32_fwd(const unary_params *P_, float *yp,      \
                                              const float *xp, int64_t n)             \
    {                                                                                  \
        const unary_params Pv = *P_, *P = &Pv; /* a copy: no aliasing with yp */       \
        (void)P;                                                                       \
        for (int64_t i = 0; i < n; i++) {                                              \
            const float xf = xp[i];                                                    \
            const double x = xf;                                                       \
            (void)x;                                                                   \
            yp[i] = (float)(FWD32);                                                    \
        }                                                                              \
    }                                                                                  \
    static inline float NAME##_f32_grad(const unary_params *P, float xf, float yf,     \
                                        float dyf)                                     \
    {                                                                                  \
        const double x = xf, y = yf;                                                   \
        (void)P;                                                                       \
        (void)x;                                                                       \
        (void)y;                                                                       \
        (void)xf;                                                                      \
        (void)yf;                                                                      \
        return (PASS32) ? (float)(dyf * (DER32)) : 0.0f;                               \
    }                                                                                  \
    AI_WIDE_CLONES static void NAME##_f32_bwd(const unary_params *P_, float *dx,      \
                                              const float *xp, const float *yp,       \
                                              const float *dy, int64_t n,             \
                                              bool assign)                            \
    {                                                                                  \
        const unary_params Pv = *P_, *P = &Pv;                                         \
        GRAD_LOOP(assign, n, dx, NAME##_f32_grad(P, xp[i], yp[i], dy[i]));             \
    }                                                                                  \
    static inline double NAME##_f64_grad(const unary_params *P, double x, double y,    \
                                         double dyd)                                   \
    {                                                                                  \
        (void)P;                                                                       \
        (void)x;                                                                       \
        (void)y;                                                                       \
        return (PASS) ? dyd * (DER) : 0.0;                                             \
    }                                                                                  \
    static void NAME##_fwd_range(void *ctx, int64_t lo, int64_t hi)                    \
    {                                                                                  \
        const unary_job *j = ctx;                                                      \
        const unary_params *P = j->P;                                                  \
        if (!j->f64) {                                                                 \
            NAME##_f32_fwd(P, (float *)j->y + lo, (const float *)j->x + lo, hi - lo);  \
            return;                                                                    \
        }                                                                              \
        const double *xp = j->x;                                                       \
        double *yp = j->y;                                                             \
        for (int64_t i = lo; i < hi; i++) {                                            \
            double x = xp[i];                                                          \
            yp[i] = (FWD);                                                             \
        }                                                                              \
    }                                                                                  \
    static void NAME##_bwd_range(void *ctx, int64_t lo, int64_t hi)                    \
    {                                                                                  \
        const unary_job *j = ctx;                                                      \
        const unary_params *P = j->P;                                                  \
        if (!j->f64) {                                                                 \
            NAME##_f32_bwd(P, (float *)j->dx + lo, (const float *)j->x + lo,           \
                           (const float *)j->y + lo, (const float *)j->dy + lo,        \
                           hi - lo, j->assign);                                        \
            return;                                                                    \
        }                                                                              \
        const double *xp = (const double *)j->x + lo, *yp = (const double *)j->y + lo;  \
        const double *dy = (const double *)j->dy + lo;                                 \
        double *dx = (double *)j->dx + lo;                                             \
        GRAD_LOOP(j->assign, hi - lo, dx, NAME##_f64_grad(P, xp[i], yp[i], dy[i]));    \
    }                                                                                  \
    static ai_status NAME##_forward(ai_ctx *c)                                         \
    {                                                                                  \
        unary_job j = unary_job_of(c, false);                                          \
        ai_parallel_for(ai_tensor_numel(c->in[0]), AI_GRAIN_ELEMS, NAME##_fwd_range, &j); \
        return AI_OK;                                                                  \
    }                                                                                  \
    static ai_status NAME##_backward(ai_ctx *c)                                        \
    {                                                                                  \
        unary_job j = unary_job_of(c, true);                                           \
        ai_parallel_for(ai_tensor_numel(c->in[0]), AI_GRAIN_ELEMS, NAME##_bwd_range, &j); \
        return AI_OK;                                                                  \
    }

/* the gradient passes where y = relu(x) > 0 or is NaN: exactly where x
 * does, so backward reads y alone (AI_OP_BWD_NO_X: x may be dead by then) */
UNARY_KERNELS2_PASS(relu, (xf > 0 || xf != xf) ? xf : 0.0f, 1.0f, (x > 0 || x != x) ? x : 0.0,
                    1.0, !(y <= 0))
/* float32 LeakyRelu as torch computes it: the slope rounded to float, one product */
UNARY_KERNELS2(leaky_relu, xf > 0 ? xf : (float)P->alpha * xf, xf > 0 ? 1.0f : (float)P->alpha,
               x > 0 ? x : P->alpha * x, x > 0 ? 1.0 : P->alpha)
UNARY_KERNELS2(sigmoid_ref, 1.0f / (1.0f + ai_expf(-xf)), yf * (1.0f - yf),
               1.0 / (1.0 + exp(-x)), y * (1.0 - y))

/* float32 Sigmoid's forward with ai_expf_fma: 131072 values, 1 thread, about
 * 1.0 -> 0.8 of torch's time. Its reference twin: sigmoid_ref's kernel
 * (ai_expf), run where ai_fast_kernels() is false and on CPUs without FMA. */
AI_WIDE_FMA_CLONES static void sigmoid_f32_fast(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = 1.0f / (1.0f + ai_expf_fma(-x[i]));
}

static void sigmoid_fast_range(void *ctx, int64_t lo, int64_t hi)
{
    const unary_job *j = ctx;
    sigmoid_f32_fast((float *)j->y + lo, (const float *)j->x + lo, hi - lo);
}

static ai_status sigmoid_forward(ai_ctx *c)
{
    if (c->in[0]->dtype != AI_F32 || !ai_fast_kernels() || !ai_cpu_fma())
        return sigmoid_ref_forward(c);
    unary_job j = unary_job_of(c, false);
    ai_parallel_for(ai_tensor_numel(c->in[0]), AI_GRAIN_ELEMS, sigmoid_fast_range, &j);
    return AI_OK;
}

static ai_status sigmoid_backward(ai_ctx *c)
{
    return sigmoid_ref_backward(c);
}
UNARY_KERNELS2(tanh, ai_tanhf(xf), 1.0f - yf * yf, tanh(x), 1.0 - y * y)
/* Gelu: two kernels, chosen per node (approximate "tanh" or "none"). */
UNARY_KERNELS2(gelu_tanh, xf * gelu_tanh_sf(xf), gelu_tanh_deriv_f(xf),
               0.5 * x * (1 + tanh(SQRT_2_PI * (x + 0.044715 * x * x * x))),
               gelu_tanh_deriv(x))
/* float32 Gelu(none) in float as torch computes it, 1 + erf included */
UNARY_KERNELS2(gelu_erf, 0.5f * xf * (1.0f + ai_erff(xf * (float)SQRT1_2)),
               0.5f * (1.0f + ai_erff(xf * (float)SQRT1_2)) +
                   xf * ai_expf(-0.5f * xf * xf) * (float)INV_SQRT_2PI,
               0.5 * x * (1 + erf(x * SQRT1_2)),
               0.5 * (1 + erf(x * SQRT1_2)) + x * exp(-0.5 * x * x) * INV_SQRT_2PI)

/* float32 Gelu(none)'s forward by ai_gelu_erff and backward by
 * ai_gelu_erf_gradf (their polynomials by FMAs): 131072 values, 1 thread,
 * forward 1.07 -> 0.8 of torch's time, backward 0.145-0.166 -> 0.118 ms
 * (0.67-0.71 of torch's; 12 bytes a value: memory-bound). Their reference
 * twins, torch's formulas with ai_erff and ai_expf: gelu_erf's kernels
 * above, run where ai_fast_kernels() is false, and on CPUs without FMA. */
AI_WIDE_FMA_CLONES static void gelu_erf_f32_fast(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = ai_gelu_erff(x[i]);
}

AI_WIDE_FMA_CLONES static void gelu_erf_f32_bwd_fast(float *dx, const float *x, const float *dy,
                                                     int64_t n, bool assign)
{
    GRAD_LOOP(assign, n, dx, dy[i] * ai_gelu_erf_gradf(x[i]));
}

static void gelu_erf_fast_range(void *ctx, int64_t lo, int64_t hi)
{
    const unary_job *j = ctx;
    gelu_erf_f32_fast((float *)j->y + lo, (const float *)j->x + lo, hi - lo);
}

static void gelu_erf_bwd_fast_range(void *ctx, int64_t lo, int64_t hi)
{
    const unary_job *j = ctx;
    gelu_erf_f32_bwd_fast((float *)j->dx + lo, (const float *)j->x + lo,
                          (const float *)j->dy + lo, hi - lo, j->assign);
}

/* whether float32 Gelu(none) runs its fast kernels */
static bool gelu_erf_fast(const ai_ctx *c)
{
    return c->in[0]->dtype == AI_F32 && ai_fast_kernels() && ai_cpu_fma();
}

static ai_status gelu_forward(ai_ctx *c)
{
    if (((const unary_params *)c->node->params)->tanh)
        return gelu_tanh_forward(c);
    if (!gelu_erf_fast(c))
        return gelu_erf_forward(c);
    unary_job j = unary_job_of(c, false);
    ai_parallel_for(ai_tensor_numel(c->in[0]), AI_GRAIN_ELEMS, gelu_erf_fast_range, &j);
    return AI_OK;
}

static ai_status gelu_backward(ai_ctx *c)
{
    if (((const unary_params *)c->node->params)->tanh)
        return gelu_tanh_backward(c);
    if (!gelu_erf_fast(c))
        return gelu_erf_backward(c);
    unary_job j = unary_job_of(c, true);
    ai_parallel_for(ai_tensor_numel(c->in[0]), AI_GRAIN_ELEMS, gelu_erf_bwd_fast_range, &j);
    return AI_OK;
}

UNARY_KERNELS2(erf, ai_erff(xf), (float)TWO_INV_SQRT_PI * ai_expf(-xf * xf), erf(x),
               TWO_INV_SQRT_PI * exp(-x * x))
UNARY_KERNELS2(sqrt, sqrtf(xf), 0.5 / y, sqrt(x), 0.5 / y)
UNARY_KERNELS2(reciprocal, 1.0f / xf, -y * y, 1.0 / x, -y * y)
UNARY_KERNELS2(exp, ai_expf(xf), yf, exp(x), y)
UNARY_KERNELS(log, log(x), 1.0 / x)
UNARY_KERNELS(softplus, x > 20 ? x : log1p(exp(x)), 1.0 / (1.0 + exp(-x)))
/* HardSwish as torch computes it in float: x min(max(x + 3, 0), 6) / 6; its
 * derivative 0 up to -3 included, x / 3 + 1/2 below 3, 1 from 3 on (torch's
 * boundaries). HardSigmoid: clamp(alpha x + beta, 0, 1), derivative alpha
 * strictly inside (0, 1) (torch: -3 < x < 3 for alpha 1/6, beta 1/2). */
UNARY_KERNELS2(hard_swish, xf * fminf(fmaxf(xf + 3.0f, 0.0f), 6.0f) / 6.0f,
               xf <= -3.0f ? 0.0f : (xf < 3.0f ? xf / 3.0f + 0.5f : 1.0f),
               x * fmin(fmax(x + 3.0, 0.0), 6.0) / 6.0,
               x <= -3.0 ? 0.0 : (x < 3.0 ? x / 3.0 + 0.5 : 1.0))
UNARY_KERNELS(hard_sigmoid, fmin(fmax(P->alpha * x + P->beta, 0.0), 1.0),
              (P->alpha * x + P->beta > 0.0 && P->alpha * x + P->beta < 1.0) ? P->alpha : 0.0)
/* Elu, Selu, Celu: torch's forms (expm1 below 0, the derivative from x) */
UNARY_KERNELS(elu, x > 0 ? x : P->alpha * expm1(x), x > 0 ? 1.0 : P->alpha * exp(x))
UNARY_KERNELS(selu, P->gamma * (x > 0 ? x : P->alpha * expm1(x)),
              P->gamma * (x > 0 ? 1.0 : P->alpha * exp(x)))
UNARY_KERNELS(celu, x > 0 ? x : P->alpha * expm1(x / P->alpha), x > 0 ? 1.0 : exp(x / P->alpha))
UNARY_KERNELS(sin, sin(x), cos(x))
UNARY_KERNELS(cos, cos(x), -sin(x))
UNARY_KERNELS(atan, atan(x), 1.0 / (1.0 + x * x))
/* the derivatives as torch writes them: tan' from y, acosh' = rsqrt(x^2 - 1) */
UNARY_KERNELS(tan, tan(x), 1.0 + y * y)
UNARY_KERNELS(asin, asin(x), 1.0 / sqrt(1.0 - x * x))
UNARY_KERNELS(acos, acos(x), -1.0 / sqrt(1.0 - x * x))
UNARY_KERNELS(sinh, sinh(x), cosh(x))
UNARY_KERNELS(cosh, cosh(x), sinh(x))
UNARY_KERNELS(asinh, asinh(x), 1.0 / sqrt(x * x + 1.0))
UNARY_KERNELS(acosh, acosh(x), 1.0 / sqrt(x * x - 1.0))
UNARY_KERNELS(atanh, atanh(x), 1.0 / (1.0 - x * x))
UNARY_KERNELS(softsign, x / (1.0 + fabs(x)), 1.0 / ((1.0 + fabs(x)) * (1.0 + fabs(x))))
/* Mish: x tanh(softplus(x)), torch's derivative t + x sigmoid(x) (1 - t^2),
 * t = tanh(softplus(x)); Swish: x s, s = sigmoid(alpha x), derivative
 * s + alpha x s (1 - s) */
static double mish_deriv(double x)
{
    const double t = tanh(log1p(exp(x)));
    return t + x / (1.0 + exp(-x)) * (1.0 - t * t);
}

static double swish_deriv(double alpha, double x)
{
    const double s = 1.0 / (1.0 + exp(-alpha * x));
    return s + alpha * x * s * (1.0 - s);
}

UNARY_KERNELS(mish, x * tanh(log1p(exp(x))), mish_deriv(x))
UNARY_KERNELS(swish, x / (1.0 + exp(-P->alpha * x)), swish_deriv(P->alpha, x))
/* ThresholdedRelu and Shrink select x (or x -+ bias): gradient 1 where
 * selected, none elsewhere (torch.where). float32 compares with the
 * attributes rounded to float, as torch and ONNX's reference do (x = 0.1f
 * is not above alpha = 0.1f), and adds the bias in float. */
UNARY_KERNELS2_PASS2(thresholded_relu, xf > (float)P->alpha ? xf : 0.0f, 1.0f,
                     xf > (float)P->alpha, x > P->alpha ? x : 0.0, 1.0, x > P->alpha)
UNARY_KERNELS2_PASS2(shrink,
                     xf < -(float)P->lambd   ? xf + (float)P->bias
                     : xf > (float)P->lambd ? xf - (float)P->bias
                                            : 0.0f,
                     1.0f, xf < -(float)P->lambd || xf > (float)P->lambd,
                     x < -P->lambd ? x + P->bias : (x > P->lambd ? x - P->bias : 0.0), 1.0,
                     x < -P->lambd || x > P->lambd)
/* Sign of NaN is 0, like torch.sign; zero gradient */
UNARY_KERNELS_PASS(sign, (double)((x > 0) - (x < 0)), 0.0, 0)
UNARY_KERNELS_PASS(floor, floor(x), 0.0, 0)
UNARY_KERNELS_PASS(ceil, ceil(x), 0.0, 0)
UNARY_KERNELS_PASS(round, nearbyint(x), 0.0, 0)

/* Abs and Neg also take integers of every width (wrapping: Abs(INT8_MIN) is
 * INT8_MIN, as in torch and numpy). */
#define INT_OR_FLOAT_KERNELS(NAME, FWD, IFWD, DER)                                     \
    UNARY_KERNELS(NAME##_float, FWD, DER)                                              \
    static ai_status NAME##_forward(ai_ctx *c)                                         \
    {                                                                                  \
        ai_dtype dt = c->in[0]->dtype;                                                 \
        if (dt == AI_F32 || dt == AI_F64)                                              \
            return NAME##_float_forward(c);                                            \
        const bool uns = ai_dtype_is_unsigned(dt); /* (Abs of one is itself) */       \
        (void)uns;                                                                     \
        const int64_t n = ai_tensor_numel(c->in[0]);                                   \
        for (int64_t i = 0; i < n; i++) {                                              \
            const int64_t x = ai_int_at(c->in[0], i);                                  \
            ai_int_set(c->out[0], i, (IFWD));                                          \
        }                                                                              \
        return AI_OK;                                                                  \
    }                                                                                  \
    static ai_status NAME##_backward(ai_ctx *c) { return NAME##_float_backward(c); }

/* integer forms negate in uint64_t: -INT64_MIN wraps to INT64_MIN like torch, no UB */
INT_OR_FLOAT_KERNELS(abs, x < 0 ? -x : x,
                     (int64_t)(x < 0 && !uns ? 0 - (uint64_t)x : (uint64_t)x),
                     x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0))
INT_OR_FLOAT_KERNELS(neg, -x, (int64_t)(0 - (uint64_t)x), -1.0)

static ai_status identity_forward(ai_ctx *c) { return ai_tensor_copy(c->out[0], c->in[0]); }

static ai_status identity_backward(ai_ctx *c)
{
    ai_accumulate(c->din[0], c->dout[0], c->din_assign[0]);
    return AI_OK;
}

/* ---------------------------------------------------------------- shapes */

static ai_status same_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    const ai_tensor *x = c->in[0];
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof out[0].shape);
    return AI_OK;
}

static ai_status float_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    if (c->in[0]->dtype != AI_F32 && c->in[0]->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(c->in[0]->dtype));
    return same_shape(c, out, ws, state);
}

static ai_status numeric_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    ai_dtype dt = c->in[0]->dtype;
    if (dt == AI_BOOL || ai_dtype_is_half(dt))
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; not supported",
                             ai_dtype_name(dt));
    return same_shape(c, out, ws, state);
}

static ai_status unary_init(ai_node *n)
{
    unary_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    /* defaults of ONNX's attributes, by operator */
    const char *op = n->op_type;
    /* Selu: torch's constants (ONNX's are these rounded to float32; a float
     * attribute given explicitly arrives as its shortest decimal) */
    double alpha = 0.01, beta = 0.5, gamma = 1.0507009873554804934;
    if (strcmp(op, "Elu") == 0 || strcmp(op, "Celu") == 0 || strcmp(op, "Swish") == 0 ||
        strcmp(op, "ThresholdedRelu") == 0)
        alpha = 1.0;
    else if (strcmp(op, "Selu") == 0)
        alpha = 1.6732632423543772848;
    else if (strcmp(op, "HardSigmoid") == 0)
        alpha = 0.2;
    ai_status st = ai_attr_float(n, "alpha", alpha, &p->alpha);
    if (!st)
        st = ai_attr_float(n, "beta", beta, &p->beta);
    if (!st)
        st = ai_attr_float(n, "gamma", gamma, &p->gamma);
    if (!st)
        st = ai_attr_float(n, "lambd", 0.5, &p->lambd);
    if (!st)
        st = ai_attr_float(n, "bias", 0.0, &p->bias);
    if (!st && strcmp(op, "Celu") == 0 && p->alpha == 0)
        return ai_node_error(n, AI_ERR_VALUE, "alpha is 0; Celu divides by it");
    const char *approx;
    if (!st && (st = ai_attr_string(n, "approximate", "none", &approx)) == AI_OK) {
        if (strcmp(approx, "tanh") == 0)
            p->tanh = 1;
        else if (strcmp(approx, "none") != 0)
            return ai_node_error(n, AI_ERR_VALUE,
                                 "approximate='%s'; 'none' or 'tanh' expected", approx);
    }
    return st;
}

/* BWD: what backward reads (AI_OP_BWD_NO_X: its derivative is of y alone) */
#define FLOAT_OP_BWD(NAME, ONNX, BWD)                                                  \
    static const ai_op_def op_##NAME = {ONNX, "", 1, 1, 1, 1, AI_OP_GRAD_ASSIGN(1) | (BWD), \
                                        unary_init, float_shape, NAME##_forward,        \
                                        NAME##_backward};
#define FLOAT_OP(NAME, ONNX) FLOAT_OP_BWD(NAME, ONNX, 0)

FLOAT_OP_BWD(relu, "Relu", AI_OP_BWD_NO_X)
FLOAT_OP(leaky_relu, "LeakyRelu")
FLOAT_OP_BWD(sigmoid, "Sigmoid", AI_OP_BWD_NO_X)
FLOAT_OP_BWD(tanh, "Tanh", AI_OP_BWD_NO_X)
FLOAT_OP(gelu, "Gelu")
FLOAT_OP(erf, "Erf")
FLOAT_OP(sqrt, "Sqrt")
FLOAT_OP(reciprocal, "Reciprocal")
FLOAT_OP(exp, "Exp")
FLOAT_OP(log, "Log")
FLOAT_OP(softplus, "Softplus")
FLOAT_OP(hard_swish, "HardSwish")
FLOAT_OP(hard_sigmoid, "HardSigmoid")
FLOAT_OP(elu, "Elu")
FLOAT_OP(selu, "Selu")
FLOAT_OP(celu, "Celu")
FLOAT_OP(sin, "Sin")
FLOAT_OP(cos, "Cos")
FLOAT_OP(atan, "Atan")
FLOAT_OP(tan, "Tan")
FLOAT_OP(asin, "Asin")
FLOAT_OP(acos, "Acos")
FLOAT_OP(sinh, "Sinh")
FLOAT_OP(cosh, "Cosh")
FLOAT_OP(asinh, "Asinh")
FLOAT_OP(acosh, "Acosh")
FLOAT_OP(atanh, "Atanh")
FLOAT_OP(softsign, "Softsign")
FLOAT_OP(mish, "Mish")
FLOAT_OP(swish, "Swish")
FLOAT_OP(thresholded_relu, "ThresholdedRelu")
FLOAT_OP(shrink, "Shrink")
FLOAT_OP(sign, "Sign")
FLOAT_OP(floor, "Floor")
FLOAT_OP(ceil, "Ceil")
FLOAT_OP(round, "Round")

static const ai_op_def op_abs = {"Abs", "", 1, 1, 1, 1, AI_OP_GRAD_ASSIGN(1) | AI_OP_UNSIGNED,
                                 unary_init, numeric_shape, abs_forward, abs_backward};
static const ai_op_def op_neg = {"Neg", "", 1, 1, 1, 1, AI_OP_GRAD_ASSIGN(1), unary_init,
                                 numeric_shape, neg_forward, neg_backward};
static const ai_op_def op_identity = {"Identity", "", 1, 1, 1, 1,
                                      AI_OP_GRAD_ASSIGN(1) | AI_OP_HALF | AI_OP_ANY_DTYPE |
                                          AI_OP_VIEW, NULL,
                                      same_shape, identity_forward, identity_backward};

/* ---------------------------------------------------------------- Clip */

/* Bounds come from inputs 1 and 2 (opset >= 11) or from attributes. */
static ai_status clip_bounds(const ai_ctx *c, double *lo, double *hi)
{
    *lo = -INFINITY;
    *hi = INFINITY;
    if (c->node->opset < 11) {
        ai_status st = ai_attr_float(c->node, "min", -INFINITY, lo);
        return st ? st : ai_attr_float(c->node, "max", INFINITY, hi);
    }
    for (int k = 1; k <= 2; k++) {
        const ai_tensor *b = k < c->n_in ? c->in[k] : NULL;
        if (!b)
            continue;
        if (ai_tensor_numel(b) != 1)
            return ai_node_error(c->node, AI_ERR_VALUE, "%s must be a scalar",
                                 k == 1 ? "min" : "max");
        *(k == 1 ? lo : hi) = ai_tensor_get_flat(b, 0);
    }
    return AI_OK;
}

/* Float Clip split by element ranges: y = clip(x), or dx += dy inside the
 * bounds (inclusive, like torch.clamp; dx = with `assign`). */
typedef struct {
    bool f64, assign;
    double lo, hi;
    const void *x, *dy;
    void *out; /* y or dx */
} clip_job;

static void clip_forward_range(void *ctx, int64_t a, int64_t b)
{
    const clip_job *j = ctx;
    if (j->f64) {
        const double *x = j->x;
        double *y = j->out;
        for (int64_t i = a; i < b; i++) {
            double v = x[i] < j->lo ? j->lo : x[i];
            y[i] = v > j->hi ? j->hi : v;
        }
    } else {
        const float *x = j->x;
        float *y = j->out;
        const float l = (float)j->lo, h = (float)j->hi;
        for (int64_t i = a; i < b; i++) {
            float v = x[i] < l ? l : x[i]; /* NaN passes through, like torch */
            y[i] = v > h ? h : v;
        }
    }
}

/* dy read whatever x, the two tests joined by & (not &&): a select without
 * branches, which vectorises (a branch per value, mispredicted on half of
 * them where x straddles the bounds, took 5 ns a value) */
AI_VECTOR_CLONES static void clip_backward_range(void *ctx, int64_t a, int64_t b)
{
    const clip_job *j = ctx;
    if (j->f64) {
        const double *x = (const double *)j->x + a, *dy = (const double *)j->dy + a;
        double *dx = (double *)j->out + a;
        const double l = j->lo, h = j->hi;
        GRAD_LOOP(j->assign, b - a, dx, ((x[i] >= l) & (x[i] <= h)) ? dy[i] : 0.0);
    } else {
        const float *x = (const float *)j->x + a, *dy = (const float *)j->dy + a;
        float *dx = (float *)j->out + a;
        const float l = (float)j->lo, h = (float)j->hi;
        GRAD_LOOP(j->assign, b - a, dx, ((x[i] >= l) & (x[i] <= h)) ? dy[i] : 0.0f);
    }
}

static ai_status clip_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    for (int k = 1; k < c->n_in; k++)
        if (c->in[k] && ai_tensor_numel(c->in[k]) != 1)
            return ai_node_error(c->node, AI_ERR_VALUE, "%s must be a scalar",
                                 k == 1 ? "min" : "max");
    return numeric_shape(c, out, ws, state);
}

static ai_status clip_forward(ai_ctx *c)
{
    double lo, hi;
    ai_status st = clip_bounds(c, &lo, &hi);
    if (st)
        return st;
    int64_t n = ai_tensor_numel(c->in[0]);
    if (ai_dtype_is_float(c->in[0]->dtype) && !ai_dtype_is_half(c->in[0]->dtype)) {
        clip_job j = {c->in[0]->dtype == AI_F64, false, lo, hi, c->in[0]->data, NULL,
                      c->out[0]->data};
        ai_parallel_for(n, AI_GRAIN_ELEMS, clip_forward_range, &j);
    } else {
        /* integers: clip in int64, exactly (a double holds 53 bits; (int64_t)2^63 is UB),
         * uint64 by its order key */
        const ai_dtype dt = c->in[0]->dtype;
        int64_t ilo = INT64_MIN, ihi = INT64_MAX;
        if (c->node->opset < 11) {
            if (lo > -9223372036854775808.0)
                ilo = lo >= 9223372036854775807.0 ? INT64_MAX : (int64_t)ceil(lo);
            if (hi < 9223372036854775807.0)
                ihi = hi <= -9223372036854775808.0 ? INT64_MIN : (int64_t)floor(hi);
        } else {
            for (int k = 1; k <= 2 && k < c->n_in; k++)
                if (c->in[k])
                    *(k == 1 ? &ilo : &ihi) =
                        ai_int_order_key(dt, ai_tensor_get_flat_i64(c->in[k], 0));
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t v = ai_int_order_key(dt, ai_int_at(c->in[0], i));
            v = v < ilo ? ilo : v;
            v = v > ihi ? ihi : v;
            ai_int_set(c->out[0], i, ai_int_order_key(dt, v)); /* within the input's range */
        }
    }
    return AI_OK;
}

static ai_status clip_backward(ai_ctx *c)
{
    double lo, hi;
    ai_status st = clip_bounds(c, &lo, &hi);
    if (st)
        return st;
    if (!c->din[0]) /* no gradient for the bounds */
        return AI_OK;
    clip_job j = {c->in[0]->dtype == AI_F64, c->din_assign[0], lo, hi, c->in[0]->data,
                  c->dout[0]->data, c->din[0]->data};
    ai_parallel_for(ai_tensor_numel(c->in[0]), AI_GRAIN_ELEMS, clip_backward_range, &j);
    return AI_OK;
}

static const ai_op_def op_clip = {"Clip", "", 1, 3, 1, 1, AI_OP_GRAD_ASSIGN(1) | AI_OP_UNSIGNED,
                                  NULL, clip_shape, clip_forward, clip_backward};

/* ---------------------------------------------------------------- Not, IsNaN, IsInf */

/* Boolean results, no gradient: Not of bool; IsNaN and IsInf (detect_positive,
 * detect_negative) of float16/32/64. */
static ai_status logic_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    const ai_dtype dt = c->in[0]->dtype;
    const bool is_not = strcmp(c->node->op_type, "Not") == 0;
    if (is_not ? dt != AI_BOOL : !ai_dtype_is_float(dt))
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; %s expected",
                             ai_dtype_name(dt), is_not ? "bool" : "a float type");
    ai_status st = same_shape(c, out, ws, state);
    out[0].dtype = AI_BOOL;
    return st;
}

static ai_status logic_forward(ai_ctx *c)
{
    const ai_tensor *x = c->in[0];
    uint8_t *y = c->out[0]->data;
    const int64_t n = ai_tensor_numel(x);
    const char *op = c->node->op_type;
    if (op[0] == 'N') { /* Not */
        const uint8_t *b = x->data;
        for (int64_t i = 0; i < n; i++)
            y[i] = !b[i];
        return AI_OK;
    }
    int64_t pos = 1, neg = 1;
    ai_status st = ai_attr_int(c->node, "detect_positive", 1, &pos);
    if (!st)
        st = ai_attr_int(c->node, "detect_negative", 1, &neg);
    const bool nan = strcmp(op, "IsNaN") == 0;
    for (int64_t i = 0; i < n && !st; i++) {
        const double v = ai_tensor_get_flat(x, i);
        y[i] = nan ? v != v : (isinf(v) && ((v > 0 && pos) || (v < 0 && neg)));
    }
    return st;
}

static const ai_op_def op_not = {"Not", "", 1, 1, 1, 1, 0, NULL, logic_shape, logic_forward,
                                 NULL};
static const ai_op_def op_isnan = {"IsNaN", "", 1, 1, 1, 1, 0, NULL, logic_shape,
                                   logic_forward, NULL};
static const ai_op_def op_isinf = {"IsInf", "", 1, 1, 1, 1, 0, NULL, logic_shape,
                                   logic_forward, NULL};

/* ---------------------------------------------------------------- BitwiseNot */

/* Integers of every width, no gradient: ~x of each element is ~ of each of
 * its bytes. */
static ai_status bitwise_not_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    const ai_dtype dt = c->in[0]->dtype;
    if (ai_dtype_is_float(dt) || dt == AI_BOOL)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; an integer type expected",
                             ai_dtype_name(dt));
    return same_shape(c, out, ws, state);
}

static ai_status bitwise_not_forward(ai_ctx *c)
{
    const uint8_t *x = c->in[0]->data;
    uint8_t *y = c->out[0]->data;
    const int64_t n = ai_tensor_numel(c->in[0]) * (int64_t)ai_dtype_size(c->in[0]->dtype);
    for (int64_t i = 0; i < n; i++)
        y[i] = (uint8_t)~x[i];
    return AI_OK;
}

static const ai_op_def op_bitwise_not = {"BitwiseNot", "", 1, 1, 1, 1, AI_OP_UNSIGNED, NULL,
                                         bitwise_not_shape, bitwise_not_forward, NULL};

/* ---------------------------------------------------------------- Dropout */

/* Active only when the graph is in training mode and the ratio is > 0. Its
 * random stream is the engine's own (splitmix64): not bit-compatible with
 * torch. State: a call counter and the keep mask (one byte per element). */
typedef struct {
    uint64_t calls;
    double scale;
    int active;
} dropout_state;

static double dropout_ratio(const ai_ctx *c)
{
    double r = 0.5;
    if (c->node->opset < 12) {
        ai_attr_float(c->node, "ratio", 0.5, &r);
    } else if (c->n_in > 1 && c->in[1]) {
        r = ai_tensor_get_flat(c->in[1], 0);
    }
    return r;
}

static ai_status dropout_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    for (int k = 1; k < c->n_in; k++)
        if (c->in[k] && ai_tensor_numel(c->in[k]) != 1)
            return ai_node_error(c->node, AI_ERR_VALUE, "%s must be a scalar, got %lld values",
                                 k == 1 ? "ratio" : "training_mode",
                                 (long long)ai_tensor_numel(c->in[k]));
    double r = c->n_in > 1 && c->in[1] && !ai_ctx_const(c, 1) ? 0.5 : dropout_ratio(c);
    if (!(r >= 0 && r < 1))
        return ai_node_error(c->node, AI_ERR_VALUE, "ratio %g is outside [0, 1)", r);
    ai_status st = float_shape(c, out, ws, state);
    if (st)
        return st;
    if (c->n_out > 1) {
        out[1] = out[0];
        out[1].dtype = AI_BOOL;
    }
    *state = sizeof(dropout_state) + (size_t)ai_tensor_numel(c->in[0]);
    return AI_OK;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static ai_status dropout_forward(ai_ctx *c)
{
    dropout_state *s = c->state;
    uint8_t *mask = (uint8_t *)(s + 1);
    int64_t n = ai_tensor_numel(c->in[0]);
    double r = dropout_ratio(c);
    if (!(r >= 0 && r < 1)) /* a ratio given at run time: checked here, before use */
        return ai_node_error(c->node, AI_ERR_VALUE, "ratio %g is outside [0, 1)", r);
    s->active = c->training && r > 0;
    s->scale = s->active ? 1.0 / (1.0 - r) : 1.0;
    if (s->active) {
        uint64_t base = splitmix64(c->g->seed ^ (uint64_t)(uintptr_t)c->node ^ s->calls++);
        const uint64_t threshold = (uint64_t)(r * 18446744073709551616.0);
        for (int64_t i = 0; i < n; i++)
            mask[i] = splitmix64(base + (uint64_t)i) >= threshold;
    } else {
        memset(mask, 1, (size_t)n);
    }
    if (c->in[0]->dtype == AI_F32) {
        const float *x = c->in[0]->data;
        float *y = c->out[0]->data;
        const float sc = (float)s->scale;
        for (int64_t i = 0; i < n; i++)
            y[i] = mask[i] ? x[i] * sc : 0.0f;
    } else {
        const double *x = c->in[0]->data;
        double *y = c->out[0]->data;
        for (int64_t i = 0; i < n; i++)
            y[i] = mask[i] ? x[i] * s->scale : 0.0;
    }
    if (c->n_out > 1 && c->out[1] && n)
        memcpy(c->out[1]->data, mask, (size_t)n);
    return AI_OK;
}

static ai_status dropout_backward(ai_ctx *c)
{
    const dropout_state *s = c->state;
    const uint8_t *mask = (const uint8_t *)(s + 1);
    int64_t n = ai_tensor_numel(c->in[0]);
    if (!c->din[0]) /* no gradient for the ratio */
        return AI_OK;
    if (c->in[0]->dtype == AI_F32) {
        const float *dy = c->dout[0]->data;
        float *dx = c->din[0]->data;
        const float sc = (float)s->scale;
        GRAD_LOOP(c->din_assign[0], n, dx, mask[i] ? dy[i] * sc : 0.0f);
    } else {
        const double *dy = c->dout[0]->data;
        double *dx = c->din[0]->data;
        const double sc = s->scale;
        GRAD_LOOP(c->din_assign[0], n, dx, mask[i] ? dy[i] * sc : 0.0);
    }
    return AI_OK;
}

static const ai_op_def op_dropout = {"Dropout", "", 1, 3, 1, 2,
                                     AI_OP_NO_FOLD | AI_OP_GRAD_ASSIGN(1), NULL,
                                     dropout_shape, dropout_forward, dropout_backward};

/* ---------------------------------------------------------------- Cast */

/* Cast(input; to, saturate, round_mode), CastLike(input, target; saturate,
 * round_mode): ONNX's conversions (ai_tensor_convert): saturate (default 1)
 * clamps what an 8-bit float cannot hold to its largest finite value, else
 * infinity or NaN by the format; round_mode ("up", "down", "nearest")
 * rounds to float8 E8M0. */
static ai_status cast_init(ai_node *n)
{
    int64_t saturate;
    const char *round;
    ai_status st;
    if ((st = ai_attr_int(n, "saturate", 1, &saturate)) ||
        (st = ai_attr_string(n, "round_mode", "up", &round)))
        return st;
    ai_convert_mode *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    p->saturate = saturate != 0;
    if (strcmp(round, "up") == 0)
        p->e8m0_round = AI_ROUND_UP;
    else if (strcmp(round, "down") == 0)
        p->e8m0_round = AI_ROUND_DOWN;
    else if (strcmp(round, "nearest") == 0)
        p->e8m0_round = AI_ROUND_NEAREST;
    else
        return ai_node_error(n, AI_ERR_VALUE,
                             "round_mode is '%s'; 'up', 'down' or 'nearest' expected", round);
    return AI_OK;
}

static ai_status cast_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    int64_t to;
    ai_status st = ai_attr_int(c->node, "to", -1, &to);
    if (st)
        return st;
    ai_dtype dt;
    if (!ai_dtype_from_onnx(to, &dt))
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "cast to ONNX data type %lld is not supported", (long long)to);
    st = same_shape(c, out, ws, state);
    out[0].dtype = dt;
    return st;
}

static ai_status cast_forward(ai_ctx *c)
{
    const ai_convert_mode *mode = c->node->params;
    return ai_tensor_convert(c->out[0], c->in[0], *mode);
}

/* The gradient flows between float32 and float64 only. */
static ai_status cast_backward(ai_ctx *c)
{
    const ai_dtype dt = c->out[0]->dtype;
    if (!c->din[0] || !ai_dtype_is_float(dt) || ai_dtype_is_storage(dt))
        return AI_OK; /* no gradient through a cast to integers or to the 8- and
                         4-bit floats, nor to a CastLike input that needs none (a
                         constant cast like x) */
    ai_tensor *tmp;
    ai_status st = ai_tensor_new(&tmp, c->din[0]->dtype, c->din[0]->ndim, c->din[0]->shape);
    if (st)
        return st;
    if (!(st = ai_tensor_copy(tmp, c->dout[0])))
        ai_accumulate(c->din[0], tmp, false);
    ai_tensor_free(tmp);
    return st;
}

static const ai_op_def op_cast = {"Cast", "", 1, 1, 1, 1, AI_OP_HALF | AI_OP_ANY_DTYPE, cast_init,
                                  cast_shape, cast_forward, cast_backward};

/* CastLike(input, target): Cast to the dtype of `target`. */
static ai_status cast_like_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    ai_status st = same_shape(c, out, ws, state);
    out[0].dtype = c->in[1]->dtype;
    return st;
}

static const ai_op_def op_cast_like = {"CastLike", "", 2, 2, 1, 1, AI_OP_HALF | AI_OP_ANY_DTYPE, cast_init,
                                       cast_like_shape, cast_forward, cast_backward};

/* BitCast(input; to): the same bits read as another dtype of the same
 * width (opset 26), in the same shape. The sub-byte types, kept one a
 * byte, keep their bits in the byte's low ones. */
static int bit_width(ai_dtype dt)
{
    switch (dt) {
    case AI_I4:
    case AI_U4:
    case AI_F4E2M1: return 4;
    case AI_I2:
    case AI_U2: return 2;
    default: return 8 * (int)ai_dtype_size(dt);
    }
}

static ai_status bitcast_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    int64_t to;
    ai_status st = ai_attr_int(c->node, "to", -1, &to);
    if (st)
        return st;
    ai_dtype dt;
    const ai_dtype from = c->in[0]->dtype;
    if (!ai_dtype_from_onnx(to, &dt))
        return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                             "bitcast to ONNX data type %lld is not supported", (long long)to);
    if (bit_width(dt) != bit_width(from))
        return ai_node_error(c->node, AI_ERR_TYPE,
                             "bitcast of %s (%d bits) to %s (%d bits): the widths differ",
                             ai_dtype_name(from), bit_width(from), ai_dtype_name(dt),
                             bit_width(dt));
    st = same_shape(c, out, ws, state);
    out[0].dtype = dt;
    return st;
}

static ai_status bitcast_forward(ai_ctx *c)
{
    ai_tensor bytes = *c->in[0]; /* the input's elements, in the output's dtype */
    bytes.dtype = c->out[0]->dtype;
    return ai_tensor_copy(c->out[0], &bytes);
}

static const ai_op_def op_bitcast = {"BitCast", "", 1, 1, 1, 1, AI_OP_HALF | AI_OP_ANY_DTYPE, NULL,
                                     bitcast_shape, bitcast_forward, NULL};

const ai_op_def *const ai_ops_unary[] = {
    &op_relu, &op_leaky_relu, &op_sigmoid, &op_tanh, &op_gelu, &op_erf, &op_sqrt,
    &op_reciprocal, &op_exp, &op_log, &op_softplus, &op_hard_swish, &op_hard_sigmoid,
    &op_elu, &op_selu, &op_celu, &op_sin, &op_cos, &op_atan, &op_tan, &op_asin, &op_acos,
    &op_sinh, &op_cosh, &op_asinh, &op_acosh, &op_atanh, &op_softsign, &op_mish, &op_swish,
    &op_thresholded_relu, &op_shrink, &op_sign, &op_floor, &op_ceil,
    &op_round, &op_abs, &op_neg, &op_identity, &op_clip, &op_dropout, &op_cast,
    &op_cast_like, &op_bitcast, &op_not, &op_isnan, &op_isinf, &op_bitwise_not, NULL,
};
