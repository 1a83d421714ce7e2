/*
 * shift.c — ShiftGELU and ShiftMax (domain "aidge"): the integer-only GELU
 * and softmax approximations of I-ViT, as specified in shift-ops.md.
 *
 * Both take one float32/float64 tensor of rank >= 1 and reduce over its last
 * axis ("rows"). The per-tensor scale S = max|x| / 127 and x0 = floor(-1/S)
 * are constants without gradient; S == 0 gives 0 (ShiftGELU) or the uniform
 * softmax (ShiftMax) with zero gradient.
 *
 * Precision: the formulas are evaluated in double for both dtypes and the
 * result is rounded once to the tensor's type, so float32 results are the
 * float64 reference (tests/operators/shift_reference.py) on the same values.
 * The formula's integers (e, sum e, e * f, below 2^53 unless max|x| < 1e-9)
 * are exact in double. In float32, torch rounds 2^31 - 1 to 2^31 and those
 * integers to 24 bits, which moves floors by one step (for ShiftGELU at
 * large magnitudes, in most elements): compare against x.double().
 *
 * Backward is the gradient of the same formula with every floor replaced by
 * the identity (straight-through), like torch autograd on the reference:
 * max(t, N*x0) passes the gradient above the bound and half of it at a tie
 * (torch.maximum), max(., 0) and min(., 2^31-1) pass it at the bounds
 * (torch.clamp), and the row maximum routes its gradient to the first
 * maximal element (torch.max(dim)). Backward recomputes the row values from
 * x; the workspace holds five rows of doubles.
 */
#include <math.h>
#include <string.h>

#include "../graph.h"

#define SHIFT_N 15          /* shift precision of exp_shift */
#define SIG_SHIFT 24        /* 31 - b + 1 with b = 8 output bits */
static const double INT32_MAXD = 2147483647.0;
static const double OUT_STEP = 1.0 / 128;  /* 2^-(b-1) */
static const double LN2 = 0.69314718055994530942;
static const double GELU_SCALE = 1.702;

/* ---------------------------------------------------------------- helpers */

/* 2^k for an integral k, exact (k is bounded for finite inputs; NaN gives 0
 * here and NaN through the caller's other factor). */
static double pow2i(double k)
{
    return ldexp(1.0, (int)fmin(fmax(k, -2100.0), 2100.0));
}

/*
 * I-ViT's int_exp_shift of t (in units of the scale whose x0 is given):
 *   t1 = t + floor(t/2) - floor(t/16); t2 = max(t1, N*x0)
 *   q = floor(t2/x0); r = t2 - x0*q; w = (r/2 - x0) * 2^(N-q); e = max(floor(w), 0)
 * Returns e and sets *dedt, the straight-through derivative de/dt: through
 * r the floors cancel (dr/dt2 = 1 - x0/x0), through 2^(N-q) it is
 * -ln2 * w / x0, times 1 + 1/2 - 1/16 from t1 and the max/clamp gates.
 */
static double exp_shift(double t, double x0, double *dedt)
{
    const double lo = SHIFT_N * x0;
    double t1 = t + floor(t / 2) - floor(t / 16);
    double t2 = t1 < lo ? lo : t1;
    double q = floor(t2 / x0);
    double r = t2 - x0 * q;
    double w = (r / 2 - x0) * pow2i(SHIFT_N - q);
    double e = floor(w);
    double gate = t1 > lo ? 1.0 : (t1 == lo ? 0.5 : 0.0);
    *dedt = e >= 0 ? gate * 1.4375 * (-LN2 * w / x0) : 0.0;
    return e < 0 ? 0.0 : e;
}

/* Index of the first maximum of p[0..n). */
static int64_t row_argmax(const double *p, int64_t n)
{
    int64_t k = 0;
    for (int64_t j = 1; j < n; j++)
        if (p[j] > p[k])
            k = j;
    return k;
}

/* floor((2^31-1) / min(sum, 2^31-1)) and its derivative d/dsum (the
 * identity for floor; zero where min clamps, inclusive bound passes). */
static double recip_floor(double sum, double *dfds)
{
    double s = sum > INT32_MAXD ? INT32_MAXD : sum;
    *dfds = sum <= INT32_MAXD ? -INT32_MAXD / (s * s) : 0.0;
    return floor(INT32_MAXD / s);
}

static double tensor_scale(const ai_tensor *x)
{
    int64_t n = ai_tensor_numel(x);
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = fabs(x->dtype == AI_F32 ? (double)AI_F32P(x)[i] : AI_F64P(x)[i]);
        if (a > m || a != a)
            m = a;
    }
    return m / 127;
}

static void load_row(double *dst, const ai_tensor *t, int64_t off, int64_t n)
{
    if (t->dtype == AI_F32)
        for (int64_t j = 0; j < n; j++)
            dst[j] = AI_F32P(t)[off + j];
    else
        memcpy(dst, AI_F64P(t) + off, sizeof(double) * (size_t)n);
}

static void store_row(ai_tensor *t, int64_t off, const double *src, int64_t n)
{
    if (t->dtype == AI_F32)
        for (int64_t j = 0; j < n; j++)
            AI_F32P(t)[off + j] = (float)src[j];
    else
        memcpy(AI_F64P(t) + off, src, sizeof(double) * (size_t)n);
}

static void accumulate_row(ai_tensor *t, int64_t off, const double *src, int64_t n)
{
    if (t->dtype == AI_F32)
        for (int64_t j = 0; j < n; j++)
            AI_F32P(t)[off + j] += (float)src[j];
    else
        for (int64_t j = 0; j < n; j++)
            AI_F64P(t)[off + j] += src[j];
}

/* ---------------------------------------------------------------- ShiftMax */

/* x, y are (n); e, de are scratch (n). */
static void shiftmax_row_forward(double *y, const double *x, int64_t n, double S, double *e)
{
    const double x0 = floor(-1.0 / S);
    for (int64_t j = 0; j < n; j++)
        y[j] = x[j] / S; /* p, then y */
    double m = y[row_argmax(y, n)], sum = 0, dfds;
    for (int64_t j = 0; j < n; j++) {
        double de;
        e[j] = exp_shift(y[j] - m, x0, &de);
        sum += e[j];
    }
    double f = recip_floor(sum, &dfds);
    for (int64_t j = 0; j < n; j++)
        y[j] = floor(e[j] * f / (1 << SIG_SHIFT)) * OUT_STEP;
}

/* gp (n) receives dL/dx for x and dy = dL/dy (n); e, de are scratch (n). */
static void shiftmax_row_backward(double *gp, const double *x, const double *dy, int64_t n,
                                  double S, double *e, double *de)
{
    const double x0 = floor(-1.0 / S);
    for (int64_t j = 0; j < n; j++)
        gp[j] = x[j] / S;
    int64_t k = row_argmax(gp, n);
    double m = gp[k], sum = 0, dfds;
    for (int64_t j = 0; j < n; j++) {
        e[j] = exp_shift(gp[j] - m, x0, &de[j]);
        sum += e[j];
    }
    double f = recip_floor(sum, &dfds), gf = 0;
    /* y = floor(e f / 2^24) / 128: dy/de = f / 2^24 / 128, dy/df likewise */
    for (int64_t j = 0; j < n; j++)
        gf += dy[j] * OUT_STEP * e[j] / (1 << SIG_SHIFT);
    double gsum = gf * dfds, gm = 0;
    for (int64_t j = 0; j < n; j++) {
        gp[j] = (dy[j] * OUT_STEP * f / (1 << SIG_SHIFT) + gsum) * de[j];
        gm -= gp[j];
    }
    gp[k] += gm; /* p - max(p) */
    for (int64_t j = 0; j < n; j++)
        gp[j] /= S;
}

/* ---------------------------------------------------------------- ShiftGELU */

/* y = p * floor(e f / 2^24) * S / 128 with p = x / S, e = exp_shift(p - m),
 * f = floor((2^31-1) / min(e + exp_shift(-m), 2^31-1)), at scale 1.702 S. */
static void shiftgelu_row_forward(double *y, const double *x, int64_t n, double S)
{
    const double x0 = floor(-1.0 / (S * GELU_SCALE));
    for (int64_t j = 0; j < n; j++)
        y[j] = x[j] / S;
    double m = y[row_argmax(y, n)], dem, de, dfds;
    double em = exp_shift(-m, x0, &dem);
    for (int64_t j = 0; j < n; j++) {
        double p = y[j], e = exp_shift(p - m, x0, &de);
        double f = recip_floor(e + em, &dfds);
        y[j] = p * floor(e * f / (1 << SIG_SHIFT)) * S * OUT_STEP;
    }
}

/* gp (n) receives dL/dx for x and dy = dL/dy (n). */
static void shiftgelu_row_backward(double *gp, const double *x, const double *dy, int64_t n,
                                   double S)
{
    const double x0 = floor(-1.0 / (S * GELU_SCALE));
    for (int64_t j = 0; j < n; j++)
        gp[j] = x[j] / S;
    int64_t k = row_argmax(gp, n);
    double m = gp[k], dem, de, dfds, gem = 0, gm = 0;
    double em = exp_shift(-m, x0, &dem);
    for (int64_t j = 0; j < n; j++) {
        double p = gp[j], e = exp_shift(p - m, x0, &de);
        double f = recip_floor(e + em, &dfds);
        double sig = floor(e * f / (1 << SIG_SHIFT));
        double g = dy[j] * OUT_STEP * S;      /* dL/d(p * sig) */
        double gz = g * p / (1 << SIG_SHIFT); /* dL/d(e * f) / 2^24 */
        double gsum = gz * e * dfds;          /* through f into e + em */
        double gd = (gz * f + gsum) * de;     /* dL/d(p - m) */
        gem += gsum;
        gm -= gd;
        gp[j] = g * sig + gd;
    }
    gm -= gem * dem; /* em = exp_shift(-m) */
    gp[k] += gm;
    for (int64_t j = 0; j < n; j++)
        gp[j] /= S;
}

/* ---------------------------------------------------------------- drivers */

static ai_status shift_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const ai_tensor *x = c->in[0];
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    if (x->ndim < 1)
        return ai_node_error(c->node, AI_ERR_VALUE,
                             "input is a scalar; the last axis is reduced, rank >= 1 expected");
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof out[0].shape);
    *ws = 5 * sizeof(double) * (size_t)x->shape[x->ndim - 1];
    return AI_OK;
}

/* Runs the row kernels over every row of the last axis; workspace: x, y (or
 * dx), dy and two scratch rows. */
static ai_status shift_forward(ai_ctx *c, bool gelu)
{
    const ai_tensor *x = c->in[0];
    const int64_t n = x->shape[x->ndim - 1], total = ai_tensor_numel(x);
    const double S = tensor_scale(x);
    double *xr = c->workspace, *yr = xr + n, *e = yr + 2 * n;
    for (int64_t off = 0; off < total; off += n) {
        load_row(xr, x, off, n);
        if (S == 0)
            for (int64_t j = 0; j < n; j++)
                yr[j] = gelu ? 0.0 : 1.0 / (double)n;
        else if (gelu)
            shiftgelu_row_forward(yr, xr, n, S);
        else
            shiftmax_row_forward(yr, xr, n, S, e);
        store_row(c->out[0], off, yr, n);
    }
    return AI_OK;
}

static ai_status shift_backward(ai_ctx *c, bool gelu)
{
    const ai_tensor *x = c->in[0];
    const int64_t n = x->shape[x->ndim - 1], total = ai_tensor_numel(x);
    const double S = tensor_scale(x);
    if (!c->din[0] || S == 0)
        return AI_OK; /* S == 0: constant output, zero gradient */
    double *xr = c->workspace, *gr = xr + n, *dyr = gr + n, *e = dyr + n, *de = e + n;
    for (int64_t off = 0; off < total; off += n) {
        load_row(xr, x, off, n);
        load_row(dyr, c->dout[0], off, n);
        if (gelu)
            shiftgelu_row_backward(gr, xr, dyr, n, S);
        else
            shiftmax_row_backward(gr, xr, dyr, n, S, e, de);
        accumulate_row(c->din[0], off, gr, n);
    }
    return AI_OK;
}

static ai_status shiftmax_forward(ai_ctx *c) { return shift_forward(c, false); }
static ai_status shiftmax_backward(ai_ctx *c) { return shift_backward(c, false); }
static ai_status shiftgelu_forward(ai_ctx *c) { return shift_forward(c, true); }
static ai_status shiftgelu_backward(ai_ctx *c) { return shift_backward(c, true); }

static const ai_op_def op_shiftmax = {"ShiftMax", "aidge", 1, 1, 1, 1, 0, NULL, shift_shape,
                                      shiftmax_forward, shiftmax_backward};
static const ai_op_def op_shiftgelu = {"ShiftGELU", "aidge", 1, 1, 1, 1, 0, NULL, shift_shape,
                                       shiftgelu_forward, shiftgelu_backward};

const ai_op_def *const ai_ops_shift[] = {&op_shiftgelu, &op_shiftmax, NULL};
