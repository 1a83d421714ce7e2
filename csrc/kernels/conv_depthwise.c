/*
 * conv_depthwise.c — depthwise convolutions: one input channel per group
 * (group = C > 1), Mg = M / C output channels from each. Every output is a
 * sum of K taps of one input plane, so there is no product to hand to a
 * GEMM: the kernels here vectorise along the positions of a plane, or along
 * the channels (channels-last), whichever is long enough.
 *
 *   forward   y[n][m][o] = b[m] + sum over taps k of w[m][k] * x[n][m / Mg][o s + off_k]
 *   dx        dx[n][c][i] += sum over m of c's group and taps k of w[m][k] * dy[n][m][o],
 *             i = o s + off_k
 *   dw        dw[m][k] += sum over images n and positions o of dy[n][m][o] * x[n][c][o s + off_k]
 *
 * The kernels, in the order the dispatcher (conv.c) tries them:
 *   narrow     float32 with AVX-512, Mg = 1, stride 1, planes under 16 wide as
 *              wide as their output: 16 flat positions a vector, lanes
 *              outside the plane masked (forward; dx on planes of 64 or more)
 *   channels-last  Mg = 1, 1 or 2 spatial dims: units of DEPTHWISE_CHANNELS_LAST_UNIT channels
 *              of one image transposed positions-major and zero-padded, every
 *              output a sum of K vector products (forward: small or strided
 *              outputs; backward: both gradients, the smallest planes aside)
 *   planes     the rest, plane by plane: zero-padded stride-phase planes
 *              (phase_planes), copies for stride-1 "same" planes (same_planes),
 *              the phases of dx for strided input gradients (dx_phases); small
 *              planes channels-last in every pass; what none takes, per tap
 *   blocked    the blocked-channel chains' forward (conv.h): channels-last
 *              jobs on the blocks of x as they are stored
 *
 * Each output element, dw included, is summed by one thread with its taps
 * in a fixed order: the same values at any thread count.
 */
#include "conv_internal.h"

enum { DW_FWD, DW_DX, DW_DW }; /* modes of dw_plane (conv_depthwise_impl.h) */

/* The depthwise passes that no plane-by-plane kernel below takes (3
 * spatial dims, more than DW_PAD_MAX_TAPS taps, huge pads) run
 * channels-last when there is one output per input channel, at least 8
 * channels and a narrow output (rows too short to vectorise); its
 * workspace is one (grid, C), one (image, C) and one (kernel, C) buffer. */
static bool depthwise_channels_last(const ai_conv_params *p, const conv_geom *g)
{
    return p->M == p->C && p->C >= 8 && g->grid[2] < 32;
}

/* Small output planes go channels-last in every pass, ahead of the
 * plane-by-plane kernels, whose setup per plane (phase planes, copies,
 * partial vectors) then costs more than the arithmetic. The bounds (16
 * outputs, 36 when strided) are where that stops holding: on larger
 * planes the plane kernels' vectors fill and they win
 * (benchmarks/results/kernels-conv.md, "Depthwise convolutions"). */
static bool depthwise_small_planes(const ai_conv_params *p, const conv_geom *g)
{
    bool strided = false;
    for (int i = 0; i < 3; i++)
        strided |= g->s[i] > 1;
    return depthwise_channels_last(p, g) &&
           (g->grid_size <= 16 || (strided && g->grid_size <= 36));
}

/*
 * Depthwise forward, channels-last ("depthwise_channels_last"), one output channel per input
 * channel, 1 or 2 spatial dims. A job is DEPTHWISE_CHANNELS_LAST_UNIT channels of one image:
 * they are transposed into xt (Hp Wp, DEPTHWISE_CHANNELS_LAST_UNIT), zero-padded, positions
 * major; every output position is then a sum of K vector products over the
 * unit's channels at once (tap k at + off[k] positions), into yt (OS,
 * DEPTHWISE_CHANNELS_LAST_UNIT), which is transposed back into y's planes. No phase planes, no
 * per-plane setup: on small planes and strided convs the plane-by-plane
 * kernels spend most of their time there. Each element starts from its
 * bias and gets its taps in order (pads add w * 0), as in the other
 * depthwise kernels: the same values. The weights are packed once per
 * call, after the slots (depthwise_channels_last_pack). Each of at most DW_PAD_SLOTS threads'
 * ranges has its own slot (xt, yt) and takes its share of the images (with
 * fewer images than slots or parts, of the jobs), units major (xt's zero
 * pads are reused): a thread reads the images that the layer before wrote
 * on it. (Split by units, half of each thread's input would come from
 * the other core's cache.) Float32 stride-1 convs on narrow planes as wide
 * as their output go to depthwise_narrow (end of this file) first where the CPU has AVX-512.
 */
#define DEPTHWISE_CHANNELS_LAST_UNIT 8 /* channels per job: one vector of float */
/* Stride-1 outputs of more positions stay plane by plane, where rows are
 * long enough to vectorise and the transposes into and out of units cost
 * more than they save (benchmarks/results/kernels-conv.md, "Depthwise
 * convolutions"). */
#define DEPTHWISE_CHANNELS_LAST_MAX_GRID 256
typedef struct {
    int64_t Hp, Wp, units, jobs, slots, slot; /* slot: elements of a slot */
    int64_t K, off[DW_PAD_MAX_TAPS];
} depthwise_channels_last_geom;

static bool depthwise_channels_last_geom_of(const ai_conv_params *p, const conv_geom *g,
                                            depthwise_channels_last_geom *q, bool blocked)
{
    if (p->M != p->C || p->group != p->C || p->N == 0 || g->img[0] != 1 ||
        g->ksize > DW_PAD_MAX_TAPS ||
        (!blocked && g->s[1] == 1 && g->s[2] == 1 &&
         g->grid_size > DEPTHWISE_CHANNELS_LAST_MAX_GRID))
        return false;
    q->Hp = (g->grid[1] - 1) * g->s[1] + (g->k[1] - 1) * g->d[1] + 1;
    q->Wp = (g->grid[2] - 1) * g->s[2] + (g->k[2] - 1) * g->d[2] + 1;
    if (q->Hp * q->Wp > 4 * (g->img_size + g->grid_size) + 64) /* sparse taps, huge pads */
        return false;
    q->units = (p->C + DEPTHWISE_CHANNELS_LAST_UNIT - 1) / DEPTHWISE_CHANNELS_LAST_UNIT;
    q->jobs = q->units * p->N;
    q->slots = q->jobs < DW_PAD_SLOTS ? q->jobs : DW_PAD_SLOTS;
    q->slot = (q->Hp * q->Wp + g->grid_size) * DEPTHWISE_CHANNELS_LAST_UNIT; /* xt, yt */
    if (blocked && 2 * q->Hp * q->Wp * DEPTHWISE_CHANNELS_LAST_UNIT > q->slot)
        q->slot =
            2 * q->Hp * q->Wp * DEPTHWISE_CHANNELS_LAST_UNIT; /* depthwise_blocked_range_v16's xt */
    q->K = g->ksize;
    for (int64_t k = 0; k < q->K; k++)
        q->off[k] = k / g->k[2] * g->d[1] * q->Wp + k % g->k[2] * g->d[2];
    return true;
}

/* depthwise_channels_last's workspace: the slots, then the packed weights
 * (depthwise_channels_last_pack), or those and the bias, scale and shift lanes
 * (depthwise_blocked_pack_v16) */
static int64_t depthwise_channels_last_elems(const depthwise_channels_last_geom *q)
{
    return q->slots * q->slot + q->units * (q->K + 3) * DEPTHWISE_CHANNELS_LAST_UNIT;
}

/* The depthwise backward channels-last (depthwise_channels_last_backward, conv_depthwise_impl.h):
 * depthwise_channels_last_geom_of's geometry, x's planes inside the padded buffer (no rows or
 * columns cut), one job per unit; `slot`: elements of a slot (xt, dxt, dyt, wt). The smallest
 * planes keep depthwise_small_planes' path, which is faster there
 * (benchmarks/results/kernels-conv.md, "Depthwise convolutions"). */
static bool depthwise_channels_last_backward_geom_of(const ai_conv_params *p, const conv_geom *g,
                                                     depthwise_channels_last_geom *q,
                                                     int64_t *slots, int64_t *slot)
{
    if (!depthwise_channels_last_geom_of(p, g, q, false) || depthwise_small_planes(p, g) ||
        g->p[1] < 0 || g->p[2] < 0 || g->img[1] + g->p[1] > q->Hp || g->img[2] + g->p[2] > q->Wp)
        return false;
    *slots = q->units < DW_PAD_SLOTS ? q->units : DW_PAD_SLOTS;
    *slot = (2 * q->Hp * q->Wp + g->grid_size + g->ksize) * DEPTHWISE_CHANNELS_LAST_UNIT;
    return true;
}


/* The phase planes of Conv geometry g's source planes (x; dy with `dx`, for
 * stride 1), taps and sizes; false for 3 spatial dims, too many taps, or
 * pads much larger than the image. */
bool phase_planes_of(const conv_geom *g, bool dx, phase_planes *d)
{
    /* (dw_pad_fill keeps per-phase column bounds in arrays of DW_PAD_MAX_TAPS) */
    if (g->img[0] != 1 || g->ksize > DW_PAD_MAX_TAPS || g->s[2] > DW_PAD_MAX_TAPS ||
        (dx && (g->s[1] != 1 || g->s[2] != 1)))
        return false;
    int64_t u[DW_PAD_MAX_TAPS], v[DW_PAD_MAX_TAPS], umax = 0, vmax = 0;
    d->K = g->ksize;
    d->s1 = g->s[1];
    d->s2 = g->s[2];
    d->H = dx ? g->grid[1] : g->img[1];
    d->W = dx ? g->grid[2] : g->img[2];
    d->G1 = dx ? g->img[1] : g->grid[1];
    d->G2 = dx ? g->img[2] : g->grid[2];
    int64_t e1 = (g->k[1] - 1) * g->d[1] - g->p[1], e2 = (g->k[2] - 1) * g->d[2] - g->p[2];
    d->P1 = !dx ? g->p[1] : e1 > 0 ? e1 : 0;
    d->P2 = !dx ? g->p[2] : e2 > 0 ? e2 : 0;
    for (int64_t r = 0; r < d->K; r++) {
        int64_t k1 = r / g->k[2], k2 = r % g->k[2];
        u[r] = dx ? g->p[1] + d->P1 - k1 * g->d[1] : k1 * g->d[1];
        v[r] = dx ? g->p[2] + d->P2 - k2 * g->d[2] : k2 * g->d[2];
        umax = u[r] > umax ? u[r] : umax;
        vmax = v[r] > vmax ? v[r] : vmax;
    }
    int64_t Q1 = (d->G1 - 1) * d->s1 + umax + 1, Q2 = (d->G2 - 1) * d->s2 + vmax + 1;
    d->R1 = (Q1 + d->s1 - 1) / d->s1;
    d->R2 = (Q2 + d->s2 - 1) / d->s2;
    if (d->R1 > 4 * (d->H + 2) || d->R2 > 4 * (d->W + 2)) /* huge pads: the plain kernel */
        return false;
    int64_t ph = d->R1 * d->R2;
    for (int64_t r = 0; r < d->K; r++)
        d->base[r] = ((u[r] % d->s1) * d->s2 + v[r] % d->s2) * ph + u[r] / d->s1 * d->R2 +
                     v[r] / d->s2;
    d->size = (d->s1 * d->s2 * ph + d->R2 + 2 * DW_PAD_LANES + 15) / 16 * 16;
    return true;
}


/* Forward and input gradient of every depthwise conv whose phase planes
 * exist (the weight gradient of narrow planes goes channels-last). */
static bool dw_pad_of(const ai_conv_params *p, const conv_geom *g, bool dx, phase_planes *d)
{
    return conv_is_depthwise(p) && p->N > 0 && phase_planes_of(g, dx, d);
}

/* Whether a depthwise forward (where depthwise_channels_last_forward declines) adds to whole y
 * planes holding the bias (the plain per-plane kernels); the others read
 * only each plane's first element for it (`uniform`, channels-last). */
static bool dw_forward_reads_planes(const ai_conv_params *p, const conv_geom *g)
{
    phase_planes d;
    return !depthwise_small_planes(p, g) && !dw_pad_of(p, g, false, &d) &&
           !depthwise_channels_last(p, g);
}

/* Output rows narrower than a chunk of DW_PAD_LANES: computed as one flat
 * run of rows of R2 positions (dw_pad_flat in conv_depthwise_impl.h), wasting R2 - G2
 * per row instead of most of a chunk. */
#define DW_FLAT_MAX 512
static bool dw_pad_flat(const phase_planes *d)
{
    return d->G2 < DW_PAD_LANES && d->R2 <= DW_FLAT_MAX / 2;
}

/*
 * Stride-1 depthwise planes as wide as their output ("same" width), the
 * narrow ones: no padded rows at all. Output position f = o1 W + o2 of tap
 * k reads the source plane, flat, at f + du_k W + dv_k. Where o2 + dv_k
 * leaves the row it wraps into the neighbour row's edge columns, which only
 * such reads reach: so tap k reads copy dv_k + P of the plane (dv in [-P,
 * P]), in which those dv_k edge columns are zeros; zero rows above and
 * below stand for the row pads. A slot holds the 2P + 1 copies, `plane`
 * elements each, a plane's values from `start` on; off[k] is tap k's
 * offset in the slot. Output runs are dense: no copy out either.
 */
#define DW_SAME_LANES 32 /* the widest chunk (4 vectors of float); slack past a plane */
#define DW_SAME_MAX (1 << 16) /* elements of a slot (its copies) at most */
typedef struct {
    int64_t W, H, G1, P, copies, start, plane;
    int64_t K, off[DW_PAD_MAX_TAPS];
} same_planes;

static bool same_planes_of(const phase_planes *d, same_planes *q)
{
    if (d->s1 != 1 || d->s2 != 1 || d->G2 != d->W)
        return false;
    int64_t du[DW_PAD_MAX_TAPS], dv[DW_PAD_MAX_TAPS], P = 0, top = 0, below = 0;
    for (int64_t k = 0; k < d->K; k++) { /* phase_planes_of's padded taps, unpadded */
        du[k] = d->base[k] / d->R2 - d->P1;
        dv[k] = d->base[k] % d->R2 - d->P2;
        P = dv[k] > P ? dv[k] : -dv[k] > P ? -dv[k] : P;
        top = -du[k] > top ? -du[k] : top;
        below = du[k] > below ? du[k] : below;
    }
    if (P >= d->W)
        return false;
    q->W = d->W, q->H = d->H, q->G1 = d->G1, q->P = P, q->copies = 2 * P + 1, q->K = d->K;
    q->start = (top + 1) * d->W;
    const int64_t runs = (d->G1 * d->W + DW_SAME_LANES - 1) / DW_SAME_LANES * DW_SAME_LANES;
    const int64_t end = q->start + (runs > d->H * d->W ? runs : d->H * d->W);
    q->plane = (end + below * d->W + P + DW_SAME_LANES + 15) / 16 * 16;
    for (int64_t k = 0; k < d->K; k++)
        q->off[k] = (dv[k] + P) * q->plane + q->start + du[k] * d->W + dv[k];
    return q->copies * q->plane <= DW_SAME_MAX;
}

/* Which passes run on same_planes: the forward and input gradient of narrow
 * planes (wider ones keep dw_pad_rows, whose chunks fit their rows), the
 * weight gradient whatever the width. */
static bool dw_same(const phase_planes *d, bool weight_grad, same_planes *q)
{
    return (weight_grad || d->W < DW_PAD_LANES) && same_planes_of(d, q);
}

static int64_t dw_pad_slots(const ai_conv_params *p)
{
    return p->N * p->C < DW_PAD_SLOTS ? p->N * p->C : DW_PAD_SLOTS;
}


/*
 * Depthwise input gradient of a strided conv (1 or 2 spatial dims), by the
 * phases of dx: position (a + s1 i, b + s2 j) only gets the taps k whose
 * offsets (u, v) = (k1 d1 - p1, k2 d2 - p2) are (a, b) modulo the strides,
 * each from dy at (i - floor(u / s1), j - floor(v / s2)): per phase, a
 * stride-1 correlation of dy. A dy plane is copied once into zero margins
 * (`top` rows above, `left` columns before, rows of R2 with a chunk of
 * slack); a phase's row is summed in vector chunks, taps in order, and
 * added into every s2-th element of its dx row.
 */
#define DX_PH_LANES 16 /* outputs per chunk (two vectors of float) */
typedef struct {
    int64_t H, W, G1, G2, s1, s2, top, left, R2, size;
    int64_t K, u[DW_PAD_MAX_TAPS], v[DW_PAD_MAX_TAPS];
} dx_phases;

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static bool dx_phases_of(const conv_geom *g, dx_phases *x)
{
    if (g->img[0] != 1 || g->ksize > DW_PAD_MAX_TAPS || (g->s[1] == 1 && g->s[2] == 1))
        return false;
    *x = (dx_phases){.H = g->img[1], .W = g->img[2], .G1 = g->grid[1], .G2 = g->grid[2],
                     .s1 = g->s[1], .s2 = g->s[2], .K = g->ksize};
    int64_t qmax1 = 0, qmin1 = 0, qmax2 = 0, qmin2 = 0;
    for (int64_t k = 0; k < x->K; k++) {
        x->u[k] = k / g->k[2] * g->d[1] - g->p[1];
        x->v[k] = k % g->k[2] * g->d[2] - g->p[2];
        const int64_t q1 = floor_div(x->u[k], x->s1), q2 = floor_div(x->v[k], x->s2);
        qmax1 = q1 > qmax1 ? q1 : qmax1, qmin1 = q1 < qmin1 ? q1 : qmin1;
        qmax2 = q2 > qmax2 ? q2 : qmax2, qmin2 = q2 < qmin2 ? q2 : qmin2;
    }
    /* phase rows i < ceil(H / s1) read dy rows i - q in [-qmax1, ceil(H / s1) - 1 - qmin1] */
    const int64_t Hs = (x->H + x->s1 - 1) / x->s1, Ws = (x->W + x->s2 - 1) / x->s2;
    int64_t bottom = Hs - 1 - qmin1 - (x->G1 - 1), right = Ws - 1 - qmin2 - (x->G2 - 1);
    x->top = qmax1, x->left = qmax2;
    bottom = bottom > 0 ? bottom : 0;
    right = (right > 0 ? right : 0) + DX_PH_LANES;
    x->R2 = x->left + x->G2 + right;
    const int64_t R1 = x->top + x->G1 + bottom;
    if (R1 > 4 * (x->G1 + 2) + Hs || x->R2 > 4 * (x->G2 + 2) + Ws + DX_PH_LANES)
        return false; /* huge pads */
    x->size = (R1 * x->R2 + 15) / 16 * 16;
    return true;
}


/* e[q] = s[2 q], o[q] = s[2 q + 1] for q < n (the stride-2 phase planes'
 * fill): two vector loads, two shuffles and two stores per 16 values. */
#if defined(__GNUC__) && !defined(__clang__)
typedef int32_t dv_idx __attribute__((vector_size(32)));
#endif
static inline void deinterleave_f32(float *e, float *o, const float *s, int64_t n)
{
    int64_t q = 0;
#if defined(__GNUC__) && !defined(__clang__)
    const dv_idx even = {0, 2, 4, 6, 8, 10, 12, 14}, odd = {1, 3, 5, 7, 9, 11, 13, 15};
    for (int64_t next = 0; n >= 8 && q < n; q = next) {
        q = q + 8 <= n ? q : n - 8; /* the last 8 again, rather than a scalar tail */
        const conv_vec8 v0 = *(const conv_vec8 *)(s + 2 * q),
                        v1 = *(const conv_vec8 *)(s + 2 * q + 8);
        *(conv_vec8 *)(e + q) = __builtin_shuffle(v0, v1, even);
        *(conv_vec8 *)(o + q) = __builtin_shuffle(v0, v1, odd);
        next = q + 8;
    }
#endif
    for (; q < n; q++) {
        e[q] = s[2 * q];
        o[q] = s[2 * q + 1];
    }
}

static inline void deinterleave_f64(double *e, double *o, const double *s, int64_t n)
{
    for (int64_t q = 0; q < n; q++) {
        e[q] = s[2 * q];
        o[q] = s[2 * q + 1];
    }
}


/* Zeroes what the copies into a padded buffer (Hp, Wp) of `lanes`-wide
 * positions (elements of es bytes) leave: with x's plane (H, W) inside at
 * (p1, p2), the pad rows and columns alone, else all of it. */
static void dw_zero_pads(void *buf, size_t es, int64_t lanes, int64_t Hp, int64_t Wp, int64_t H,
                         int64_t W, int64_t p1, int64_t p2, bool inside)
{
    char *b = buf;
    const size_t pos = es * (size_t)lanes; /* bytes of a position */
    if (!inside) {
        memset(b, 0, pos * (size_t)(Hp * Wp));
        return;
    }
    for (int64_t r = 0; r < Hp; r++) {
        char *row = b + pos * (size_t)(r * Wp);
        if (r < p1 || r >= p1 + H) {
            memset(row, 0, pos * (size_t)Wp);
            continue;
        }
        memset(row, 0, pos * (size_t)p2);
        memset(row + pos * (size_t)(p2 + W), 0, pos * (size_t)(Wp - p2 - W));
    }
}


#define T float
#define SFX _f32
#include "conv_depthwise_impl.h"

#define T double
#define SFX _f64
#include "conv_depthwise_impl.h"

/* ----------------------------------------------- depthwise, narrow NCHW planes */

/*
 * The forward and input gradient of depthwise convs with one output
 * channel per input channel, stride 1, on narrow planes (width under 16)
 * whose output rows are as wide as the input's ("same" columns: KWS's 3x3
 * on 25x5), straight on the NCHW planes ("depthwise_narrow"): a vector holds 16
 * consecutive flat positions of a plane (a chunk), and tap k of position f
 * reads f + off[k]. A 16-bit mask per (chunk, tap) clears the lanes whose
 * tap lies outside the plane: their loads read 0 and never fault (AVX-512).
 * The channels-last kernels (depthwise_channels_last) these shapes took before spent about
 * half their time transposing each unit of channels in and out (perf, 64
 * channels of 25x5, batch 16). Each value is summed in the order of the
 * kernels that take these convs where the CPU has no AVX-512 (the
 * forward's: every depthwise kernel's; the input gradient's: depthwise_channels_last's, so it
 * runs only where depthwise_channels_last_backward would), which compute the same values.
 */
#ifdef AI_AVX512_KERNEL
#include <immintrin.h>
#define DEPTHWISE_NARROW_MAX_CHUNKS 64 /* chunks per plane at most */
/* chunks summed at once: independent sums cover the add's latency */
#define DEPTHWISE_NARROW_CB 8
typedef struct {
    int64_t IS, OS, K, ic, oc; /* x and y plane sizes, taps, their chunks */
    int64_t off[DW_PAD_MAX_TAPS];
    /* y chunk j, tap k: lanes whose tap lies inside x (ym[j K + k]); x chunk
     * j, tap k: lanes of x that tap k of a y position inside reads (xm) */
    uint16_t ym[DEPTHWISE_NARROW_MAX_CHUNKS * DW_PAD_MAX_TAPS],
        xm[DEPTHWISE_NARROW_MAX_CHUNKS * DW_PAD_MAX_TAPS];
} depthwise_narrow_geom;

static bool depthwise_narrow_geom_of(const ai_conv_params *p, const conv_geom *g,
                                     depthwise_narrow_geom *q)
{
    if (!conv_is_depthwise(p) || p->M != p->C || p->N == 0 || g->img[0] != 1 || g->s[1] != 1 ||
        g->s[2] != 1 || g->grid[2] != g->img[2] || g->img[2] >= 16 ||
        g->ksize > DW_PAD_MAX_TAPS || g->img_size == 0 || g->grid_size == 0)
        return false;
    const int64_t H = g->img[1], W = g->img[2], G1 = g->grid[1], K = g->ksize;
    q->IS = H * W, q->OS = G1 * W, q->K = K;
    q->ic = (q->IS + 15) / 16, q->oc = (q->OS + 15) / 16;
    if (q->ic > DEPTHWISE_NARROW_MAX_CHUNKS || q->oc > DEPTHWISE_NARROW_MAX_CHUNKS)
        return false;
    int64_t du[DW_PAD_MAX_TAPS], dv[DW_PAD_MAX_TAPS];
    for (int64_t k = 0; k < K; k++) {
        du[k] = k / g->k[2] * g->d[1] - g->p[1], dv[k] = k % g->k[2] * g->d[2] - g->p[2];
        q->off[k] = du[k] * W + dv[k];
    }
    memset(q->ym, 0, sizeof(uint16_t) * (size_t)(q->oc * K));
    memset(q->xm, 0, sizeof(uint16_t) * (size_t)(q->ic * K));
    const int64_t chunks = q->oc > q->ic ? q->oc : q->ic;
    for (int64_t f = 0, r = 0, s = 0; f < chunks * 16; f++) { /* f = r W + s */
        const int64_t jc = f / 16, l = f % 16;
        for (int64_t k = 0; k < K; k++) {
            if (f < q->OS && r + du[k] >= 0 && r + du[k] < H && s + dv[k] >= 0 && s + dv[k] < W)
                q->ym[jc * K + k] |= (uint16_t)(1u << l);
            if (f < q->IS && r - du[k] >= 0 && r - du[k] < G1 && s - dv[k] >= 0 && s - dv[k] < W)
                q->xm[jc * K + k] |= (uint16_t)(1u << l);
        }
        if (++s == W)
            s = 0, r++;
    }
    return true;
}

typedef struct {
    const ai_conv_params *p;
    const depthwise_narrow_geom *q;
    float *y, *dx;
    const float *x, *dy, *w, *b;
    const ai_conv_epilogue *ep;
    bool assign;
} depthwise_narrow_job;

/* (no contraction into FMAs: each product rounded, as depthwise_channels_last's) */
#define DEPTHWISE_NARROW_ATTR __attribute__((target("arch=x86-64-v4")))
#define DEPTHWISE_NARROW_INLINE static inline __attribute__((always_inline)) DEPTHWISE_NARROW_ATTR

/* Calls BLOCK(j0, nj) over chunks [0, n) in blocks of DEPTHWISE_NARROW_CB, then of 4, 2
 * and 1: nj is a constant in each call (the block's sums stay in registers) */
#define DEPTHWISE_NARROW_BLOCKS(n, BLOCK)                                    \
    do {                                                                     \
        int64_t b0_ = 0;                                                     \
        for (; b0_ + DEPTHWISE_NARROW_CB <= (n); b0_ += DEPTHWISE_NARROW_CB) \
            BLOCK(b0_, DEPTHWISE_NARROW_CB);                                 \
        for (; b0_ + 4 <= (n); b0_ += 4)                                     \
            BLOCK(b0_, 4);                                                   \
        for (; b0_ + 2 <= (n); b0_ += 2)                                     \
            BLOCK(b0_, 2);                                                   \
        for (; b0_ < (n); b0_++)                                             \
            BLOCK(b0_, 1);                                                   \
    } while (0)

/* the first n (1 to 16) floats of v into dst, or added to dst's */
DEPTHWISE_NARROW_INLINE void depthwise_narrow_store(float *dst, __m512 v, int64_t n, bool add)
{
    const __mmask16 m = (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1);
    if (add)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, dst));
    _mm512_mask_storeu_ps(dst, m, v);
}

/* chunks [j0, j0 + nj) of y plane yp: the bias, then taps in order, w[k] *
 * 0 where the tap lies outside (as depthwise_channels_last_sums adds its pads) */
DEPTHWISE_NARROW_INLINE void depthwise_narrow_forward_chunks(const depthwise_narrow_geom *q,
                                                             float *yp, const float *xp,
                                                             const float *wc, float bias,
                                                             int64_t j0, const int nj)
{
    const int64_t K = q->K;
    __m512 acc[DEPTHWISE_NARROW_CB];
    _Pragma("GCC unroll 8") for (int jj = 0; jj < nj; jj++)
        acc[jj] = _mm512_set1_ps(bias);
    for (int64_t k = 0; k < K; k++) {
        const __m512 wk = _mm512_set1_ps(wc[k]);
        const uint16_t *m = q->ym + j0 * K + k;
        const float *src = xp + j0 * 16 + q->off[k];
        _Pragma("GCC unroll 8") for (int jj = 0; jj < nj; jj++)
            acc[jj] = _mm512_add_ps(
                acc[jj], _mm512_mul_ps(wk, _mm512_maskz_loadu_ps(m[jj * K], src + jj * 16)));
    }
    _Pragma("GCC unroll 8") for (int jj = 0; jj < nj; jj++)
        depthwise_narrow_store(yp + (j0 + jj) * 16, acc[jj], q->OS - (j0 + jj) * 16, false);
}

/* chunks [j0, j0 + nj) of dx plane dxp: 0, then w[k] * dy[i - off[k]] for
 * the taps k whose output lies inside, k from the last to the first (the
 * order in which depthwise_channels_last_backward's scatter reaches i; the other taps are
 * skipped, as there); written or added to dx */
DEPTHWISE_NARROW_INLINE void depthwise_narrow_input_grad_chunks(const depthwise_narrow_geom *q,
                                                                float *dxp, const float *gp,
                                                                const float *wc, bool add,
                                                                int64_t j0, const int nj)
{
    const int64_t K = q->K;
    __m512 acc[DEPTHWISE_NARROW_CB];
    _Pragma("GCC unroll 8") for (int jj = 0; jj < nj; jj++)
        acc[jj] = _mm512_setzero_ps();
    for (int64_t k = K - 1; k >= 0; k--) {
        const __m512 wk = _mm512_set1_ps(wc[k]);
        const uint16_t *m = q->xm + j0 * K + k;
        const float *src = gp + j0 * 16 - q->off[k];
        _Pragma("GCC unroll 8") for (int jj = 0; jj < nj; jj++) {
            const __mmask16 mj = m[jj * K];
            acc[jj] = _mm512_mask_add_ps(
                acc[jj], mj, acc[jj],
                _mm512_mul_ps(wk, _mm512_maskz_loadu_ps(mj, src + jj * 16)));
        }
    }
    _Pragma("GCC unroll 8") for (int jj = 0; jj < nj; jj++)
        depthwise_narrow_store(dxp + (j0 + jj) * 16, acc[jj], q->IS - (j0 + jj) * 16, add);
}

/* Planes [lo, hi) of y (then the epilogue on each), or of dx (with dx) */
static DEPTHWISE_NARROW_ATTR void depthwise_narrow_range(void *ctx, int64_t lo, int64_t hi)
{
    const depthwise_narrow_job *j = ctx;
    const depthwise_narrow_geom *q = j->q;
    const int64_t C = j->p->C, K = q->K;
    for (int64_t i = lo; i < hi; i++) {
        const int64_t c = i % C;
        const float *wc = j->w + c * K;
        if (j->dx) {
            const float *gp = j->dy + i * q->OS;
            float *dxp = j->dx + i * q->IS;
#define DEPTHWISE_NARROW_INPUT_GRAD(j0, nj) \
    depthwise_narrow_input_grad_chunks(q, dxp, gp, wc, !j->assign, j0, nj)
            DEPTHWISE_NARROW_BLOCKS(q->ic, DEPTHWISE_NARROW_INPUT_GRAD);
#undef DEPTHWISE_NARROW_INPUT_GRAD
            continue;
        }
        const float *xp = j->x + i * q->IS, bias = j->b ? j->b[c] : 0;
        float *yp = j->y + i * q->OS;
#define DEPTHWISE_NARROW_FORWARD(j0, nj) \
    depthwise_narrow_forward_chunks(q, yp, xp, wc, bias, j0, nj)
        DEPTHWISE_NARROW_BLOCKS(q->oc, DEPTHWISE_NARROW_FORWARD);
#undef DEPTHWISE_NARROW_FORWARD
        if (j->ep)
            ep_plane_f32(yp, q->OS, j->ep, c, C);
    }
}
#endif

static bool depthwise_narrow_forward_f32(const ai_conv_params *p, float *y, const float *x,
                                         const float *w, const float *b, const ai_conv_epilogue *ep)
{
#ifdef AI_AVX512_KERNEL
    conv_geom g = conv_geom_of(p, false);
    depthwise_narrow_geom q;
    if (!ai_cpu_avx512() || !depthwise_narrow_geom_of(p, &g, &q))
        return false;
    depthwise_narrow_job j = {.p = p, .q = &q, .y = y, .x = x, .w = w, .b = b, .ep = ep};
    ai_parallel_for(p->N * p->C, ai_grain_of(q.OS * q.K), depthwise_narrow_range, &j);
    return true;
#else
    (void)p, (void)y, (void)x, (void)w, (void)b, (void)ep;
    return false;
#endif
}

/* The input gradient alone, where depthwise_channels_last_backward would compute it (the same
 * values where the CPU has no AVX-512); the weight gradient is left to
 * depthwise_channels_last_backward, whose sums depthwise_narrow would otherwise have to reproduce.
 * Planes of DEPTHWISE_NARROW_INPUT_GRAD_MIN positions or more: on smaller ones
 * depthwise_channels_last's one pass for both gradients costs less than two. */
#define DEPTHWISE_NARROW_INPUT_GRAD_MIN 64
static bool depthwise_narrow_input_grad_f32(const ai_conv_params *p, float *dx, const float *dy,
                                            const float *w, bool assign)
{
#ifdef AI_AVX512_KERNEL
    conv_geom g = conv_geom_of(p, false);
    depthwise_narrow_geom q;
    depthwise_channels_last_geom l;
    int64_t slots, slot;
    if (!ai_cpu_avx512() || g.img_size < DEPTHWISE_NARROW_INPUT_GRAD_MIN ||
        !depthwise_channels_last_backward_geom_of(p, &g, &l, &slots, &slot) ||
        !depthwise_narrow_geom_of(p, &g, &q))
        return false;
    depthwise_narrow_job j = {.p = p, .q = &q, .dx = dx, .dy = dy, .w = w, .assign = assign};
    ai_parallel_for(p->N * p->C, ai_grain_of(q.IS * q.K), depthwise_narrow_range, &j);
    return true;
#else
    (void)p, (void)dx, (void)dy, (void)w, (void)assign;
    return false;
#endif
}

/* ------------------------------------------------ blocked channels (conv.h) */

/*
 * The blocked depthwise sums ("depthwise_blocked"): depthwise_channels_last_range's jobs (a unit of
 * 8 channels of one image, its padded (Hp, Wp, 8) copy xt, the taps' weights wt (K, 8)) with the
 * outputs written straight into the unit's block of y. A row of outputs goes 8 positions at a time
 * (then 4, then 1): per tap one weight vector and 8 FMAs, each reading its input vector at a fixed
 * displacement (stride 1 and 2 compiled as constants), 8 independent
 * accumulators; the epilogue before the store. Rows shorter than 8 or not
 * a multiple of 4 go in flat tiles of 8 positions across rows instead
 * (depthwise_blocked_flat: a 1-wide tail is a chain of dependent FMAs). The taps are summed in
 * order from the bias with FMAs (depthwise_channels_last, for NCHW outputs, rounds each
 * product: the other depthwise kernels' values).
 */
#if defined(__GNUC__)
#define DEPTHWISE_BLOCKED_TILE(NP, S2)                                  \
    for (; o2 + (NP) <= G2; o2 += (NP)) {                               \
        conv_vec8 acc[NP];                                              \
        for (int i = 0; i < (NP); i++)                                  \
            acc[i] = bv;                                                \
        const float *xs = xr + (o2 * (S2) - x0) * 8;                    \
        for (int64_t k = 0; k < K; k++) {                               \
            const conv_vec8 wk = *(const conv_vec8 *)(wt + wo[k]);      \
            const float *xk = xs + off[k];                              \
            for (int i = 0; i < (NP); i++)                              \
                acc[i] += wk * *(const conv_vec8 *)(xk + i * (S2) * 8); \
        }                                                               \
        for (int i = 0; i < (NP); i++) {                                \
            conv_vec8 t = acc[i];                                       \
            VEC_EPILOGUE(t, ab, av, cv, relu);                          \
            *(conv_vec8 *)(yr + (o2 + i) * 8) = t;                      \
        }                                                               \
    }

/* A row's outputs [o2, G2): 8 at a time (stride 1 and 2 as constants),
 * then 4, then 1. */
#define DEPTHWISE_BLOCKED_ROW()       \
    if (s2 == 1)                      \
        DEPTHWISE_BLOCKED_TILE(8, 1)  \
    else if (s2 == 2)                 \
        DEPTHWISE_BLOCKED_TILE(8, 2)  \
    else                              \
        DEPTHWISE_BLOCKED_TILE(8, s2) \
    DEPTHWISE_BLOCKED_TILE(4, s2)     \
    DEPTHWISE_BLOCKED_TILE(1, s2)

/* The outputs [0, OS) in flat tiles of DEPTHWISE_BLOCKED_NP positions (rows of G2, the
 * last tile repeating the last position), for rows too short for the row
 * tiles, whose 1-wide tails are chains of dependent FMAs: each position
 * its input pointer (rs: an output row's step, cs: a column's), the same
 * sums in the same order. */
#define DEPTHWISE_BLOCKED_NP 8
/* A flat tile's taps: acc[i] += w_k x_k(i), k in order, position i's input
 * at src[i] (vectors V of VL lanes; 9 taps unrolled) */
#define DEPTHWISE_BLOCKED_TAPS_K(V, VL, KK)                    \
    _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++) \
    {                                                          \
        const V wk = *(const V *)(wt + k * (VL));              \
        for (int i = 0; i < DEPTHWISE_BLOCKED_NP; i++)         \
            acc[i] += wk * *(const V *)(src[i] + off[k]);      \
    }
#define DEPTHWISE_BLOCKED_FLAT_TAPS(V, VL) \
    if (K == 9)                            \
        DEPTHWISE_BLOCKED_TAPS_K(V, VL, 9) \
    else                                   \
        DEPTHWISE_BLOCKED_TAPS_K(V, VL, K)
static inline void depthwise_blocked_flat(float *yu, const float *xt, const float *wt,
                                          const int64_t *off, int64_t K, int64_t OS, int64_t G2,
                                          int64_t rs, int64_t cs, const conv_vec8 *bvp,
                                          const conv_vec8 *avp, const conv_vec8 *cvp, bool ab,
                                          bool relu)
{
    const conv_vec8 bv = *bvp, av = *avp, cv = *cvp; /* (pointers: no vector arguments) */
    for (int64_t o = 0, o1 = 0, o2 = 0; o < OS; o += DEPTHWISE_BLOCKED_NP) {
        const float *src[DEPTHWISE_BLOCKED_NP];
        conv_vec8 acc[DEPTHWISE_BLOCKED_NP];
        for (int i = 0; i < DEPTHWISE_BLOCKED_NP; i++) {
            src[i] = xt + o1 * rs + o2 * cs;
            acc[i] = bv;
            if (o + i + 1 < OS && ++o2 == G2)
                o1++, o2 = 0;
        }
        DEPTHWISE_BLOCKED_FLAT_TAPS(conv_vec8, 8)
        for (int i = 0; i < DEPTHWISE_BLOCKED_NP && o + i < OS; i++) {
            conv_vec8 t = acc[i];
            VEC_EPILOGUE(t, ab, av, cv, relu);
            *(conv_vec8 *)(yu + (o + i) * 8) = t;
        }
    }
}

AI_GEMM_CLONES static void depthwise_blocked_sums(const void *job, float *yu, const float *xt,
                                                  const float *wt, int64_t c)
{
    const depthwise_channels_last_job_f32 *j = job;
    const conv_geom *g = j->g;
    const depthwise_channels_last_geom *q = j->q;
    const int64_t K = q->K, G1 = g->grid[1], G2 = g->grid[2], s2 = g->s[2];
    const int64_t rs = g->s[1] * q->Wp * 8; /* an output row's step in xt */
    const float *abf = j->ep ? j->ep->ab : NULL;
    const bool ab = abf != NULL, relu = j->ep && j->ep->relu;
    int64_t off[DW_PAD_MAX_TAPS], wo[DW_PAD_MAX_TAPS];
    for (int64_t k = 0; k < K; k++) {
        off[k] = q->off[k] * 8;
        wo[k] = k * 8;
    }
    const int64_t M = j->p->M;
    conv_vec8 bv, av, cv;
    lane_vec_f32(&bv, j->b, c, M);
    lane_vec_f32(&av, abf, c, M);
    lane_vec_f32(&cv, abf ? abf + M : NULL, c, M);
    if (G2 < 8 || G2 % 4) { /* short rows: flat tiles */
        depthwise_blocked_flat(yu, xt, wt, off, K, g->grid_size, G2, rs, s2 * 8, &bv, &av, &cv, ab,
                               relu);
        return;
    }
    const int64_t x0 = 0; /* xt's padding is inside it */
    for (int64_t o1 = 0; o1 < G1; o1++) {
        const float *xr = xt + o1 * rs;
        float *yr = yu + o1 * G2 * 8;
        int64_t o2 = 0;
        DEPTHWISE_BLOCKED_ROW()
    }
}

/* Taps [lo, hi) of a kernel dim whose input index o s - p + k d falls
 * in [0, n). */
static void depthwise_blocked_taps(int64_t o, int64_t s, int64_t p, int64_t d, int64_t kn,
                                   int64_t n, int64_t *lo, int64_t *hi)
{
    const int64_t i0 = o * s - p;
    *lo = i0 >= 0 ? 0 : (-i0 + d - 1) / d;
    *hi = i0 > n - 1 ? 0 : (n - 1 - i0) / d + 1;
    *hi = *hi > kn ? kn : *hi;
    *lo = *lo > *hi ? *hi : *lo;
}

/* The same reading x's block of the unit (H, W, 8) itself, no padded copy:
 * each output row takes the kernel rows that fall inside the input; its
 * columns whose taps all fall inside go through the tiles (the row's taps,
 * at the image's row stride), the border columns add their inside taps
 * (the padding's zeros add nothing). Taken by strided convs of
 * DEPTHWISE_BLOCKED_DIRECT_MIN outputs or more, whose padded copy (of an input 4 times
 * the output at stride 2) costs as much as the sums. At stride 1 the copy
 * is small, reading in place gains nothing measurable, and stride 1 keeps
 * the copy (benchmarks/results/fused-inference.md). */
#define DEPTHWISE_BLOCKED_DIRECT_MIN 64
AI_GEMM_CLONES static void depthwise_blocked_direct(const void *job, float *yu, const float *xu,
                                                    const float *wt, int64_t c)
{
    const depthwise_channels_last_job_f32 *j = job;
    const conv_geom *g = j->g;
    const int64_t G1 = g->grid[1], G2 = g->grid[2];
    const int64_t H = g->img[1], W = g->img[2], s1 = g->s[1], s2 = g->s[2];
    const int64_t k1n = g->k[1], k2n = g->k[2], d1 = g->d[1], d2 = g->d[2];
    const int64_t p1 = g->p[1], p2 = g->p[2], x0 = p2;
    const float *abf = j->ep ? j->ep->ab : NULL;
    const bool ab = abf != NULL, relu = j->ep && j->ep->relu;
    const int64_t M = j->p->M;
    conv_vec8 bv, av, cv;
    lane_vec_f32(&bv, j->b, c, M);
    lane_vec_f32(&av, abf, c, M);
    lane_vec_f32(&cv, abf ? abf + M : NULL, c, M);
    /* outputs [c_lo, c_hi) of a row read only inside columns */
    int64_t c_lo = (p2 + s2 - 1) / s2, c_hi = (W - (k2n - 1) * d2 + p2 + s2 - 1) / s2;
    c_lo = c_lo > G2 ? G2 : c_lo;
    c_hi = c_hi > G2 ? G2 : c_hi < c_lo ? c_lo : c_hi;
    for (int64_t o1 = 0; o1 < G1; o1++) {
        int64_t k1a, k1b, K = 0, off[DW_PAD_MAX_TAPS], wo[DW_PAD_MAX_TAPS];
        depthwise_blocked_taps(o1, s1, p1, d1, k1n, H, &k1a, &k1b);
        const int64_t r = o1 * s1 - p1 + k1a * d1; /* the first row read */
        for (int64_t k1 = k1a; k1 < k1b; k1++)
            for (int64_t k2 = 0; k2 < k2n; k2++, K++) {
                off[K] = ((k1 - k1a) * d1 * W + k2 * d2) * 8;
                wo[K] = (k1 * k2n + k2) * 8;
            }
        const float *xr = xu + (K ? r * W * 8 : 0);
        float *yr = yu + o1 * G2 * 8;
        {
            const int64_t G2 = c_hi; /* the tiles stop there */
            int64_t o2 = c_lo;
            DEPTHWISE_BLOCKED_ROW()
        }
        /* the border columns: [0, c_lo) and [c_hi, G2) */
        for (int64_t b = c_lo > 0 ? 0 : c_hi; b < G2; b = b + 1 == c_lo ? c_hi : b + 1) {
            int64_t k2a, k2b;
            depthwise_blocked_taps(b, s2, p2, d2, k2n, W, &k2a, &k2b);
            const int64_t col = b * s2 - p2;
            conv_vec8 acc = bv;
            for (int64_t k1 = k1a; k1 < k1b; k1++)
                for (int64_t k2 = k2a; k2 < k2b; k2++)
                    acc += *(const conv_vec8 *)(wt + (k1 * k2n + k2) * 8) *
                           *(const conv_vec8 *)(xr + ((k1 - k1a) * d1 * W + col + k2 * d2) * 8);
            VEC_EPILOGUE(acc, ab, av, cv, relu);
            *(conv_vec8 *)(yr + b * 8) = acc;
        }
    }
}
#undef DEPTHWISE_BLOCKED_ROW
#undef DEPTHWISE_BLOCKED_TILE

#ifdef AI_AVX512_KERNEL
/* depthwise_blocked_range_v16's weights, packed once per call after the slots: per pair
 * of units, its taps (K, 16) then its bias, scale and shift (16 lanes
 * each), zeros past the channels */
static void depthwise_blocked_pack_v16(const depthwise_channels_last_job_f32 *j)
{
    enum { L = 16 };
    const int64_t C = j->p->C, M = j->p->M, K = j->q->K, pairs = j->q->units / 2;
    const float *abf = j->ep ? j->ep->ab : NULL;
    float *wt = j->ws + j->q->slots * j->q->slot;
    for (int64_t c = 0; c < pairs * L; c += L, wt += (K + 3) * L)
        for (int l = 0; l < L; l++) {
            const bool in = c + l < C, out = c + l < M;
            for (int64_t k = 0; k < K; k++)
                wt[k * L + l] = in ? j->w[(c + l) * K + k] : 0.0f;
            wt[K * L + l] = out && j->b ? j->b[c + l] : 0.0f;
            wt[(K + 1) * L + l] = out && abf ? abf[c + l] : 0.0f;
            wt[(K + 2) * L + l] = out && abf ? abf[M + c + l] : 0.0f;
        }
}

/*
 * depthwise_blocked with 16-lane vectors (AVX-512), where x is blocked and the units
 * pair up, but for the strided convs depthwise_blocked_direct takes: a job is two
 * units of one image (blocks u and u + 1, 16 channels), copied into one
 * padded xt (Hp, Wp, 16) with their lanes side by side; each output
 * position is then one vector product per tap, its result stored as two
 * 8-lane halves, one into each block. Flat tiles of DEPTHWISE_BLOCKED_NP positions
 * (depthwise_blocked_flat's), each lane's taps in order from the bias with FMAs and the
 * epilogue rounded as depthwise_blocked_sums does: its values bit for bit, in half the
 * vector instructions. The jobs of slots as depthwise_channels_last_range's, pairs of units
 * in place of units, but a thread's range of slots runs as one (their
 * images, or their run of jobs, are consecutive), in the first slot's
 * buffer, its pads zeroed once; the weights are packed once per call
 * (depthwise_blocked_pack_v16): on 6x6 and 3x3 planes a slot's work is
 * small, and per-slot setup or packing per part of the pool's pass would
 * outweigh it (benchmarks/results/threads.md).
 */
AI_AVX512_KERNEL AI_SHORT_LOOPS static void depthwise_blocked_range_v16(void *ctx, int64_t lo,
                                                                        int64_t hi)
{
    const depthwise_channels_last_job_f32 *j = ctx;
    const conv_geom *g = j->g;
    const depthwise_channels_last_geom *q = j->q;
    enum { L = 16, B = DEPTHWISE_CHANNELS_LAST_UNIT };
    const int64_t N = j->p->N, K = q->K, IS = g->img_size;
    const int64_t OS = g->grid_size, G2 = g->grid[2], H = g->img[1], W = g->img[2];
    const int64_t p1 = g->p[1], p2 = g->p[2], Wp = q->Wp;
    const int64_t rs = g->s[1] * Wp * L, cs = g->s[2] * L; /* an output row's, column's step */
    /* x's columns [i2lo, i2hi) and rows [i1lo, i1hi) land inside xt */
    const int64_t i2lo = p2 > 0 ? 0 : -p2, i2hi = Wp - p2 < W ? Wp - p2 : W;
    const int64_t i1lo = p1 > 0 ? 0 : -p1, i1hi = q->Hp - p1 < H ? q->Hp - p1 : H;
    const int64_t units = q->units, pairs = units / 2, jobs = pairs * N;
    const bool inside = p1 >= 0 && p2 >= 0 && H + p1 <= q->Hp && W + p2 <= Wp;
    const bool by_image =
        N >= q->slots || N >= ai_parallel_parts(); /* as depthwise_channels_last_range */
    const float *abf = j->ep ? j->ep->ab : NULL;
    const bool ab = abf != NULL, relu = j->ep && j->ep->relu;
    int64_t off[DW_PAD_MAX_TAPS];
    for (int64_t k = 0; k < K; k++)
        off[k] = q->off[k] * L;
    { /* slots [lo, hi) as one: their images, or their run of jobs, are consecutive */
        float *xt = j->ws + lo * q->slot;
        const int64_t n0 = by_image ? lo * N / q->slots : 0;
        const int64_t ns = by_image ? hi * N / q->slots - n0 : N; /* images per pair */
        const int64_t j0 = by_image ? 0 : lo * jobs / q->slots;
        const int64_t j1 = by_image ? pairs * ns : hi * jobs / q->slots;
        /* xt's pads: the copies write the same positions inside at every job
         * (x's lanes past C are zeros), so the rest is zeroed once */
        dw_zero_pads(xt, sizeof(float), L, q->Hp, Wp, H, W, p1, p2, inside);
        for (int64_t job = j0; job < j1; job++) {
            const int64_t pr = job / ns, n = n0 + job % ns;
            const float *wt =
                j->ws + q->slots * q->slot + pr * (K + 3) * L; /* depthwise_blocked_pack_v16's */
            const conv_vec16 bv = *(const conv_vec16 *)(wt + K * L);
            const conv_vec16 av = *(const conv_vec16 *)(wt + (K + 1) * L);
            const conv_vec16 cv = *(const conv_vec16 *)(wt + (K + 2) * L);
            const float *xu = j->x + (n * units + 2 * pr) * IS * B; /* block u; u + 1 follows */
            for (int64_t i1 = i1lo; i1 < i1hi; i1++)
                for (int64_t i2 = i2lo; i2 < i2hi; i2++) {
                    float *d = xt + ((i1 + p1) * Wp + i2 + p2) * L;
                    const float *a = xu + (i1 * W + i2) * B;
                    *(conv_vec8 *)d = *(const conv_vec8 *)a;
                    *(conv_vec8 *)(d + B) = *(const conv_vec8 *)(a + IS * B);
                }
            float *y0 = j->y + (n * units + 2 * pr) * OS * B, *y1 = y0 + OS * B;
            for (int64_t o = 0, o1 = 0, o2 = 0; o < OS; o += DEPTHWISE_BLOCKED_NP) {
                const float *src[DEPTHWISE_BLOCKED_NP];
                conv_vec16 acc[DEPTHWISE_BLOCKED_NP];
                for (int i = 0; i < DEPTHWISE_BLOCKED_NP;
                     i++) { /* positions past OS repeat the last */
                    src[i] = xt + o1 * rs + o2 * cs;
                    acc[i] = bv;
                    if (o + i + 1 < OS && ++o2 == G2)
                        o1++, o2 = 0;
                }
                DEPTHWISE_BLOCKED_FLAT_TAPS(conv_vec16, L)
                for (int i = 0; i < DEPTHWISE_BLOCKED_NP && o + i < OS; i++) {
                    conv_vec16 t = acc[i];
                    VEC_EPILOGUE_NC(t, ab, av, cv, relu, VEC16_NO_CONTRACT);
                    *(conv_vec8 *)(y0 + (o + i) * B) =
                        __builtin_shufflevector(t, t, 0, 1, 2, 3, 4, 5, 6, 7);
                    *(conv_vec8 *)(y1 + (o + i) * B) =
                        __builtin_shufflevector(t, t, 8, 9, 10, 11, 12, 13, 14, 15);
                }
            }
        }
    }
}
#endif
#undef DEPTHWISE_BLOCKED_FLAT_TAPS
#undef DEPTHWISE_BLOCKED_TAPS_K
#endif


bool depthwise_narrow_forward(const conv_call *c)
{
    return c->dtype == AI_F32 && depthwise_narrow_forward_f32(c->p, c->y, c->x, c->w, c->b, c->ep);
}

bool depthwise_channels_last_forward(const conv_call *c)
{
    return c->dtype == AI_F32 ? channels_last_forward_f32(c) : channels_last_forward_f64(c);
}

bool depthwise_forward(const conv_call *c)
{
    return c->dtype == AI_F32 ? planes_forward_f32(c) : planes_forward_f64(c);
}

bool depthwise_narrow_input_grad(conv_call *c)
{
    if (c->dtype != AI_F32 ||
        !depthwise_narrow_input_grad_f32(c->p, c->dx, c->dy, c->w, c->assign_dx))
        return false;
    c->dx = NULL;
    return true;
}

bool depthwise_channels_last_backward(conv_call *c)
{
    return c->dtype == AI_F32 ? channels_last_backward_f32(c) : channels_last_backward_f64(c);
}

bool depthwise_backward(conv_call *c)
{
    return c->dtype == AI_F32 ? planes_backward_f32(c) : planes_backward_f64(c);
}

/* the largest of the kernels' that may run on this shape */
int64_t depthwise_workspace(const ai_conv_params *p, const conv_geom *g)
{
    if (!conv_is_depthwise(p))
        return 0;
    int64_t elems = !depthwise_channels_last(p, g) ? 0
                    : p->C * (g->grid_size + g->img_size + g->ksize);
    phase_planes d;
    same_planes q;
    dx_phases x;
    if (dx_phases_of(g, &x) && dw_pad_slots(p) * x.size > elems)
        elems = dw_pad_slots(p) * x.size;
    for (int dx = 0; dx < 2; dx++) {
        if (dw_pad_of(p, g, dx, &d) && dw_pad_slots(p) * d.size > elems)
            elems = dw_pad_slots(p) * d.size;
        if (dw_pad_of(p, g, dx, &d) && dw_same(&d, !dx, &q) &&
            dw_pad_slots(p) * q.copies * q.plane > elems)
            elems = dw_pad_slots(p) * q.copies * q.plane;
    }
    depthwise_channels_last_geom l;
    int64_t slots, slot;
    if (depthwise_channels_last_geom_of(p, g, &l, false) &&
        depthwise_channels_last_elems(&l) > elems)
        elems = depthwise_channels_last_elems(&l);
    if (depthwise_channels_last_backward_geom_of(p, g, &l, &slots, &slot) && slots * slot > elems)
        elems = slots * slot;
    return elems;
}

bool depthwise_blocked_accepts(const ai_conv_params *p, const conv_geom *g)
{
    depthwise_channels_last_geom l;
    return conv_is_depthwise(p) && depthwise_channels_last_geom_of(p, g, &l, true);
}

int64_t depthwise_blocked_workspace(const ai_conv_params *p, const conv_geom *g)
{
    depthwise_channels_last_geom l;
    return depthwise_channels_last_geom_of(p, g, &l, true) ? depthwise_channels_last_elems(&l) : 0;
}

/* y blocked; x blocked when x_blocked, else NCHW */
void depthwise_blocked_forward(const ai_conv_params *p, float *y, const float *x,
                               const float *w, const float *b, float *ws,
                               const ai_conv_epilogue *ep, bool x_blocked)
{
    const conv_geom g = conv_geom_of(p, false);
    depthwise_channels_last_geom l;
    depthwise_channels_last_geom_of(p, &g, &l, true);
#if defined(__GNUC__)
    const bool direct =
        x_blocked && g.grid_size >= DEPTHWISE_BLOCKED_DIRECT_MIN && g.s[1] * g.s[2] > 1;
    depthwise_channels_last_job_f32 j = {p,
                                         &g,
                                         &l,
                                         y,
                                         ws,
                                         x,
                                         w,
                                         b,
                                         ep,
                                         x_blocked,
                                         true,
                                         depthwise_blocked_sums,
                                         direct ? depthwise_blocked_direct : NULL};
#else
    depthwise_channels_last_job_f32 j = {p, &g, &l,        y,    ws,   x,   w,
                                         b, ep, x_blocked, true, NULL, NULL};
#endif
    const int64_t per_slot =
        l.jobs / l.slots * DEPTHWISE_CHANNELS_LAST_UNIT * (g.img_size + g.grid_size * g.ksize);
#if defined(AI_AVX512_KERNEL)
    /* 16 lanes where the units pair up, but for the strided convs that
     * depthwise_blocked_direct reads in place: its 8-lane reads beat the
     * copy (of an input 4 times the output) and 16-lane sums, 0.76 of their
     * time on 16 channels of 48x48 at stride 2, 0.94 on 32 of 24x24
     * (benchmarks/results/suite-ort.md) */
    if (x_blocked && l.units % 2 == 0 && ai_cpu_avx512() && !direct) {
        depthwise_blocked_pack_v16(&j);
        ai_parallel_for(l.slots, ai_grain_of(per_slot), depthwise_blocked_range_v16, &j);
        return;
    }
#endif
    depthwise_channels_last_pack_f32(&j);
    ai_parallel_for(l.slots, ai_grain_of(per_slot), depthwise_channels_last_range_f32, &j);
}

