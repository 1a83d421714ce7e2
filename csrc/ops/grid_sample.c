/*
 * grid_sample.c — GridSample (opsets 16 to 22): samples X (N, C, D1..Dr) at
 * the points of grid (N, O1..Or, r), r = 1 to 3, giving Y (N, C, O1..Or),
 * forward and backward to X and to the grid like torch's F.grid_sample.
 *
 * grid[n, o, k] is a coordinate in [-1, 1] along X's spatial dim r - 1 - k
 * (the last component indexes the first spatial dim: x, y, z are W, H, D).
 * It maps to a source coordinate s along a dim of size L:
 *
 *   align_corners=1   s = (g + 1) / 2 * (L - 1)
 *   align_corners=0   s = ((g + 1) * L - 1) / 2
 *
 * mode (opset 16: bilinear, nearest, bicubic; 20 and later: linear,
 * nearest, cubic) reads, per dim, the 2 taps floor(s), floor(s) + 1 with
 * weights 1 - t, t (t = s - floor(s)); the tap nearbyint(s) (half to even,
 * as torch); or the 4 taps floor(s) - 1 .. floor(s) + 2 with Keys' cubic
 * weights (A = -0.75). Several dims multiply their weights. padding_mode
 * says what a point outside X reads: zeros (0), border (s clipped to
 * [0, L - 1]), reflection (s reflected off the borders: 0 and L - 1 with
 * align_corners, -0.5 and L - 0.5 without, then clipped). Linear and
 * nearest apply it to s, cubic to each tap's index, as torch does (ONNX's
 * reference also pads s for cubic: the two differ only for cubic with
 * border or reflection padding and a point outside).
 *
 * Backward adds dY times the weights into dX, and into dgrid the
 * derivative of each weight in s times ds/dg (the unnormalization, times
 * the clip's 0 or 1 and the reflection's +-1 for linear); nearest gives the
 * grid no gradient. Work splits by batch n: each n writes its own dX and
 * dgrid rows. Sums are in double; X and grid may have different float
 * dtypes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "../parallel.h"

enum { G_LINEAR, G_NEAREST, G_CUBIC };
enum { G_ZEROS, G_BORDER, G_REFLECTION };
#define G_MAX_SP 3
#define G_CUBIC_A (-0.75)

typedef struct {
    int mode, padding;
    int64_t align_corners;
} gs_params;

static ai_status gs_init(ai_node *n)
{
    static const char *const modes16[] = {"bilinear", "nearest", "bicubic"};
    static const char *const modes20[] = {"linear", "nearest", "cubic"};
    static const char *const pads[] = {"zeros", "border", "reflection"};
    gs_params *p = calloc(1, sizeof *p);
    if (!p)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = p;
    const bool old = n->opset < 20;
    ai_status st;
    if ((st = ai_attr_choice(n, "mode", old ? "bilinear" : "linear", old ? modes16 : modes20, 3,
                             &p->mode)) ||
        (st = ai_attr_choice(n, "padding_mode", "zeros", pads, 3, &p->padding)) ||
        (st = ai_attr_int(n, "align_corners", 0, &p->align_corners)))
        return st;
    if (p->align_corners != 0 && p->align_corners != 1)
        return ai_node_error(n, AI_ERR_VALUE, "align_corners is %lld; 0 or 1 expected",
                             (long long)p->align_corners);
    return AI_OK;
}

static ai_status gs_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws, (void)state;
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0], *g = c->in[1];
    for (int i = 0; i < 2; i++)
        if (c->in[i]->dtype != AI_F32 && c->in[i]->dtype != AI_F64)
            return ai_node_error(n, AI_ERR_TYPE, "%s is %s; float32 or float64 expected",
                                 i ? "grid" : "X", ai_dtype_name(c->in[i]->dtype));
    const int r = x->ndim - 2;
    if (r < 1 || r > G_MAX_SP)
        return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "X has rank %d; (N, C, D1..Dr) with 1 "
                             "to %d spatial dims is supported", x->ndim, G_MAX_SP);
    if (n->opset < 20 && r != 2)
        return ai_node_error(n, AI_ERR_VALUE, "X has rank %d; opset %d takes 4-D X only",
                             x->ndim, n->opset);
    if (g->ndim != x->ndim || g->shape[0] != x->shape[0] || g->shape[g->ndim - 1] != r)
        return ai_node_error(n, AI_ERR_VALUE, "grid has rank %d, dim 0 %lld, last dim %lld; "
                             "(N=%lld, O1..O%d, %d) expected", g->ndim,
                             (long long)(g->ndim ? g->shape[0] : 0),
                             (long long)(g->ndim ? g->shape[g->ndim - 1] : 0),
                             (long long)x->shape[0], r, r);
    for (int d = 0; d < r; d++)
        if (x->shape[2 + d] == 0 && ai_tensor_numel(g) > 0)
            return ai_node_error(n, AI_ERR_VALUE, "X's spatial dim %d is empty", d);
    out[0].dtype = x->dtype;
    out[0].ndim = x->ndim;
    out[0].shape[0] = x->shape[0];
    out[0].shape[1] = x->shape[1];
    for (int d = 0; d < r; d++)
        out[0].shape[2 + d] = g->shape[1 + d];
    return AI_OK;
}

/* One dim's taps for one point: input index (-1: reads 0), weight, and the
 * weight's derivative in s; mult = ds/dg. */
typedef struct {
    int n;
    int64_t i[4];
    double w[4], dw[4], mult;
} gs_taps;

static double clip_grad(double s, int64_t L, double *grad)
{
    if (s <= 0) {
        *grad = 0;
        return 0;
    }
    if (s >= (double)(L - 1)) {
        *grad = 0;
        return (double)(L - 1);
    }
    *grad = 1;
    return s;
}

/* Reflects s off twice_lo / 2 and twice_hi / 2 (torch's reflect_coordinates). */
static double reflect_grad(double s, int64_t twice_lo, int64_t twice_hi, double *grad)
{
    if (twice_lo == twice_hi || !isfinite(s)) { /* (NaN or inf: no place to reflect to) */
        *grad = 0;
        return twice_lo == twice_hi ? 0 : s;
    }
    const double lo = (double)twice_lo / 2, span = (double)(twice_hi - twice_lo) / 2;
    double sign = 1;
    s -= lo;
    if (s < 0) {
        sign = -1;
        s = -s;
    }
    const double extra = fmod(s, span);
    const int64_t flips = (int64_t)floor(s / span);
    *grad = flips % 2 == 0 ? sign : -sign;
    return flips % 2 == 0 ? extra + lo : span - extra + lo;
}

/* The padding applied to a coordinate (linear and nearest) or to a cubic
 * tap's index; *grad its derivative. */
static double pad_coord(const gs_params *p, double s, int64_t L, double *grad)
{
    double g1 = 1, g2 = 1;
    if (p->padding == G_BORDER)
        s = clip_grad(s, L, &g1);
    else if (p->padding == G_REFLECTION) {
        s = p->align_corners ? reflect_grad(s, 0, 2 * (L - 1), &g1)
                             : reflect_grad(s, -1, 2 * L - 1, &g1);
        s = clip_grad(s, L, &g2);
    }
    *grad = g1 * g2;
    return s;
}

static int64_t in_bounds(double s, int64_t L)
{
    /* (a NaN or huge coordinate reads 0, like one outside) */
    return s >= 0 && s < (double)L ? (int64_t)s : -1;
}

static double cubic1(double x) /* |x| <= 1 */
{
    return ((G_CUBIC_A + 2) * x - (G_CUBIC_A + 3)) * x * x + 1;
}
static double cubic2(double x) /* 1 < |x| < 2 */
{
    return ((G_CUBIC_A * x - 5 * G_CUBIC_A) * x + 8 * G_CUBIC_A) * x - 4 * G_CUBIC_A;
}
static double dcubic1(double x)
{
    return (3 * (G_CUBIC_A + 2) * x - 2 * (G_CUBIC_A + 3)) * x;
}
static double dcubic2(double x)
{
    return (3 * G_CUBIC_A * x - 10 * G_CUBIC_A) * x + 8 * G_CUBIC_A;
}

static void make_taps(const gs_params *p, double g, int64_t L, gs_taps *t)
{
    double s, grad;
    if (p->align_corners) {
        s = (g + 1) / 2 * (double)(L - 1);
        t->mult = (double)(L - 1) / 2;
    } else {
        s = ((g + 1) * (double)L - 1) / 2;
        t->mult = (double)L / 2;
    }
    if (p->mode == G_CUBIC) {
        const double f = floor(s), x = s - f;
        const double w[4] = {cubic2(x + 1), cubic1(x), cubic1(1 - x), cubic2(2 - x)};
        const double dw[4] = {dcubic2(x + 1), dcubic1(x), -dcubic1(1 - x), -dcubic2(2 - x)};
        t->n = 4;
        for (int k = 0; k < 4; k++) {
            t->i[k] = isfinite(f) ? in_bounds(pad_coord(p, f - 1 + k, L, &grad), L) : -1;
            t->w[k] = w[k];
            t->dw[k] = dw[k];
        }
        return;
    }
    s = pad_coord(p, s, L, &grad);
    t->mult *= grad;
    if (p->mode == G_NEAREST) {
        t->n = 1;
        t->i[0] = in_bounds(nearbyint(s), L);
        t->w[0] = 1;
        t->dw[0] = 0;
        return;
    }
    const double f = floor(s), x = s - f;
    t->n = 2;
    t->i[0] = in_bounds(f, L);
    t->i[1] = in_bounds(f + 1, L);
    t->w[0] = 1 - x;
    t->w[1] = x;
    t->dw[0] = -1;
    t->dw[1] = 1;
}

typedef struct {
    const gs_params *p;
    const ai_tensor *x, *grid, *dy;
    ai_tensor *y, *dx, *dgrid;
    int r;
    int64_t C, in_plane, out_plane;
} gs_job;

/* Every tap combination of one point: flat offset in the X plane (-1:
 * outside), weight, and per dim the weight's derivative in that dim's s. */
typedef struct {
    int n;
    int64_t off[64];
    double w[64], dw[G_MAX_SP][64];
} gs_combos;

static void point_combos(const gs_job *j, int64_t nb, int64_t o, gs_combos *cb)
{
    const int r = j->r;
    gs_taps t[G_MAX_SP];
    for (int d = 0; d < r; d++) {
        const int64_t L = j->x->shape[2 + d];
        make_taps(j->p, ai_float_at(j->grid, (nb * j->out_plane + o) * r + (r - 1 - d)), L,
                  &t[d]);
    }
    int k[G_MAX_SP] = {0};
    cb->n = 0;
    for (;;) {
        int64_t off = 0;
        double w = 1;
        for (int d = 0; d < r; d++) {
            const int64_t i = t[d].i[k[d]];
            off = off < 0 || i < 0 ? -1 : off * j->x->shape[2 + d] + i;
            w *= t[d].w[k[d]];
        }
        for (int d = 0; d < r; d++) {
            double dw = t[d].dw[k[d]] * t[d].mult;
            for (int e = 0; e < r; e++)
                if (e != d)
                    dw *= t[e].w[k[e]];
            cb->dw[d][cb->n] = dw;
        }
        cb->off[cb->n] = off;
        cb->w[cb->n++] = w;
        int d = r - 1;
        while (d >= 0 && ++k[d] == t[d].n)
            k[d--] = 0;
        if (d < 0)
            break;
    }
}

static void gs_forward_range(void *ctx, int64_t lo, int64_t hi)
{
    const gs_job *j = ctx;
    gs_combos cb;
    for (int64_t nb = lo; nb < hi; nb++)
        for (int64_t o = 0; o < j->out_plane; o++) {
            point_combos(j, nb, o, &cb);
            for (int64_t ch = 0; ch < j->C; ch++) {
                const int64_t xb = (nb * j->C + ch) * j->in_plane;
                double v = 0;
                for (int k = 0; k < cb.n; k++)
                    if (cb.off[k] >= 0)
                        v += cb.w[k] * ai_float_at(j->x, xb + cb.off[k]);
                ai_float_set(j->y, (nb * j->C + ch) * j->out_plane + o, v);
            }
        }
}

static void gs_backward_range(void *ctx, int64_t lo, int64_t hi)
{
    const gs_job *j = ctx;
    gs_combos cb;
    for (int64_t nb = lo; nb < hi; nb++)
        for (int64_t o = 0; o < j->out_plane; o++) {
            point_combos(j, nb, o, &cb);
            double dg[G_MAX_SP] = {0};
            for (int64_t ch = 0; ch < j->C; ch++) {
                const int64_t xb = (nb * j->C + ch) * j->in_plane;
                const double gy = ai_float_at(j->dy, (nb * j->C + ch) * j->out_plane + o);
                for (int k = 0; k < cb.n; k++) {
                    const int64_t at = xb + cb.off[k];
                    if (cb.off[k] < 0)
                        continue;
                    if (j->dx)
                        ai_float_set(j->dx, at, ai_float_at(j->dx, at) + cb.w[k] * gy);
                    if (j->dgrid) {
                        const double xv = ai_float_at(j->x, at) * gy;
                        for (int d = 0; d < j->r; d++)
                            dg[d] += cb.dw[d][k] * xv;
                    }
                }
            }
            for (int d = 0; j->dgrid && d < j->r; d++) {
                const int64_t at = (nb * j->out_plane + o) * j->r + (j->r - 1 - d);
                ai_float_set(j->dgrid, at, ai_float_at(j->dgrid, at) + dg[d]);
            }
        }
}

static void gs_job_of(const ai_ctx *c, gs_job *j)
{
    memset(j, 0, sizeof *j);
    j->p = c->node->params;
    j->x = c->in[0];
    j->grid = c->in[1];
    j->r = j->x->ndim - 2;
    j->C = j->x->shape[1];
    j->in_plane = j->out_plane = 1;
    for (int d = 0; d < j->r; d++) {
        j->in_plane *= j->x->shape[2 + d];
        j->out_plane *= j->grid->shape[1 + d];
    }
}

static ai_status gs_forward(ai_ctx *c)
{
    gs_job j;
    gs_job_of(c, &j);
    j.y = c->out[0];
    ai_parallel_for(j.x->shape[0], ai_grain_of(j.out_plane * j.C * 8), gs_forward_range, &j);
    return AI_OK;
}

static ai_status gs_backward(ai_ctx *c)
{
    gs_job j;
    gs_job_of(c, &j);
    j.dy = c->dout[0];
    j.dx = c->din[0];
    j.dgrid = j.p->mode == G_NEAREST ? NULL : c->din[1]; /* nearest: no grid gradient */
    if (j.dx || j.dgrid)
        ai_parallel_for(j.x->shape[0], ai_grain_of(j.out_plane * j.C * 8), gs_backward_range,
                        &j);
    return AI_OK;
}

/* backward reads X (for the grid's gradient) and the grid, not Y */
static const ai_op_def op_grid_sample = {"GridSample", "", 2, 2, 1, 1, AI_OP_BWD_NO_Y,
                                         gs_init, gs_shape, gs_forward, gs_backward};

const ai_op_def *const ai_ops_grid_sample[] = {&op_grid_sample, NULL};
