/*
 * conv.c — Conv and ConvTranspose: parameter checks, output sizes, workspace
 * size, and the kernels of conv_impl.h instantiated for float32 and float64.
 */
#include "conv.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "../parallel.h"
#include "gemm.h"
#include "simd.h"

/* Largest attribute or size accepted: keeps every formula below in int64. */
#define MAX_ATTR INT64_C(0x7fffffff)

static ai_status check_attrs(const ai_conv_params *p, bool transposed)
{
    const char *op = transposed ? "ConvTranspose" : "Conv";
    if (p->nsp < 1 || p->nsp > 3)
        return ai_error(AI_ERR_VALUE, "%s: %d spatial dims, expected 1 to 3", op,
                        p->nsp);
    const struct { const char *name; int64_t v, lo; } counts[] = {
        {"batch size", p->N, 0}, {"input channels", p->C, 1},
        {"output channels", p->M, 1}, {"group", p->group, 1}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i].v < counts[i].lo || counts[i].v > MAX_ATTR)
            return ai_error(AI_ERR_VALUE, "%s: %s %" PRId64 " out of range [%" PRId64
                            ", 2^31)", op, counts[i].name, counts[i].v, counts[i].lo);
    if (p->C % p->group || p->M % p->group)
        return ai_error(AI_ERR_VALUE,
                        "%s: group %" PRId64 " must divide input channels %" PRId64
                        " and output channels %" PRId64, op, p->group, p->C, p->M);
    const struct { const char *name; const int64_t *v; int64_t lo; } attrs[] = {
        {"input size", p->in, 1},         {"kernel", p->kernel, 1},
        {"stride", p->stride, 1},         {"dilation", p->dilation, 1},
        {"pad_begin", p->pad_begin, 0},   {"pad_end", p->pad_end, 0},
        {"output_padding", p->output_padding, 0}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        for (int d = 0; d < p->nsp; d++)
            if (attrs[i].v[d] < attrs[i].lo || attrs[i].v[d] > MAX_ATTR)
                return ai_error(AI_ERR_VALUE,
                                "%s: %s %" PRId64 " along spatial dim %d out of range [%"
                                PRId64 ", 2^31)", op, attrs[i].name, attrs[i].v[d], d,
                                attrs[i].lo);
    for (int d = 0; d < p->nsp; d++) {
        int64_t opad = p->output_padding[d];
        if (!transposed && opad != 0)
            return ai_error(AI_ERR_VALUE, "Conv: output_padding must be 0 (is %" PRId64
                            " along spatial dim %d)", opad, d);
        if (transposed && opad >= p->stride[d] && opad >= p->dilation[d])
            return ai_error(AI_ERR_VALUE,
                            "ConvTranspose: output_padding %" PRId64 " along spatial dim %d"
                            " must be smaller than stride %" PRId64 " or dilation %" PRId64,
                            opad, d, p->stride[d], p->dilation[d]);
    }
    return AI_OK;
}

/* The output size along spatial dim d of parameters that pass check_attrs. */
static ai_status expected_out(const ai_conv_params *p, bool transposed, int d,
                              int64_t *out)
{
    int64_t extent = p->dilation[d] * (p->kernel[d] - 1) + 1; /* dilated kernel */
    int64_t pads = p->pad_begin[d] + p->pad_end[d];
    if (!transposed) {
        if (p->in[d] + pads < extent)
            return ai_error(AI_ERR_VALUE,
                            "Conv: dilated kernel extent %" PRId64 " exceeds padded input"
                            " size %" PRId64 " along spatial dim %d", extent,
                            p->in[d] + pads, d);
        *out = (p->in[d] + pads - extent) / p->stride[d] + 1;
    } else {
        *out = p->stride[d] * (p->in[d] - 1) + p->output_padding[d] + extent - pads;
        if (*out < 1)
            return ai_error(AI_ERR_VALUE,
                            "ConvTranspose: pads %" PRId64 " + %" PRId64 " leave output"
                            " size %" PRId64 " along spatial dim %d", p->pad_begin[d],
                            p->pad_end[d], *out, d);
    }
    return AI_OK;
}

/* *acc *= v unless the product could not be counted in bytes of float64. */
static bool mul_fits(int64_t *acc, int64_t v)
{
    if (v != 0 && *acc > INT64_MAX / 8 / v)
        return false;
    *acc *= v;
    return true;
}

static ai_status check(const ai_conv_params *p, bool transposed)
{
    const char *op = transposed ? "ConvTranspose" : "Conv";
    ai_status st = check_attrs(p, transposed);
    for (int d = 0; st == AI_OK && d < p->nsp; d++) {
        int64_t out = 0;
        st = expected_out(p, transposed, d, &out);
        if (st == AI_OK && p->out[d] != out)
            return ai_error(AI_ERR_VALUE, "%s: output size %" PRId64 " along spatial dim"
                            " %d, expected %" PRId64, op, p->out[d], d, out);
    }
    if (st != AI_OK)
        return st;
    /* x, y, w and the im2col columns must be countable in bytes */
    int64_t xs = p->N, ys = p->N, ws = p->M, cols = transposed ? p->M : p->C;
    bool ok = mul_fits(&xs, p->C) && mul_fits(&ys, p->M) && mul_fits(&ws, p->C);
    cols /= p->group;
    ws /= p->group;
    for (int d = 0; ok && d < p->nsp; d++)
        ok = mul_fits(&xs, p->in[d]) && mul_fits(&ys, p->out[d]) &&
             mul_fits(&ws, p->kernel[d]) && mul_fits(&cols, p->kernel[d]) &&
             mul_fits(&cols, transposed ? p->in[d] : p->out[d]);
    return ok ? AI_OK : ai_error(AI_ERR_NOMEM, "%s: tensor sizes overflow", op);
}

static ai_status infer_out(ai_conv_params *p, bool transposed)
{
    ai_status st = check_attrs(p, transposed);
    for (int d = 0; st == AI_OK && d < p->nsp; d++)
        st = expected_out(p, transposed, d, &p->out[d]);
    return st != AI_OK ? st : check(p, transposed);
}

ai_status ai_conv_check(const ai_conv_params *p) { return check(p, false); }
ai_status ai_convtranspose_check(const ai_conv_params *p) { return check(p, true); }
ai_status ai_conv_infer_out(ai_conv_params *p) { return infer_out(p, false); }
ai_status ai_convtranspose_infer_out(ai_conv_params *p) { return infer_out(p, true); }

/*
 * The geometry of im2col/col2im, always 3-D: 1-D and 2-D convs get leading
 * spatial dims of size 1 (kernel 1, stride 1, no pad). `img` is the image
 * side (Conv: x, ConvTranspose: y), `grid` the side whose positions index the
 * columns (Conv: y, ConvTranspose: x).
 */
typedef struct {
    int64_t img[3], grid[3], k[3], s[3], d[3], p[3];
    int64_t img_size, grid_size, ksize; /* products of img, grid, k */
    bool pointwise; /* columns == image: 1x1 kernel, stride 1, no padding */
} conv_geom;

static conv_geom conv_geom_of(const ai_conv_params *p, bool transposed)
{
    conv_geom g = {.img_size = 1, .grid_size = 1, .ksize = 1, .pointwise = true};
    for (int i = 0; i < 3; i++) {
        int d = i - (3 - p->nsp); /* spatial dim of p; < 0 for an added one */
        bool real = d >= 0;
        g.img[i] = !real ? 1 : transposed ? p->out[d] : p->in[d];
        g.grid[i] = !real ? 1 : transposed ? p->in[d] : p->out[d];
        g.k[i] = real ? p->kernel[d] : 1;
        g.s[i] = real ? p->stride[d] : 1;
        g.d[i] = real ? p->dilation[d] : 1;
        g.p[i] = real ? p->pad_begin[d] : 0;
        g.img_size *= g.img[i];
        g.grid_size *= g.grid[i];
        g.ksize *= g.k[i];
        g.pointwise = g.pointwise && g.k[i] == 1 && g.s[i] == 1 && g.p[i] == 0 &&
                      g.img[i] == g.grid[i];
    }
    return g;
}

/*
 * Pointwise forwards on small planes (MobileNet's last blocks: 6x6 and 3x3)
 * take one GEMM for the whole batch: x's planes gathered side by side as
 * xs (C, N OS), ys (M, N OS) = w @ xs, then scattered into y with the bias
 * and the epilogue. The library packs w once instead of once per image,
 * and its tiles are not cut by planes of 9 or 36 columns. Planes of
 * PW_BATCH_MAX positions or fewer; measured (batch 16, 1 thread, against a
 * GEMM per image): 256 -> 256 on 3x3 -31%, 128 -> 128 on 6x6 -9%, 8x8 +-0,
 * KWS's 25x5 +7% (so not taken there); MobileNet's eval forward -5%. The
 * backward the same way (conv_impl.h): dy gathered once, dw += dys @ xs^T
 * in one GEMM of depth N OS (not N GEMMs of depth OS), dxs = w^T @ dys
 * scattered into dx. C harness, dx, dw and db, best of 3 alternating
 * rounds: 256 -> 256 on 3x3 1053 -> 622 us, 128 -> 256 on 3x3 428 -> 336,
 * 128 -> 128 on 6x6 674 -> 601, 64 -> 128 on 6x6 +-0; 25x5 and 12x12
 * 5-15% slower (so the same bound).
 */
#define PW_BATCH_MAX 64
static bool pw_batched(const ai_conv_params *p, const conv_geom *g)
{
    return g->pointwise && p->group == 1 && p->N > 1 && g->grid_size <= PW_BATCH_MAX;
}

/*
 * On more than one thread, pointwise forwards whose GEMM per image is under
 * PW_IMAGE_FLOPS (the GEMMs then stay on one thread, gemm.c) split the
 * images across threads instead: each image's GEMM on one thread, the same
 * library call, so the same values. KWS's 64 -> 64 on 25x5 at 2 threads
 * had been slower than at 1 (every image's GEMM in turn on one thread, the
 * pool's other thread waking and waiting around each pass). Their backward
 * (pw_small, at any thread count, so that the values do not depend on it):
 * dx image by image and dw by panels of 64 of its rows (each summed over
 * the images in order) in one pass of the pool (conv_impl.h). KWS's 64 -> 64 backward had been slower
 * at 2 threads than at 1 (0.59 -> 0.65 ms); now about 0.45 ms. KWS's
 * training step, same-process A/B: 0.91 of the time before at 2 threads,
 * 0.99 at 1.
 */
#define PW_IMAGE_FLOPS (INT64_C(1) << 21)
static bool pw_small(const ai_conv_params *p, const conv_geom *g)
{
    return g->pointwise && p->group == 1 && p->N > 1 &&
           2 * p->M * p->C * g->grid_size < PW_IMAGE_FLOPS;
}

static bool pw_images(const ai_conv_params *p, const conv_geom *g)
{
    return pw_small(p, g) && ai_get_num_threads() > 1;
}

/* Row r = (c, k0, k1, k2) of the columns reads image plane c, at position
 * grid_position * stride + off in each dim. */
typedef struct {
    int64_t plane, off[3];
} conv_tap;

static conv_tap conv_tap_of(const conv_geom *g, int64_t r)
{
    int64_t k[3] = {r / (g->k[1] * g->k[2]) % g->k[0], r / g->k[2] % g->k[1],
                    r % g->k[2]};
    conv_tap t = {.plane = r / g->ksize * g->img_size};
    for (int i = 0; i < 3; i++)
        t.off[i] = k[i] * g->d[i] - g->p[i];
    return t;
}

/* One input channel per group (depthwise, any channel multiplier): the direct
 * kernels of conv_impl.h, no columns. (One group is a plain conv: GEMM.) */
static bool conv_depthwise(const ai_conv_params *p)
{
    return p->C == p->group && p->group > 1;
}

enum { DW_FWD, DW_DX, DW_DW }; /* modes of dw_plane (conv_impl.h) */

/* The output positions [*lo, *hi) of a grid dim of size `grid` whose input
 * position o * s + off lies in [0, img). */
static void tap_range(int64_t off, int64_t s, int64_t img, int64_t grid, int64_t *lo,
                      int64_t *hi)
{
    *lo = off >= 0 ? 0 : (-off + s - 1) / s;
    *hi = img - 1 - off < 0 ? 0 : (img - 1 - off) / s + 1;
    *hi = *hi < grid ? *hi : grid;
    *lo = *lo < *hi ? *lo : *hi;
}

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
 * partial vectors) then costs more than the arithmetic. Same-process A/B,
 * 16 images, MobileNet's shapes, time with / without: 128 channels 6x6
 * stride 2 (3x3 out): forward 0.41, backward 0.55-0.63; 64 channels 12x12
 * stride 2 (6x6 out): 0.69, 0.59-0.82; 256 channels 3x3 stride 1: 0.52,
 * 0.58-0.72. Larger planes lose: 128 channels 6x6 stride 1: forward 1.2;
 * 12x12 stride 1: 1.5-2.5; 24x24 stride 2: forward 1.26. MobileNet, batch
 * 16: eval and training step 3.3% faster. */
static bool depthwise_small_planes(const ai_conv_params *p, const conv_geom *g)
{
    bool strided = false;
    for (int i = 0; i < 3; i++)
        strided |= g->s[i] > 1;
    return depthwise_channels_last(p, g) &&
           (g->grid_size <= 16 || (strided && g->grid_size <= 36));
}

/*
 * Depthwise forward (any stride) and input gradient (stride 1) of 1 or 2
 * spatial dims through zero-padded planes: a source plane (x, or dy for the
 * input gradient) is copied once into `s1 * s2` stride-phase planes of R1
 * rows of R2, phase (a, b) holding padded[i s1 + a][j s2 + b]. Output row o1
 * then reads tap k's values contiguously from base[k] + o1 R2 on: each
 * output row is a sum of K contiguous rows, with no bounds in the loops (the
 * pads are zeros). The forward taps are k d (padded by the conv's pads);
 * the input gradient is the stride-1 correlation of dy, padded by
 * P = (K - 1) d - p, with taps p + P - k d, in the same tap order.
 * Each of at most DW_PAD_SLOTS threads' ranges has its own slot of `size`
 * elements in the workspace. The weight gradient (any stride) reads the
 * same planes of x; narrow rows and stride-1 same-width planes have the
 * flat forms below.
 */
#define DW_PAD_MAX_TAPS 64
#define DW_PAD_SLOTS 32
#define DW_PAD_LANES 16 /* outputs per row chunk; rows are read this far past their end */
typedef struct {
    int64_t H, W, G1, G2; /* source plane, output plane */
    int64_t P1, P2, s1, s2, R1, R2;
    int64_t size;         /* elements of a slot: the phase planes and a tail */
    int64_t K, base[DW_PAD_MAX_TAPS];
} phase_planes;

/*
 * Depthwise forward, channels-last ("dwl"), one output channel per input
 * channel, 1 or 2 spatial dims. A job is DWL_UNIT channels of one image:
 * they are transposed into xt (Hp Wp, DWL_UNIT), zero-padded, positions
 * major; every output position is then a sum of K vector products over the
 * unit's channels at once (tap k at + off[k] positions), into yt (OS,
 * DWL_UNIT), which is transposed back into y's planes. No phase planes, no
 * per-plane setup: on small planes and strided convs the plane-by-plane
 * kernels spend most of their time there. Each element starts from its
 * bias and gets its taps in order (pads add w * 0), as in the other
 * depthwise kernels: the same values. The weights are packed once per
 * call, after the slots (dwl_pack). Each of at most DW_PAD_SLOTS threads'
 * ranges has its own slot (xt, yt) and takes its share of the images (with
 * fewer images than slots or parts, of the jobs), units major (xt's zero
 * pads are reused): a thread reads the images that the layer before wrote
 * on it. (Split by units, half of each
 * thread's input came from the other core's cache: KWS's eval at 2
 * threads, per-node profile, 1.32 -> 1.59 times the 1-thread speed, its
 * depthwise convs 1.25 -> 1.55, the pointwise ones after them 1.33 ->
 * 1.60.) Float32 stride-1 convs on narrow planes as wide as their output
 * go to dwn (end of this file) first where the CPU has AVX-512.
 */
#define DWL_UNIT 8 /* channels per job: one vector of float */
/* Stride-1 outputs of more positions stay plane by plane, where rows are
 * long enough to vectorise. C harness, batch 16, 1 thread, time against the
 * plane kernels (best of 5 alternating rounds; MobileNet's and KWS's
 * shapes): stride 2: 16 ch 48x48 0.79, 32 ch 24x24 0.44-0.46, 64 ch 12x12
 * 0.63-0.76, 128 ch 6x6 0.42-0.58; stride 1: 256 ch 3x3 0.56-0.67, 128 ch
 * 6x6 0.54-0.73, 64 ch 12x12 0.85-0.90, 64 ch 25x5 0.81-0.83, 32 ch 24x24
 * 0.96-0.99, 16 ch 48x48 0.91-1.3, 8 ch 48x48 1.33-1.68. */
#define DWL_MAX_GRID 256
typedef struct {
    int64_t Hp, Wp, units, jobs, slots, slot; /* slot: elements of a slot */
    int64_t K, off[DW_PAD_MAX_TAPS];
} dwl_geom;

static bool dwl_of(const ai_conv_params *p, const conv_geom *g, dwl_geom *q, bool blocked)
{
    if (p->M != p->C || p->group != p->C || p->N == 0 || g->img[0] != 1 ||
        g->ksize > DW_PAD_MAX_TAPS ||
        (!blocked && g->s[1] == 1 && g->s[2] == 1 && g->grid_size > DWL_MAX_GRID))
        return false;
    q->Hp = (g->grid[1] - 1) * g->s[1] + (g->k[1] - 1) * g->d[1] + 1;
    q->Wp = (g->grid[2] - 1) * g->s[2] + (g->k[2] - 1) * g->d[2] + 1;
    if (q->Hp * q->Wp > 4 * (g->img_size + g->grid_size) + 64) /* sparse taps, huge pads */
        return false;
    q->units = (p->C + DWL_UNIT - 1) / DWL_UNIT;
    q->jobs = q->units * p->N;
    q->slots = q->jobs < DW_PAD_SLOTS ? q->jobs : DW_PAD_SLOTS;
    q->slot = (q->Hp * q->Wp + g->grid_size) * DWL_UNIT; /* xt, yt */
    if (blocked && 2 * q->Hp * q->Wp * DWL_UNIT > q->slot)
        q->slot = 2 * q->Hp * q->Wp * DWL_UNIT; /* dwb_range_v16's xt */
    q->K = g->ksize;
    for (int64_t k = 0; k < q->K; k++)
        q->off[k] = k / g->k[2] * g->d[1] * q->Wp + k % g->k[2] * g->d[2];
    return true;
}

/* dwl's workspace: the slots, then the packed weights (dwl_pack), or
 * those and the bias, scale and shift lanes (dwb_pack_v16) */
static int64_t dwl_elems(const dwl_geom *q)
{
    return q->slots * q->slot + q->units * (q->K + 3) * DWL_UNIT;
}

/* The depthwise backward channels-last (dwl_backward, conv_impl.h): dwl_of's
 * geometry, x's planes inside the padded buffer (no rows or columns cut),
 * one job per unit; `slot`: elements of a slot (xt, dxt, dyt, wt). The
 * smallest planes keep depthwise_small_planes' path. C harness, dx, dw and
 * db, batch 16, 1 thread, best of 2 alternating rounds, against the
 * plane-by-plane kernels: stride 2: 16 ch 48x48 0.48, 32 ch 24x24 0.32,
 * 64 ch 12x12 0.41; stride 1: 128 ch 6x6 0.81, 64 ch 12x12 0.57, 64 ch 25x5
 * 0.83; 256 ch 3x3 (small planes) 1.3, so not taken. */
static bool dwl_backward_of(const ai_conv_params *p, const conv_geom *g, dwl_geom *q,
                            int64_t *slots, int64_t *slot)
{
    if (!dwl_of(p, g, q, false) || depthwise_small_planes(p, g) || g->p[1] < 0 || g->p[2] < 0 ||
        g->img[1] + g->p[1] > q->Hp || g->img[2] + g->p[2] > q->Wp)
        return false;
    *slots = q->units < DW_PAD_SLOTS ? q->units : DW_PAD_SLOTS;
    *slot = (2 * q->Hp * q->Wp + g->grid_size + g->ksize) * DWL_UNIT;
    return true;
}

/* The phase planes of Conv geometry g's source planes (x; dy with `dx`, for
 * stride 1), taps and sizes; false for 3 spatial dims, too many taps, or
 * pads much larger than the image. */
static bool phase_planes_of(const conv_geom *g, bool dx, phase_planes *d)
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
    return conv_depthwise(p) && p->N > 0 && phase_planes_of(g, dx, d);
}

/* Whether a depthwise forward (where dwl_forward declines) adds to whole y
 * planes holding the bias (the plain per-plane kernels); the others read
 * only each plane's first element for it (`uniform`, channels-last). */
static bool dw_forward_reads_planes(const ai_conv_params *p, const conv_geom *g)
{
    phase_planes d;
    return !depthwise_small_planes(p, g) && !dw_pad_of(p, g, false, &d) &&
           !depthwise_channels_last(p, g);
}

/* Output rows narrower than a chunk of DW_PAD_LANES: computed as one flat
 * run of rows of R2 positions (dw_pad_flat in conv_impl.h), wasting R2 - G2
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

/*
 * Stride-1 Conv of 1 or 2 spatial dims as "shifted GEMMs", without im2col.
 * The images are zero-padded into planes of Q1 rows of Q2 (the padded height
 * and width) and a zero tail, `nb` images side by side in one row per
 * channel (`span` = nb * PS elements). On the output grid "out1 rows of Q2"
 * (the last Q2 - out2 of each row are junk), kernel tap k = (k1, k2) reads
 * the padded planes from offset off_k = k1 d1 Q2 + k2 d2 on: its operand is
 * a view, and the conv is one GEMM per tap, W_k (M, C) @ planes,
 * accumulated. The junk columns cost (Q2 - out2) / Q2 more flops; a few
 * input channels per group make each GEMM too thin, so those convs keep
 * im2col. (Strided convs split into stride-phase planes the same way were
 * measured no faster than im2col: each tap's GEMM gets 1/stride^2 of the
 * columns with the same thin K.)
 */
typedef struct {
    int64_t Q1, Q2, PS, L; /* padded rows and row, plane + tail, grid of one image */
    int64_t nb, span;      /* images per chunk, elements per channel row */
    int64_t cb; /* grid columns per block: every tap's GEMM on a block that stays in cache */
} conv_shift;

#ifndef CONV_SHIFT_MIN_CG
#define CONV_SHIFT_MIN_CG 8 /* fewer input channels per group: im2col */
#endif
#ifndef CONV_SHIFT_BLOCK
#define CONV_SHIFT_BLOCK 65536 /* elements of an output block: 256 KiB of float32 */
#endif

static bool conv_shift_of(const ai_conv_params *p, const conv_geom *g, conv_shift *sh)
{
    int64_t Cg = p->C / p->group;
    if (g->pointwise || conv_depthwise(p) || g->img[0] != 1 || Cg < CONV_SHIFT_MIN_CG ||
        p->N == 0 || g->s[1] != 1 || g->s[2] != 1)
        return false;
    int64_t tail = (g->k[2] - 1) * g->d[2]; /* largest shift along a row */
    sh->Q1 = g->grid[1] + (g->k[1] - 1) * g->d[1];
    sh->Q2 = g->grid[2] + tail;
    /* planes at most twice the output's sides: the products below fit int64 */
    if (sh->Q1 > 2 * g->grid[1] || sh->Q2 > 2 * g->grid[2])
        return false;
    sh->PS = sh->Q1 * sh->Q2 + tail;
    sh->L = g->grid[1] * sh->Q2;
    if (2 * sh->L > 3 * g->grid_size) /* more than 1.5x the flops of im2col */
        return false;
    int64_t rows = p->C > p->M ? p->C : p->M;
    if (sh->PS > (INT64_C(1) << 40) / (2 * rows)) /* leave the huge to im2col */
        return false;
    /* images per chunk: buffers of about 2^20 elements, at least one image */
    sh->nb = (INT64_C(1) << 20) / (sh->PS * rows);
    sh->nb = sh->nb < 1 ? 1 : sh->nb > p->N ? p->N : sh->nb;
    sh->span = sh->nb * sh->PS;
    int64_t cg_mg = Cg > p->M / p->group ? Cg : p->M / p->group;
    sh->cb = (CONV_SHIFT_BLOCK / cg_mg + 15) / 16 * 16;
    return true;
}

/* Elements of the shifted-GEMM workspace: padded x and padded dx (C, span),
 * the output grid (M, span), the weights and their gradient per tap (K, M, Cg). */
static int64_t conv_shift_elems(const ai_conv_params *p, const conv_geom *g,
                                const conv_shift *sh)
{
    return (2 * p->C + p->M) * sh->span + 2 * g->ksize * p->M * (p->C / p->group);
}

/*
 * Direct float32 Conv of 1 or 2 spatial dims, one group, a kernel larger
 * than 1x1 (those are GEMMs), any stride: image n's C planes are copied into
 * zero-padded stride-phase planes (phase_planes above: tap k of an output
 * row is a contiguous run from base[k] on), and the output is computed on
 * the grid "G1 rows of R2" (the last R2 - G2 of each row are junk, not
 * stored). A register tile of DC_MR output channels by DC_NR grid positions
 * (8 vector accumulators) runs over every (c, k): per step 2 vector loads,
 * 4 broadcasts of weights packed (M / DC_MR, C, K, DC_MR), 8 FMAs. No
 * operand is thin, whatever C is: this beats im2col and the per-tap GEMMs
 * on the few-channel convs of small models. Threads split grid blocks.
 * The tile was 4 x 24 (12 accumulators): with its 3 loads and a broadcast
 * that is every AVX2 register, and GCC's code moved registers around; 4 x 16
 * is 10-40% faster on 3x3 convs of 16-64 channels (C harness, batch 16:
 * 64 -> 64 on 8x8 1.47 -> 0.85-1.07 ms, also for its smaller junk: grids
 * of 80 are 5 blocks, not 4 of 24), 6 x 16 and 8 x 8 in between.
 * Workspace: the packed weights and the planes of one image (of `slots`
 * images for image-parallel runs, below). The input gradient
 * of a stride-1 conv is the same kernel on dy (dconv_dx_params).
 */
#define DC_MR 4
#define DC_NR 16 /* <= 2 * DW_PAD_LANES: what a block reads past a plane's end */
typedef struct {
    phase_planes ph;
    int64_t L, MT; /* grid positions, channel tiles */
    int64_t slots; /* images' planes in the workspace: > 1 for image-parallel runs */
} dconv;

/* On more than one thread, with 2 or more images per thread, each thread
 * takes whole images (planes, blocks, epilogue) in a slot of its own, up to
 * DC_SLOTS slots of at most DC_SLOT_ELEMS each: no pool pass per image and
 * per step. Small grids gain most (KWS's 1 -> 64 stem, 25x5: one image is
 * 10 blocks, and the three passes per image had made it slower on 2 threads
 * than on 1). */
#define DC_SLOTS 8
#define DC_SLOT_ELEMS (INT64_C(1) << 16)

static bool dconv_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype, dconv *dc)
{
    if (dtype != AI_F32 || p->group != 1 || g->ksize == 1 || p->N == 0 ||
        !phase_planes_of(g, false, &dc->ph))
        return false;
    dc->L = dc->ph.G1 * dc->ph.R2;
    dc->MT = (p->M + DC_MR - 1) / DC_MR;
    dc->slots = p->N > 1 && p->C * dc->ph.size <= DC_SLOT_ELEMS
                    ? (p->N < DC_SLOTS ? p->N : DC_SLOTS) : 1;
    return true;
}

static int64_t dconv_elems(const ai_conv_params *p, const dconv *dc)
{
    return dc->MT * DC_MR * p->C * dc->ph.K + dc->slots * p->C * dc->ph.size;
}

/* The Conv whose forward is the input gradient of stride-1 Conv p: dy (M
 * channels) padded by (k - 1) d - pad on each side, with the weights
 * transposed and flipped. False when a pad exceeds (k - 1) d. */
static bool dconv_dx_params(const ai_conv_params *p, ai_conv_params *q)
{
    *q = *p;
    q->C = p->M;
    q->M = p->C;
    for (int i = 0; i < p->nsp; i++) {
        const int64_t span = (p->kernel[i] - 1) * p->dilation[i];
        if (p->stride[i] != 1 || p->pad_begin[i] > span || p->pad_end[i] > span)
            return false;
        q->in[i] = p->out[i];
        q->out[i] = p->in[i];
        q->pad_begin[i] = span - p->pad_begin[i];
        q->pad_end[i] = span - p->pad_end[i];
    }
    return true;
}

static int64_t dconv_dx_elems(const ai_conv_params *p, ai_dtype dtype)
{
    ai_conv_params q;
    dconv dc;
    if (!dconv_dx_params(p, &q))
        return 0;
    conv_geom g = conv_geom_of(&q, false);
    return dconv_of(&q, &g, dtype, &dc) ? dconv_elems(&q, &dc) : 0;
}

/*
 * The backward of a one-group conv that reaches im2col (strided, or not
 * covered by the direct kernels) on several small images: the images in
 * COLS_GROUPS groups (fewer with fewer images), runs of consecutive groups
 * on the pool (one run at one thread), each group's images in turn as the
 * serial path does them (im2col, the GEMMs, col2im, in its run's columns
 * slot), its weight gradient summed in a slot of its own; the slots are
 * then added to dw in group order: the same values at any thread count.
 * Image by image, the GEMMs were too small to split across threads:
 * ResNet-8's strided convs and shortcuts took as long on 2 threads as on 1.
 * (Chunks of images side by side in one GEMM per gradient split well but
 * left L2: 4% slower on 1 thread.) A group's slots (columns and weight
 * gradient) are at most COLS_GROUP_ELEMS. Returns the number of groups, 0
 * for other convs, and for those whose input gradient the direct kernel
 * computes (stride 1, float32): their weight gradient goes to dconv_dw or,
 * where that declines, to the serial loop; reserving the groups' workspace
 * for them had grown LeNet's memory plan by 365 KB for nothing.
 */
#define COLS_GROUPS 8
#define COLS_GROUP_ELEMS (INT64_C(1) << 18)
static int64_t cols_groups_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype)
{
    const int64_t rows = p->C * g->ksize;
    if (p->group != 1 || g->pointwise || p->N < 2 || g->grid_size == 0 ||
        rows * (g->grid_size + p->M) > COLS_GROUP_ELEMS || dconv_dx_elems(p, dtype) > 0)
        return 0;
    return p->N < COLS_GROUPS ? p->N : COLS_GROUPS;
}

/*
 * Direct float32 Conv, channels-last tiles ("dcl"), 1 or 2 spatial dims,
 * one group, not a plain GEMM (a 1x1 kernel strided or padded is taken), at
 * most DCL_MAX_TAPS taps (channel, kernel position), strided or with output
 * rows narrower than 16:
 * the convs whose grids the plane-by-plane direct kernel (dconv) covers
 * badly (phase planes, junk columns, 16-wide blocks on 5-wide rows). The
 * output channels are in the vector lanes, and every output position reads
 * its own input values by offset: no phase planes, no junk, any stride, any
 * row width. A register tile of PX output positions by NV vectors of output
 * channels (12 accumulators) runs over the taps: per tap NV vector loads of
 * the weights and one broadcast per position. The weights are packed by
 * blocks of DCL_MB output channels (the last block narrower), each block
 * (K, its width) in one run: a tile's weights are contiguous. (Packed
 * (K, M8), a tile's rows were M8 floats apart and fell on a few L1 sets:
 * 128 -> 128 pointwise on 6x6 in MobileNet took 8-10% longer.) A job is
 * DCL_CHUNK positions of one image: its tile rows land in a (positions, M8)
 * buffer, which is transposed into y's planes (8 x 8 blocks), the epilogue
 * applied there. A padding conv reads its image from zero-padded copies of
 * its planes, made by the thread that takes the image's first job (in cache
 * for the next ones). A tile skips the kernel rows that read only the
 * copy's zero rows for all its positions (dcl_impl.h: a 3x3 tile on the
 * first or last output row does two thirds of the FMAs; the sums are
 * unchanged): C harness, blocked eval, 1 thread, medians of 3 alternating
 * runs, 64 -> 64 on 8x8 697-727 -> 644-674 us, 16 -> 16 on 32x32 756-795
 * -> 734-748; ResNet-8's per-node profile, the 3x3 convs on 8x8 and 16x16
 * 0.76 -> 0.69 and 0.78 -> 0.73 ms.
 * C harness, batch 16, best of 12 alternating rounds, time against dconv, 1
 * and 2 threads: KWS's 1 -> 64 10x4 stride-2 stem 0.41-0.54, 3 -> 32 stride
 * 2 on 96x96 0.78-0.86, ResNet-8's strided 16 -> 32 and 32 -> 64
 * 0.68-0.84, 64 -> 64 stride 2 on 28x28 0.83-0.85; stride 1 on narrow rows:
 * LeNet's 6 -> 16 5x5 (10 wide) 0.62-0.66, 8 -> 16 on 12x12 0.75-0.78, 64 ->
 * 64 on 8x8 0.87-0.92; against im2col, ResNet-8's 1x1 stride-2 shortcuts
 * 0.87-0.88. Left to dconv: stride 1 on rows of 16 or more
 * (0.93-1.05), more taps (128 -> 128 3x3 on 6x6: 1.07-1.10, the weights of a
 * tile no longer in L2), fewer than 16 output channels (LeNet's 1 -> 6:
 * 0.97-1.44; MobileNet's 3 -> 8 stride-2 stem: 1.05; 1 -> 8 stride 2: 0.75).
 * Workspace: the packed weights and bias, and DCL_SLOTS slots (one per
 * part of a pool pass), each a position buffer and room for an image's
 * padded planes.
 */
#define DCL_MAX_TAPS 640
#define DCL_CHUNK 96
#define DCL_PX_MAX 16 /* positions of the widest tile (one vector of channels, 16 lanes) */
#define DCL_SLOTS 8
#define DCL_MIN_M 16
#define DCL_SLOT_PLANES (INT64_C(1) << 17) /* elements of an image's padded planes */
typedef struct {
    int64_t H, W, Hp, Wp, pb1, pb2, s1, s2, G2; /* plane, padded plane, grid row */
    int64_t M8, K, chunks;                  /* channels in vectors, taps, jobs/image */
    int64_t kh, kw, d1;                     /* kernel rows, columns, row dilation */
    int64_t imgs;                           /* images per job (1, or more for pw) */
    int64_t xl;                             /* x's lanes: 1 (NCHW) or 8 (blocked) */
    int64_t xc;                             /* x's channels as stored: C, or C8 blocked */
    bool padded;                            /* x is read from padded copies */
    bool yb;                                /* y in blocked channels */
    bool pw;                                /* pointwise on blocked x: dclp_tiles */
    int64_t off[DCL_MAX_TAPS];              /* tap (c, k1, k2) in the padded planes */
} dcl_geom;

/* Output channels per block of the packed weights: the widest tile's */
#define DCL_MB 32

/* The width of the block of the packed weights that starts at channel m0:
 * the channels of the tile that starts there. */
static inline int64_t dcl_block_width(int64_t M8, int64_t m0)
{
    return M8 - m0 < DCL_MB ? M8 - m0 : DCL_MB;
}

/* `blocked`: the blocked-channel forward (conv.h), x blocked when `xb`: any
 * stride, any width, pointwise too, any number of output channels (its
 * tiles are stored as they are, no transposes). */
static bool dcl_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype, dcl_geom *q,
                   bool blocked, bool xb)
{
    if (dtype != AI_F32 || p->group != 1 || p->nsp > 2 || p->N == 0 ||
        p->C * g->ksize > DCL_MAX_TAPS || g->grid_size == 0 ||
        (!blocked && (g->pointwise || p->M < DCL_MIN_M ||
                      (g->s[1] == 1 && g->s[2] == 1 && g->grid[2] >= 16))))
        return false;
    const int o = 3 - p->nsp; /* p's dim d is g's dim d + o */
    int64_t pe[3] = {0, 0, 0};
    for (int d = 0; d < p->nsp; d++)
        pe[d + o] = p->pad_end[d];
    q->H = g->img[1];
    q->W = g->img[2];
    q->pb1 = g->p[1];
    q->pb2 = g->p[2];
    q->Hp = q->H + q->pb1 + pe[1];
    q->Wp = q->W + q->pb2 + pe[2];
    q->padded = q->Hp != q->H || q->Wp != q->W;
    q->yb = blocked;
    q->pw = blocked && xb && g->pointwise;
    q->xl = blocked && xb ? AI_CONV_BLOCK : 1;
    q->xc = q->xl == 1 ? p->C : (p->C + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK * AI_CONV_BLOCK;
    q->s1 = g->s[1];
    q->s2 = g->s[2];
    q->G2 = g->grid[2];
    q->M8 = (p->M + 7) / 8 * 8;
    q->K = p->C * g->ksize;
    q->kh = g->k[1];
    q->kw = g->k[2];
    q->d1 = g->d[1];
    q->chunks = (g->grid_size + DCL_CHUNK - 1) / DCL_CHUNK;
    q->imgs = 1;
    if (q->pw && g->grid_size < DCL_CHUNK) {
        /* images of a job: at most a chunk's positions, the jobs a multiple
         * of the slots (n_slots_of: 16 images of 3x3 in 2 slots go 8 + 8,
         * not 10 + 6) and as even as they go */
        const int64_t most = DCL_CHUNK / g->grid_size, parts = ai_parallel_parts();
        const int64_t nt = parts < DCL_SLOTS ? parts : DCL_SLOTS;
        int64_t jobs = (p->N + most - 1) / most;
        jobs = (jobs + nt - 1) / nt * nt;
        jobs = jobs < p->N ? jobs : p->N;
        q->imgs = (p->N + jobs - 1) / jobs;
    }
    if (q->padded && q->xc * q->Hp * q->Wp > DCL_SLOT_PLANES)
        return false; /* the slots' planes would make a large workspace */
    int64_t t = 0;
    for (int64_t c = 0; c < p->C; c++) /* channel c: plane c, or lane c % 8 of block c / 8 */
        for (int64_t k1 = 0; k1 < g->k[1]; k1++)
            for (int64_t k2 = 0; k2 < g->k[2]; k2++)
                q->off[t++] = ((c / q->xl * q->Hp + k1 * g->d[1]) * q->Wp + k2 * g->d[2]) * q->xl +
                              c % q->xl;
    return true;
}

/* elements of a slot: its image's padded planes (when the conv pads), its
 * positions' buffer */
static int64_t dcl_slot_elems(const dcl_geom *q)
{
    return (q->padded ? q->xc * q->Hp * q->Wp : 0) + (DCL_CHUNK + DCL_PX_MAX) * q->M8;
}

/* the packed weights, bias and epilogue factors (blocked y), the slots */
static int64_t dcl_elems(const dcl_geom *q)
{
    return (q->K + 3) * q->M8 + DCL_SLOTS * dcl_slot_elems(q);
}

/* ------------------------------------------------ pointwise direct kernel (pwk) */

/*
 * Direct float32 pointwise Conv ("pwk"): 1x1 kernel, stride 1, no padding,
 * one group, at most PWK_MAX_C input channels. y (M, S) = w (M, C) @ x (C,
 * S) per image is a GEMM whose depth C is small (8 to 256 in the model
 * suite), and the library packs both operands at every call, image by image:
 * here the weights are packed once per forward, (M / PWK_MR, C, PWK_MR),
 * x not at all, and a register
 * tile of PWK_MR output channels by PWK_NR positions (12 accumulators: 2
 * vector loads of x, 6 broadcasts of weights, 12 FMAs per input channel)
 * reads x in place, its C rows of 16 positions staying in L1 while the tile
 * walks down the output channels. The bias, the epilogue (as ep_apply: no
 * multiply-add contracted) and Relu are applied in registers before the
 * store: no pass over y afterwards.
 * Planes of PWK_SMALL_S positions or fewer (MobileNet's 6x6 and 3x3) take
 * their positions across the batch: a block's 16 positions may span
 * images, their C values copied into a panel (C, 16), and the tile's rows
 * scattered to their images (a GEMM per image would have blocks of 9 or 36
 * columns). A plane's last block, when shorter than 16, is read from a
 * zero-padded panel too.
 * Same-process A/B in the engine (Conv + BatchNorm + Relu, eval, batch 16,
 * best of 20 alternating rounds) against the GEMM paths (a GEMM per image,
 * or the batch gathered for planes of 64 or fewer): 1 thread 0.92-1.00
 * (64 -> 64 on 25x5 0.97, 8 -> 16 on 48x48 0.94, 64 -> 64 on 12x12 0.92,
 * 256 -> 256 on 3x3 0.95), 2 threads 0.73-0.94 (128 -> 256 on 3x3 0.73).
 * The blocked-channel chains (below) do not come here: this is the NCHW
 * forward (training graphs, convs outside chains).
 * Workspace: the packed weights, and a panel and a tile per slot (thread).
 */
#define PWK_MR 6
#define PWK_NR 16
#define PWK_MAX_C 256
#define PWK_SMALL_S 64
#define PWK_SLOTS 8
#define PWK_WIDE 4 /* channel tiles of a 16-lane tile (AVX-512): 24 accumulators */

typedef struct {
    int64_t S, MT;     /* positions per plane, channel tiles */
    int64_t blocks;    /* position blocks of the batch */
    int64_t per_image; /* blocks per image (0: blocks span images) */
} pwk_geom;

static bool pwk_of(const ai_conv_params *p, const conv_geom *g, ai_dtype dtype, pwk_geom *q)
{
#if defined(__GNUC__)
    if (dtype != AI_F32 || !g->pointwise || p->group != 1 || p->N == 0 || p->C > PWK_MAX_C ||
        g->grid_size == 0 || p->M == 0)
        return false;
    q->S = g->grid_size;
    q->MT = (p->M + PWK_MR - 1) / PWK_MR;
    if (q->S <= PWK_SMALL_S) {
        q->per_image = 0;
        q->blocks = (p->N * q->S + PWK_NR - 1) / PWK_NR;
    } else {
        q->per_image = (q->S + PWK_NR - 1) / PWK_NR;
        q->blocks = p->N * q->per_image;
    }
    return true;
#else
    (void)p, (void)g, (void)dtype, (void)q;
    return false;
#endif
}

/* the packed weights (MT MR, C), then per slot a panel (C, NR) and a tile
 * (PWK_WIDE MR, NR: the 16-lane kernel's; the 8-lane one uses MR rows) */
static int64_t pwk_elems(const ai_conv_params *p, const pwk_geom *q)
{
    return q->MT * PWK_MR * p->C + PWK_SLOTS * (p->C + PWK_WIDE * PWK_MR) * PWK_NR;
}

/* defined after conv_impl.h, whose kernels call them (the f64 ones decline) */
static bool dconv_forward_f32(const ai_conv_params *p, float *y, const float *x,
                              const float *w, const float *b, float *ws,
                              const ai_conv_epilogue *ep);
static bool dconv_dx_f32(const ai_conv_params *p, float *dx, const float *dy, const float *w,
                         float *ws, bool assign);

static bool dconv_dw_f32(const ai_conv_params *p, float *dw, const float *dy, const float *x,
                         float *ws);

/* The direct weight gradient works on chunks of images: per image, its
 * phase planes and its dy laid on the grid (junk columns zero, rows padded:
 * the last vector reads past L). A chunk has enough images for DW_CHUNK_GRID
 * grid positions (the sums across lanes are done once per chunk), within
 * DW_CHUNK_ELEMS elements, at least one (LeNet's 6 -> 16 5x5 conv, 10x10
 * grids: its backward 12-15% faster than with im2col and a GEMM per
 * image). When the shifted GEMMs apply (8 or more input channels) they are
 * faster on grids under DW_MIN_GRID (8x8, 64 channels: dw 0.75 ms against
 * 1.2 in chunks of 13 images), and the kernel declines those. The chunk
 * had been one image there too: ResNet-8's 32 -> 32 on 16x16 (batch 16,
 * 1 thread) then spent two thirds of its dw in the sums across lanes (dw
 * 1.65 ms, 46 GFLOP/s; 0.72 in chunks of 1024 positions, 0.58 of 4096;
 * 16 -> 16 on 32x32 0.69 -> 0.46). 4096 against 1024, training steps in
 * the same process: ResNet-8 0.94 (1 and 2 threads), LeNet 0.97,
 * MobileNet 1.0; 8192 and more: no faster. */
#define DW_MIN_GRID 256
#define DW_CHUNK_GRID 4096
#define DW_CHUNK_ELEMS (INT64_C(1) << 18) /* 1 MiB of float32 */
static int64_t dconv_dw_image_elems(const ai_conv_params *p, const dconv *dc)
{
    return p->C * dc->ph.size + (p->M + 1) / 2 * 2 * (dc->L + DC_NR); /* (rows in pairs) */
}

static int64_t dconv_dw_images(const ai_conv_params *p, const dconv *dc)
{
    int64_t nb = (DW_CHUNK_GRID + dc->L - 1) / dc->L;
    const int64_t fit = DW_CHUNK_ELEMS / dconv_dw_image_elems(p, dc);
    nb = nb > fit ? fit : nb;
    return nb < 1 ? 1 : nb > p->N ? p->N : nb;
}

static int64_t dconv_dw_elems(const ai_conv_params *p, const dconv *dc)
{
    return dconv_dw_images(p, dc) * dconv_dw_image_elems(p, dc);
}

static bool dconv_dw_f64(const ai_conv_params *p, double *dw, const double *dy,
                         const double *x, double *ws)
{
    (void)p, (void)dw, (void)dy, (void)x, (void)ws;
    return false;
}

static bool dconv_forward_f64(const ai_conv_params *p, double *y, const double *x,
                              const double *w, const double *b, double *ws,
                              const ai_conv_epilogue *ep)
{
    (void)p, (void)y, (void)x, (void)w, (void)b, (void)ws, (void)ep;
    return false;
}

static bool dconv_dx_f64(const ai_conv_params *p, double *dx, const double *dy,
                         const double *w, double *ws, bool assign)
{
    (void)p, (void)dx, (void)dy, (void)w, (void)ws, (void)assign;
    return false;
}

/* the depthwise kernels on narrow planes (dwn, after conv_impl.h); float32 */
static bool dwn_forward_f32(const ai_conv_params *p, float *y, const float *x, const float *w,
                            const float *b, const ai_conv_epilogue *ep);
static bool dwn_dx_f32(const ai_conv_params *p, float *dx, const float *dy, const float *w,
                       bool assign);

static bool dwn_forward_f64(const ai_conv_params *p, double *y, const double *x,
                            const double *w, const double *b, const ai_conv_epilogue *ep)
{
    (void)p, (void)y, (void)x, (void)w, (void)b, (void)ep;
    return false;
}

static bool dwn_dx_f64(const ai_conv_params *p, double *dx, const double *dy, const double *w,
                       bool assign)
{
    (void)p, (void)dx, (void)dy, (void)w, (void)assign;
    return false;
}

/* weight gradients without the GEMM library (pwb, after pwk below) */
static int64_t pwb_elems(const ai_conv_params *p, const conv_geom *g);
static bool pwb_dw_f32(const ai_conv_params *p, float *dw, const float *dy, const float *x,
                       float *ws);
static bool pwb_dx_f32(const ai_conv_params *p, float *dx, const float *dy, const float *w,
                       float *ws);
static bool pwb_dw_f64(const ai_conv_params *p, double *dw, const double *dy, const double *x,
                       double *ws)
{
    (void)p, (void)dw, (void)dy, (void)x, (void)ws;
    return false;
}
static bool pwb_dx_f64(const ai_conv_params *p, double *dx, const double *dy, const double *w,
                       double *ws)
{
    (void)p, (void)dx, (void)dy, (void)w, (void)ws;
    return false;
}
static bool pwb_cols_dw_f32(const ai_conv_params *p, float *dw, const float *dy,
                            const float *x, float *ws);
static bool pwb_cols_dw_f64(const ai_conv_params *p, double *dw, const double *dy,
                            const double *x, double *ws)
{
    (void)p, (void)dw, (void)dy, (void)x, (void)ws;
    return false;
}

static size_t workspace_bytes(const ai_conv_params *p, ai_dtype dtype, bool transposed)
{
    conv_geom g = conv_geom_of(p, transposed);
    conv_shift sh;
    dconv dc; /* forward only: backward keeps the paths below */
    int64_t direct = !transposed && dconv_of(p, &g, dtype, &dc) ? dconv_elems(p, &dc) : 0;
    if (direct && dconv_dw_elems(p, &dc) > direct)
        direct = dconv_dw_elems(p, &dc);
    int64_t direct_dx = !transposed ? dconv_dx_elems(p, dtype) : 0;
    direct = direct_dx > direct ? direct_dx : direct;
    dcl_geom dq;
    if (!transposed && dcl_of(p, &g, dtype, &dq, false, false) && dcl_elems(&dq) > direct)
        direct = dcl_elems(&dq);
    if (!transposed && dtype == AI_F32 && pwb_elems(p, &g) > direct)
        direct = pwb_elems(p, &g);
    if (!transposed && conv_shift_of(p, &g, &sh)) {
        int64_t e = conv_shift_elems(p, &g, &sh);
        return (size_t)(e > direct ? e : direct) * ai_dtype_size(dtype);
    }
    if (!transposed && conv_depthwise(p)) {
        int64_t elems = !depthwise_channels_last(p, &g) ? 0
                        : p->C * (g.grid_size + g.img_size + g.ksize);
        phase_planes d;
        same_planes q;
        dx_phases x;
        if (dx_phases_of(&g, &x) && dw_pad_slots(p) * x.size > elems)
            elems = dw_pad_slots(p) * x.size;
        for (int dx = 0; dx < 2; dx++) {
            if (dw_pad_of(p, &g, dx, &d) && dw_pad_slots(p) * d.size > elems)
                elems = dw_pad_slots(p) * d.size;
            if (dw_pad_of(p, &g, dx, &d) && dw_same(&d, !dx, &q) &&
                dw_pad_slots(p) * q.copies * q.plane > elems)
                elems = dw_pad_slots(p) * q.copies * q.plane;
        }
        dwl_geom l;
        int64_t slots, slot;
        if (dwl_of(p, &g, &l, false) && dwl_elems(&l) > elems)
            elems = dwl_elems(&l);
        if (dwl_backward_of(p, &g, &l, &slots, &slot) && slots * slot > elems)
            elems = slots * slot;
        return (size_t)elems * ai_dtype_size(dtype);
    }
    pwk_geom pq;
    if (!transposed && pwk_of(p, &g, dtype, &pq) && pwk_elems(p, &pq) > direct)
        direct = pwk_elems(p, &pq);
    if (!transposed && pw_batched(p, &g)) {
        const int64_t e = (p->C + p->M) * p->N * g.grid_size;
        return (size_t)(e > direct ? e : direct) * ai_dtype_size(dtype);
    }
    if (g.pointwise)
        return (size_t)direct * ai_dtype_size(dtype);
    int64_t channels = (transposed ? p->M : p->C) / p->group; /* image side */
    int64_t cols = channels * g.ksize * g.grid_size;
    const int64_t groups = transposed ? 0 : cols_groups_of(p, &g, dtype);
    if (groups * p->C * g.ksize * (g.grid_size + p->M) > cols)
        cols = groups * p->C * g.ksize * (g.grid_size + p->M);
    return (size_t)(cols > direct ? cols : direct) * ai_dtype_size(dtype);
}

size_t ai_conv_workspace_bytes(const ai_conv_params *p, ai_dtype dtype)
{
    return workspace_bytes(p, dtype, false);
}

size_t ai_convtranspose_workspace_bytes(const ai_conv_params *p, ai_dtype dtype)
{
    return workspace_bytes(p, dtype, true);
}

#define AI_CAT_(a, b) a##b
#define AI_CAT(a, b) AI_CAT_(a, b)
#define FN(name) AI_CAT(name, SFX)

/* e[q] = s[2 q], o[q] = s[2 q + 1] for q < n (the stride-2 phase planes'
 * fill): two vector loads, two shuffles and two stores per 16 values. */
AI_VEC_DECL(dv_vec, float);
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
        const dv_vec v0 = *(const dv_vec *)(s + 2 * q), v1 = *(const dv_vec *)(s + 2 * q + 8);
        *(dv_vec *)(e + q) = __builtin_shuffle(v0, v1, even);
        *(dv_vec *)(o + q) = __builtin_shuffle(v0, v1, odd);
        next = q + 8;
    }
#endif
    for (; q < n; q++) {
        e[q] = s[2 * q];
        o[q] = s[2 * q + 1];
    }
}

/* dst (8 rows ldd apart) = the 8 x 8 block of src (rows lds apart)
 * transposed: 8 loads, 24 shuffles, 8 stores (the element loops of
 * transpose cost 4-5x as much). Where there are vector shuffles. */
#ifdef AI_HAVE_TRANSPOSE8
/* row i of the block to d[i] (8 rows anywhere) */
static inline __attribute__((always_inline)) void transpose8_to_f32(float *const d[8],
                                                                    const float *src,
                                                                    int64_t lds)
{
    dv_vec r[8];
    for (int i = 0; i < 8; i++)
        r[i] = *(const dv_vec *)(src + i * lds);
    ai_transpose8_f32(r);
    for (int i = 0; i < 8; i++)
        *(dv_vec *)d[i] = r[i];
}

/* the block of rows s[i] (8 rows anywhere) to dst (rows ldd apart), or
 * added to it */
static inline __attribute__((always_inline)) void transpose8_from_f32(float *dst, int64_t ldd,
                                                                      const float *const s[8],
                                                                      bool add)
{
    dv_vec r[8];
    for (int i = 0; i < 8; i++)
        r[i] = *(const dv_vec *)s[i];
    ai_transpose8_f32(r);
    for (int i = 0; i < 8; i++) {
        dv_vec *d = (dv_vec *)(dst + i * ldd);
        if (add)
            *d = *d + r[i];
        else
            *d = r[i];
    }
}

static inline __attribute__((always_inline)) void transpose8_f32(float *dst, int64_t ldd,
                                                                 const float *src, int64_t lds)
{
    float *d[8];
    for (int i = 0; i < 8; i++)
        d[i] = dst + i * ldd;
    transpose8_to_f32(d, src, lds);
}
#endif

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
#define GEMM ai_gemm_f32
#include "conv_impl.h"

#define T double
#define SFX _f64
#define GEMM ai_gemm_f64
#include "conv_impl.h"

void ai_transpose_f32(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                      int64_t cols, bool add)
{
    transpose_f32(dst, ldd, src, lds, rows, cols, add);
}

/* ---------------------------------------------------------------- direct conv */

AI_VEC_DECL(dc_vec, float);
#ifdef AI_AVX512_KERNEL /* 16 floats (the AVX-512 kernels) */
typedef ai_vec16_f32 dcw_vec;
/* DC_NO_CONTRACT for them: GCC 12 rebuilt a 64-byte __builtin_assoc_barrier
 * lane by lane (20 shuffles per vector); an empty asm keeps the product
 * unfused as well */
#define DCW_NO_CONTRACT(v)       \
    ({                           \
        __typeof__(v) nc_ = (v); \
        __asm__("" : "+v"(nc_)); \
        nc_;                     \
    })
#endif
#if defined(__GNUC__)
/* DC_NO_CONTRACT(v): v rounded as computed, not fused with the add that
 * follows into an FMA (AI_GEMM_CLONES functions contract a * b + c; the
 * epilogues must round as ep_apply does) */
#if defined(__has_builtin)
#if __has_builtin(__builtin_assoc_barrier)
#define DC_NO_CONTRACT(v) __builtin_assoc_barrier(v)
#endif
#endif
#endif
#ifndef DC_NO_CONTRACT
#define DC_NO_CONTRACT(v) (v)
#endif
/* The forward epilogue on vector t in registers (any width), as ep_apply
 * computes it: t a + c (rounded twice) when `ab`, then max(t, 0) keeping
 * NaN when `relu`; a and c vectors or scalars. */
#define DC_EPILOGUE(t, ab, a, c, relu) DC_EPILOGUE_NC(t, ab, a, c, relu, DC_NO_CONTRACT)
#define DC_EPILOGUE_NC(t, ab, a, c, relu, NO_CONTRACT)                             \
    do {                                                                           \
        if (ab)                                                                    \
            (t) = NO_CONTRACT((t) * (a)) + (c);                                    \
        if (relu)                                                                  \
            (t) = (__typeof__(t))((__typeof__((t) <= 0))(t) & ~((t) <= 0)); /* NaN kept */ \
    } while (0)
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const dconv *dc;
    const float *x, *b, *wp;
    float *planes, *y;
    bool add;    /* y += instead of y = */
    bool zeroed; /* the planes hold an earlier image's: their pads are zeros */
} dconv_job;

/* Channels [lo, hi) of image x into their phase planes. */
static void dconv_pad_range(void *ctx, int64_t lo, int64_t hi)
{
    const dconv_job *j = ctx;
    for (int64_t c = lo; c < hi; c++)
        dw_pad_fill_f32(&j->dc->ph, j->planes + c * j->dc->ph.size, j->x + c * j->g->img_size,
                        j->zeroed);
}

/* Block blk's valid grid positions, row segment by segment: offset in the
 * tile, offset in a y plane, length; returns their number */
static inline __attribute__((always_inline)) int64_t dconv_segments(const dconv *dc, int64_t blk,
                                                                    int64_t seg_t[DC_NR + 1],
                                                                    int64_t seg_y[DC_NR + 1],
                                                                    int64_t seg_n[DC_NR + 1])
{
    const int64_t R2 = dc->ph.R2, G2 = dc->ph.G2, j0 = blk * DC_NR;
    const int64_t jn = dc->L - j0 < DC_NR ? dc->L - j0 : DC_NR;
    int64_t nseg = 0;
    for (int64_t t = 0, o1 = j0 / R2, o2 = j0 % R2; t < jn; o1++, o2 = 0) {
        const int64_t seg = R2 - o2 < jn - t ? R2 - o2 : jn - t;
        if (G2 > o2) {
            seg_t[nseg] = t;
            seg_y[nseg] = o1 * G2 + o2;
            seg_n[nseg++] = G2 - o2 < seg ? G2 - o2 : seg;
        }
        t += seg;
    }
    return nseg;
}

/* Rows [0, rows) of a block's tile (DC_NR positions per row) into y's
 * planes at channel m0 by its segments (y += with `add`) */
static inline __attribute__((always_inline)) void dconv_store_segments(
    const dconv_job *j, int64_t m0, int rows, const float (*tile)[DC_NR], int64_t nseg,
    const int64_t *seg_t, const int64_t *seg_y, const int64_t *seg_n)
{
    const int64_t OS = j->g->grid_size;
    for (int64_t s = 0; s < nseg; s++)
        for (int r = 0; r < rows; r++) {
            float *dst = j->y + (m0 + r) * OS + seg_y[s];
            const float *src = &tile[r][seg_t[s]];
            if (j->add)
                for (int64_t i = 0; i < seg_n[s]; i++)
                    dst[i] += src[i];
            else
                for (int64_t i = 0; i < seg_n[s]; i++)
                    dst[i] = src[i];
        }
}

AI_GEMM_CLONES AI_SHORT_LOOPS static void dconv_block_range(void *ctx, int64_t lo, int64_t hi)
{
    const dconv_job *j = ctx;
    const dconv *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, PS = dc->ph.size;
    const int64_t OS = j->g->grid_size;
    enum { VL = 8, NV = DC_NR / 8 };
    for (int64_t blk = lo; blk < hi; blk++) {
        const int64_t j0 = blk * DC_NR;
        int64_t seg_t[DC_NR + 1], seg_y[DC_NR + 1], seg_n[DC_NR + 1];
        const int64_t nseg = dconv_segments(dc, blk, seg_t, seg_y, seg_n);
        const bool whole = nseg == 1 && seg_n[0] == DC_NR; /* one run inside a row */
        for (int64_t mt = 0; mt < dc->MT; mt++) {
            dc_vec acc[DC_MR][NV];
            for (int r = 0; r < DC_MR; r++) {
                const float bias = j->b && mt * DC_MR + r < M ? j->b[mt * DC_MR + r] : 0.0f;
                for (int v = 0; v < NV; v++)
                    acc[r][v] = (dc_vec){0} + bias;
            }
            const float *wp = j->wp + mt * C * K * DC_MR;
            /* the channels' taps; a 3x3, 5x5 or 3-tap kernel unrolled (+7-9% on
             * 64-128 channel 3x3 convs) */
#define DC_CHANNELS(KK)                                                                \
    for (int64_t c = 0; c < C; c++) {                                                  \
        const float *xc = j->planes + c * PS + j0;                                     \
        _Pragma("GCC unroll 32") for (int64_t k = 0; k < (KK); k++, wp += DC_MR) {     \
            const float *xs = xc + dc->ph.base[k];                                     \
            dc_vec xv[NV];                                                             \
            for (int v = 0; v < NV; v++)                                               \
                xv[v] = *(const dc_vec *)(xs + v * VL);                                \
            for (int r = 0; r < DC_MR; r++)                                            \
                for (int v = 0; v < NV; v++)                                           \
                    acc[r][v] += wp[r] * xv[v];                                        \
        }                                                                              \
    }
            if (K == 9)
                DC_CHANNELS(9)
            else if (K == 3)
                DC_CHANNELS(3)
            else if (K == 25)
                DC_CHANNELS(25)
            else
                DC_CHANNELS(K)
#undef DC_CHANNELS
            const int rows = M - mt * DC_MR < DC_MR ? (int)(M - mt * DC_MR) : DC_MR;
            if (whole) { /* whole vectors into y */
                for (int r = 0; r < rows; r++) {
                    dc_vec *dst = (dc_vec *)(j->y + (mt * DC_MR + r) * OS + seg_y[0]);
                    for (int v = 0; v < NV; v++) {
                        if (j->add)
                            acc[r][v] += dst[v];
                        dst[v] = acc[r][v];
                    }
                }
                continue;
            }
            float tile[DC_MR][DC_NR];
            memcpy(tile, acc, sizeof tile);
            dconv_store_segments(j, mt * DC_MR, rows, (const float (*)[DC_NR])tile, nseg, seg_t,
                                 seg_y, seg_n);
        }
    }
}

#ifdef AI_AVX512_KERNEL
/* dconv_block_range with 16-lane vectors (AVX-512): a block's DC_NR = 16
 * positions are one vector, and a tile takes 2 blocks by 2 channel tiles
 * (8 channels by 32 positions: 16 of the 32 registers accumulate), fewer
 * at the ends. Each output sums its (c, k) terms in the same order, with
 * FMAs, as the 8-lane tiles: the same values bit for bit. */
AI_AVX512_KERNEL AI_SHORT_LOOPS static void dconv_block_range_v16(void *ctx, int64_t lo,
                                                                  int64_t hi)
{
    const dconv_job *j = ctx;
    const dconv *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, PS = dc->ph.size;
    const int64_t OS = j->g->grid_size, WT = C * K * DC_MR; /* a channel tile's weights */
    /* NM channel tiles (mt on) by NB blocks (blk on) */
#define DCW_TILE(NM, NB)                                                                 \
    {                                                                                    \
        dcw_vec acc[(NM) * DC_MR][NB];                                                   \
        for (int r = 0; r < (NM) * DC_MR; r++) {                                         \
            const int64_t m = mt * DC_MR + r;                                            \
            const float bias = j->b && m < M ? j->b[m] : 0.0f;                           \
            for (int b = 0; b < (NB); b++)                                               \
                acc[r][b] = (dcw_vec){0} + bias;                                         \
        }                                                                                \
        const float *wp = j->wp + mt * WT;                                               \
        for (int64_t c = 0; c < C; c++) {                                                \
            const float *xc = j->planes + c * PS + blk * DC_NR;                          \
            _Pragma("GCC unroll 9") for (int64_t k = 0; k < K; k++, wp += DC_MR) {       \
                const float *xs = xc + dc->ph.base[k];                                   \
                dcw_vec xv[NB];                                                          \
                for (int b = 0; b < (NB); b++)                                           \
                    xv[b] = *(const dcw_vec *)(xs + b * DC_NR);                          \
                for (int t = 0; t < (NM); t++)                                           \
                    for (int r = 0; r < DC_MR; r++)                                      \
                        for (int b = 0; b < (NB); b++)                                   \
                            acc[t * DC_MR + r][b] += wp[t * WT + r] * xv[b];             \
            }                                                                            \
        }                                                                                \
        const int64_t left = M - mt * DC_MR;                                             \
        const int rows = left < (NM) * DC_MR ? (int)left : (NM) * DC_MR;                 \
        for (int b = 0; b < (NB); b++) {                                                 \
            int64_t seg_t[DC_NR + 1], seg_y[DC_NR + 1], seg_n[DC_NR + 1];                \
            const int64_t nseg = dconv_segments(dc, blk + b, seg_t, seg_y, seg_n);       \
            if (nseg == 1 && seg_n[0] == DC_NR) { /* one run inside a row */             \
                for (int r = 0; r < rows; r++) {                                         \
                    dcw_vec *dst = (dcw_vec *)(j->y + (mt * DC_MR + r) * OS + seg_y[0]); \
                    if (j->add)                                                          \
                        acc[r][b] += *dst;                                               \
                    *dst = acc[r][b];                                                    \
                }                                                                        \
                continue;                                                                \
            }                                                                            \
            float tile[(NM) * DC_MR][DC_NR];                                             \
            for (int r = 0; r < (NM) * DC_MR; r++)                                       \
                *(dcw_vec *)tile[r] = acc[r][b];                                         \
            dconv_store_segments(j, mt * DC_MR, rows, (const float (*)[DC_NR])tile, nseg, \
                                 seg_t, seg_y, seg_n);                                   \
        }                                                                                \
    }
    for (int64_t blk = lo; blk < hi; blk += 2)
        for (int64_t mt = 0; mt < dc->MT; mt += 2) {
            if (blk + 1 < hi && mt + 1 < dc->MT)
                DCW_TILE(2, 2)
            else if (blk + 1 < hi)
                DCW_TILE(1, 2)
            else if (mt + 1 < dc->MT)
                DCW_TILE(2, 1)
            else
                DCW_TILE(1, 1)
        }
#undef DCW_TILE
}
#endif

/* the block kernel of this CPU */
static void (*dconv_blocks_fn(void))(void *, int64_t, int64_t)
{
#ifdef AI_AVX512_KERNEL
    if (ai_cpu_avx512())
        return dconv_block_range_v16;
#endif
    return dconv_block_range;
}

/* Slots [lo, hi) of an image-parallel run (dconv_of): each its share of
 * the images, in its own planes, one thread each pass. */
typedef struct {
    const dconv_job *j; /* x, y, planes: of the batch, the first slot */
    const ai_conv_epilogue *ep;
    int64_t blocks;
} dconv_images_job;

static void dconv_images_range(void *ctx, int64_t lo, int64_t hi)
{
    const dconv_images_job *ij = ctx;
    const dconv_job *b = ij->j;
    const int64_t N = b->p->N, C = b->p->C, M = b->p->M, slots = b->dc->slots;
    const int64_t IS = b->g->img_size, OS = b->g->grid_size;
    for (int64_t s = lo; s < hi; s++)
        for (int64_t n = s * N / slots; n < (s + 1) * N / slots; n++) {
            dconv_job j = *b;
            j.x = b->x + n * C * IS;
            j.y = b->y + n * M * OS;
            j.planes = b->planes + s * C * b->dc->ph.size;
            j.zeroed = n > s * N / slots;
            dconv_pad_range(&j, 0, C);
            dconv_blocks_fn()(&j, 0, ij->blocks);
            if (ij->ep) {
                ep_job_f32 e = {j.y, NULL, ij->ep, M, OS};
                ep_range_f32(&e, 0, M);
            }
        }
}

/* y = conv(x, w) + b (y += conv(x, w) with `add`) by the direct kernel, the
 * weights packed from w (M, C, K), or from wt (C, M, K) transposed and
 * flipped when `flip`; false when it does not apply. */
static bool dconv_run(const ai_conv_params *p, float *y, const float *x, const float *w,
                      bool flip, const float *b, bool add, float *ws,
                      const ai_conv_epilogue *ep)
{
    conv_geom g = conv_geom_of(p, false);
    dconv dc;
    if (!dconv_of(p, &g, AI_F32, &dc))
        return false;
    const int64_t C = p->C, M = p->M, K = dc.ph.K;
    float *wp = ws, *planes = ws + dc.MT * DC_MR * C * K;
    for (int64_t mt = 0; mt < dc.MT; mt++) /* (M/MR, C, K, MR), zero rows past M */
        for (int64_t c = 0; c < C; c++)
            for (int64_t k = 0; k < K; k++)
                for (int r = 0; r < DC_MR; r++) {
                    const int64_t m = mt * DC_MR + r;
                    wp[((mt * C + c) * K + k) * DC_MR + r] =
                        m >= M ? 0 : flip ? w[(c * M + m) * K + K - 1 - k] : w[(m * C + c) * K + k];
                }
    const int64_t blocks = (dc.L + DC_NR - 1) / DC_NR;
    const int nt = ai_get_num_threads();
    if (dc.slots > 1 && nt > 1 && p->N >= 2 * nt) {
        dconv_job j = {p, &g, &dc, x, b, wp, planes, y, add, false};
        dconv_images_job ij = {&j, ep, blocks};
        ai_parallel_for(dc.slots, 1, dconv_images_range, &ij);
        return true;
    }
    for (int64_t n = 0; n < p->N; n++) {
        dconv_job j = {p, &g, &dc, x + n * C * g.img_size, b, wp, planes,
                       y + n * M * g.grid_size, add, n > 0};
        ai_parallel_for(C, ai_grain_of(dc.ph.size), dconv_pad_range, &j);
        ai_parallel_for(blocks, ai_grain_of(DC_NR * M * C * K / 8), dconv_blocks_fn(), &j);
        if (ep) { /* the image's planes while they are in cache (on the register
                   * tiles, a call per tile cost convs of 1 to 6 channels 15-40%) */
            ep_job_f32 e = {y + n * M * g.grid_size, NULL, ep, M, g.grid_size};
            ai_parallel_for(M, ai_grain_of(g.grid_size), ep_range_f32, &e);
        }
    }
    return true;
}

/* ------------------------------------------------ channels-last direct conv (dcl) */

typedef struct {
    const ai_conv_params *p;
    const dcl_geom *q;
    const float *x;
    const float *wp; /* blocks of DCL_MB channels, each (K, width), then the bias,
                      * the epilogue's a and c (M8 each) */
    float *y, *slots;
    const ai_conv_epilogue *ep;
    int64_t OS, jobs, n_slots;
    const float *r; /* blocked y: a residual added before the Relu, or NULL */
    bool wide;      /* the 16-lane tiles (AVX-512, channels a multiple of 16) */
} dcl_job;

/* Slots for `jobs` jobs: one per part of the pool (ai_parallel_parts), at
 * most `max_slots` (the workspace's), at most one per job. */
static int64_t n_slots_of(int64_t jobs, int64_t max_slots)
{
    const int64_t nt = ai_parallel_parts(), n = jobs < max_slots ? jobs : max_slots;
    return n > nt ? nt : n;
}

/* Image x's planes into zero-padded copies at dst (blocked x: its blocks,
 * each position a run of 8 lanes). */
static void dcl_pad_image(const dcl_geom *q, float *dst, const float *x)
{
    const int64_t L = q->xl, Wp = q->Wp * L, W = q->W * L, pb2 = q->pb2 * L;
    const int64_t tail = Wp - pb2 - W, bottom = q->Hp - q->pb1 - q->H;
    for (int64_t c = 0; c < q->xc / L; c++, dst += q->Hp * Wp, x += q->H * W) {
        memset(dst, 0, sizeof(float) * (size_t)(q->pb1 * Wp));
        for (int64_t r = 0; r < q->H; r++) {
            float *row = dst + (q->pb1 + r) * Wp;
            memset(row, 0, sizeof(float) * (size_t)pb2);
            memcpy(row + pb2, x + r * W, sizeof(float) * (size_t)W);
            memset(row + pb2 + W, 0, sizeof(float) * (size_t)tail);
        }
        memset(dst + (q->pb1 + q->H) * Wp, 0, sizeof(float) * (size_t)(bottom * Wp));
    }
}

/* The tiles at 8 lanes (AVX2 or baseline clones), and at 16 where GCC can
 * target AVX-512: taken (dcl_job.wide) when the CPU has it and the output
 * channels are a multiple of 16. ResNet-8's eval forward took 0.63-0.72 of
 * the 8-lane tiles' time, KWS 0.79-0.93, MobileNet 0.81-1.0 (same-process
 * A/B, 1 thread, AVX-512 Xeon). */
#define DCL_V dc_vec
#define DCL_VL 8
#define DCL_SFX _v8
#define DCL_ATTR AI_GEMM_CLONES
#define DCL_SHAPES(TILE)  \
    if (nv >= 4) {        \
        TILE(4, 3)        \
    } else if (nv == 3) { \
        TILE(3, 4)        \
    } else if (nv == 2) { \
        TILE(2, 6)        \
    } else {              \
        TILE(1, 12)       \
    }
#define DCL_NO_CONTRACT DC_NO_CONTRACT
#define DCL_LOAD_BLOCKS(src, ld) (*(const dc_vec *)(src))
#define DCL_STORE_BLOCKS(dst, ld, t) (*(dc_vec *)(dst) = (t))
#include "dcl_impl.h"
#ifdef AI_AVX512_KERNEL
#define DCL_V dcw_vec
#define DCL_VL 16
#define DCL_SFX _v16
#define DCL_ATTR AI_AVX512_KERNEL
/* 3x3 tiles of 8 or 16 positions (rows of 32, 16, 8 whole); pointwise ones
 * of 12 and 16 (24 and 16 accumulators of the 32 registers), the rest by
 * 4, then one at a time (a 125-position image had 5 single positions of 29
 * after its 12-position tiles: 2 FMAs per 3 loads) */
#define DCL_SHAPES(TILE) \
    if (nv >= 2) {       \
        TILE(2, 8)       \
    } else {             \
        TILE(1, 16)      \
    }
#define DCLP_SHAPES(TILE) \
    if (nv >= 2) {       \
        DCLP_TILE(2, 12) \
        TILE(2, 4)       \
    } else {             \
        DCLP_TILE(1, 16) \
        TILE(1, 4)       \
    }
#define DCL_NO_CONTRACT DCW_NO_CONTRACT
#define DCL_LOAD_BLOCKS(src, ld)                                                   \
    __builtin_shufflevector(*(const dc_vec *)(src), *(const dc_vec *)((src) + (ld)), 0, 1, 2, \
                            3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define DCL_STORE_BLOCKS(dst, ld, t)                                               \
    do {                                                                           \
        *(dc_vec *)(dst) = __builtin_shufflevector((t), (t), 0, 1, 2, 3, 4, 5, 6, 7); \
        *(dc_vec *)((dst) + (ld)) =                                                \
            __builtin_shufflevector((t), (t), 8, 9, 10, 11, 12, 13, 14, 15);       \
    } while (0)
#include "dcl_impl.h"
#endif

/* yt (np rows of M8) into positions [p0, p0 + np) of y's M planes (OS
 * apart), then the epilogue on them. */
AI_VECTOR_CLONES static void dcl_store(const dcl_job *j, float *yn, int64_t p0, int64_t np,
                                       const float *yt)
{
    const int64_t M = j->p->M, M8 = j->q->M8, OS = j->OS;
    int64_t m = 0;
#ifdef AI_HAVE_TRANSPOSE8
    for (; m + 8 <= M; m += 8) {
        int64_t i = 0;
        for (; i + 8 <= np; i += 8)
            transpose8_f32(yn + m * OS + p0 + i, OS, yt + i * M8 + m, M8);
        for (; i < np; i++)
            for (int r = 0; r < 8; r++)
                yn[(m + r) * OS + p0 + i] = yt[i * M8 + m + r];
    }
#endif
    for (; m < M; m++)
        for (int64_t i = 0; i < np; i++)
            yn[m * OS + p0 + i] = yt[i * M8 + m];
    if (j->ep)
        for (m = 0; m < M; m++)
            ep_apply_f32(yn + m * OS + p0, yn + m * OS + p0, np, NULL, j->ep, m, M);
}

/* Slots [lo, hi): each its share of the jobs (image, chunk), in order. */
static void dcl_range(void *ctx, int64_t lo, int64_t hi)
{
    const dcl_job *j = ctx;
    const dcl_geom *q = j->q;
    const int64_t M = q->yb ? q->M8 : j->p->M, OS = j->OS;
    for (int64_t s = lo; s < hi; s++) {
        float *yt = j->slots + s * dcl_slot_elems(q), *planes = yt;
        if (q->padded)
            yt += q->xc * q->Hp * q->Wp;
        for (int64_t job = s * j->jobs / j->n_slots, padded = -1;
             job < (s + 1) * j->jobs / j->n_slots; job++) {
            const int64_t n = job / q->chunks * q->imgs, p0 = job % q->chunks * DCL_CHUNK;
            const int64_t np = OS - p0 < DCL_CHUNK ? OS - p0 : DCL_CHUNK;
            const float *xn = j->x + n * q->xc * q->H * q->W;
            if (q->pw) { /* its images, each channel tile over all of them */
                const int64_t n1 = n + q->imgs < j->p->N ? n + q->imgs : j->p->N;
#ifdef AI_AVX512_KERNEL
                if (j->wide)
                    dclp_tiles_v16(j, xn, j->y + n * M * OS, n1 - n, p0, np);
                else
#endif
                    dclp_tiles_v8(j, xn, j->y + n * M * OS, n1 - n, p0, np);
                continue;
            }
            if (q->padded && padded != n) {
                dcl_pad_image(q, planes, xn);
                padded = n;
            }
            float *yn = j->y + n * M * OS;
#ifdef AI_AVX512_KERNEL
            if (j->wide)
                dcl_tiles_v16(j, q->padded ? planes : xn, p0, np, yt, q->yb ? yn : NULL);
            else
#endif
                dcl_tiles_v8(j, q->padded ? planes : xn, p0, np, yt, q->yb ? yn : NULL);
            if (!q->yb)
                dcl_store(j, yn, p0, np, yt);
        }
    }
}

typedef struct {
    float *wp;
    const float *w;
    int64_t K, M, M8;
} pack_job;

/* Blocks [lo, hi) of DCL_MB output channels of w (M, K) into wp, each
 * (K, its width), zero past M: on the pool, the weights of a wide conv are
 * 256 KB and more. */
static void pack_range(void *ctx, int64_t lo, int64_t hi)
{
    const pack_job *j = ctx;
    for (int64_t b = lo; b < hi; b++) {
        const int64_t m0 = b * DCL_MB, bw = dcl_block_width(j->M8, m0);
        const int64_t rows = j->M - m0 < bw ? j->M - m0 : bw;
        float *d = j->wp + m0 * j->K;
        transpose_f32(d, bw, j->w + m0 * j->K, j->K, rows, j->K, false);
        for (int64_t k = 0; rows < bw && k < j->K; k++)
            memset(d + k * bw + rows, 0, sizeof(float) * (size_t)(bw - rows));
    }
}

/* y = conv(x, w) + b by the dcl tiles (dcl_of's `blocked` and `xb`). */
static bool dcl_run(const ai_conv_params *p, float *y, const float *x, const float *w,
                    const float *b, float *ws, const ai_conv_epilogue *ep, bool blocked, bool xb,
                    const float *r)
{
    conv_geom g = conv_geom_of(p, false);
    dcl_geom q;
    if (!dcl_of(p, &g, AI_F32, &q, blocked, xb))
        return false;
    const int64_t K = q.K, M = p->M, M8 = q.M8;
    /* w is (M, C, kernel) = (M, K) */
    pack_job pj = {ws, w, K, M, M8};
    ai_parallel_for((M8 + DCL_MB - 1) / DCL_MB, ai_grain_of(DCL_MB * K), pack_range, &pj);
    const float *ab = ep ? ep->ab : NULL;
    for (int64_t m = 0; m < M8; m++) { /* the bias, the epilogue's factors */
        ws[K * M8 + m] = b && m < M ? b[m] : 0;
        ws[(K + 1) * M8 + m] = ab && m < M ? ab[m] : 0;
        ws[(K + 2) * M8 + m] = ab && m < M ? ab[M + m] : 0;
    }
    dcl_job j = {p, &q, x, ws, y, ws + (K + 3) * M8, ep, g.grid_size,
                 (p->N + q.imgs - 1) / q.imgs * q.chunks, 0, r, M8 % 16 == 0 && ai_cpu_avx512()};
    j.n_slots = n_slots_of(j.jobs, DCL_SLOTS);
    ai_parallel_for(j.n_slots, 1, dcl_range, &j);
    return true;
}

#if defined(__GNUC__)

typedef struct {
    const ai_conv_params *p;
    const pwk_geom *q;
    const float *x, *wp, *b;
    const float *ab; /* the epilogue's factors (2 M), or NULL */
    bool relu;
    float *y, *slots;
    int64_t n_slots;
    int64_t step; /* output channels per tile call: PWK_MR, or PWK_WIDE PWK_MR (wide) */
} pwk_job;

/* Channels [m0, m0 + mr) by the NR positions of xs (C rows, ld apart) into
 * dst (mr rows, ldd apart; whole vectors), with the bias and the epilogue. */
AI_GEMM_CLONES static void pwk_tile(const pwk_job *j, int64_t m0, int mr, const float *xs,
                                    int64_t ld, float *dst, int64_t ldd)
{
    enum { NV = PWK_NR / 8 };
    const int64_t C = j->p->C, M = j->p->M;
    const float *wp = j->wp + m0 * C;
    dc_vec acc[PWK_MR][NV];
    for (int r = 0; r < PWK_MR; r++)
        for (int v = 0; v < NV; v++)
            acc[r][v] = (dc_vec){0};
    for (int64_t c = 0; c < C; c++, wp += PWK_MR, xs += ld) {
        dc_vec xv[NV];
        for (int v = 0; v < NV; v++)
            xv[v] = *(const dc_vec *)(xs + 8 * v);
        for (int r = 0; r < PWK_MR; r++)
            for (int v = 0; v < NV; v++)
                acc[r][v] += wp[r] * xv[v];
    }
    const float *const bias = j->b, *const ab = j->ab; /* (not reloaded after stores) */
    const bool relu = j->relu;
    for (int r = 0; r < mr; r++) {
        const int64_t m = m0 + r;
        for (int v = 0; v < NV; v++) {
            dc_vec t = acc[r][v];
            if (bias)
                t = t + bias[m];
            DC_EPILOGUE(t, ab, ab[m], ab[M + m], relu);
            *(dc_vec *)(dst + r * ldd + 8 * v) = t;
        }
    }
}

#ifdef AI_AVX512_KERNEL
/* pwk_tile with 16-lane vectors (AVX-512): the NR = 16 positions are one
 * vector, so the tile takes PWK_WIDE channel tiles (rows [m0, m0 + rows),
 * rows <= PWK_WIDE PWK_MR; the packed weights hold zero rows past M): the
 * same sums in the same order as the 8-lane tiles. Same-process A/B of the
 * training step, 1 thread: KWS 0.94, MobileNet 0.95 (3 tiles: 0.95, 0.97). */
AI_AVX512_KERNEL static void pwk_tile_v16(const pwk_job *j, int64_t m0, int rows,
                                          const float *xs, int64_t ld, float *dst, int64_t ldd)
{
    const int64_t C = j->p->C, M = j->p->M;
    const float *wp = j->wp + m0 * C;
    dcw_vec acc[PWK_WIDE * PWK_MR];
#define PWW_TILE(NT)                                                                   \
    {                                                                                  \
        for (int r = 0; r < (NT) * PWK_MR; r++)                                        \
            acc[r] = (dcw_vec){0};                                                     \
        const float *x = xs;                                                           \
        for (int64_t c = 0; c < C; c++, x += ld) {                                     \
            const dcw_vec xv = *(const dcw_vec *)x;                                    \
            for (int t = 0; t < (NT); t++)                                             \
                for (int r = 0; r < PWK_MR; r++)                                       \
                    acc[t * PWK_MR + r] += wp[(t * C + c) * PWK_MR + r] * xv;          \
        }                                                                              \
    }
    const int nt = (rows + PWK_MR - 1) / PWK_MR;
    if (nt >= 4)
        PWW_TILE(4)
    else if (nt == 3)
        PWW_TILE(3)
    else if (nt == 2)
        PWW_TILE(2)
    else
        PWW_TILE(1)
#undef PWW_TILE
    const float *const bias = j->b, *const ab = j->ab;
    const bool relu = j->relu;
    for (int r = 0; r < rows; r++) {
        const int64_t m = m0 + r;
        dcw_vec t = acc[r];
        if (bias)
            t = t + bias[m];
        DC_EPILOGUE_NC(t, ab, ab[m], ab[M + m], relu, DCW_NO_CONTRACT);
        *(dcw_vec *)(dst + r * ldd) = t;
    }
}
/* Planes of at least 16 positions, image by image (AVX-512): a tile of
 * PWK_MR channels by up to PWK_WIDE vectors of positions at offsets o[]
 * of image n's plane (the last vector of a plane that is not a multiple of
 * 16 ends at its end, and recomputes lanes the one before it stored: the
 * same values). Per input channel NT vector loads and PWK_MR broadcasts
 * for PWK_MR NT FMAs, where the 24-by-16 tile took a broadcast per FMA.
 * The same sums, in the same order, as the tiles above. KWS's 64 -> 64 on
 * 25x5, batch 16, 1 thread: forward 95 -> 75 us (218 GF/s); training steps
 * (same-process A/B, the order of the two swapped every round): KWS 0.96,
 * MobileNet 0.98. */
AI_AVX512_KERNEL static void pwk_tile_w64(const pwk_job *j, int64_t m0, int rows, int64_t n,
                                          const int64_t *o, int nt)
{
    const int64_t C = j->p->C, M = j->p->M, S = j->q->S;
    const float *wp = j->wp + m0 * C, *x = j->x + n * C * S;
    dcw_vec acc[PWK_MR][PWK_WIDE];
#define PW64_TILE(NT)                                                                  \
    {                                                                                  \
        for (int r = 0; r < PWK_MR; r++)                                               \
            for (int v = 0; v < (NT); v++)                                             \
                acc[r][v] = (dcw_vec){0};                                              \
        const float *xc = x;                                                           \
        for (int64_t c = 0; c < C; c++, xc += S, wp += PWK_MR) {                       \
            dcw_vec xv[NT];                                                            \
            for (int v = 0; v < (NT); v++)                                             \
                xv[v] = *(const dcw_vec *)(xc + o[v]);                                 \
            for (int r = 0; r < PWK_MR; r++)                                           \
                for (int v = 0; v < (NT); v++)                                         \
                    acc[r][v] += wp[r] * xv[v];                                        \
        }                                                                              \
    }
    if (nt >= 4)
        PW64_TILE(4)
    else if (nt == 3)
        PW64_TILE(3)
    else if (nt == 2)
        PW64_TILE(2)
    else
        PW64_TILE(1)
#undef PW64_TILE
    const float *const bias = j->b, *const ab = j->ab;
    const bool relu = j->relu;
    for (int r = 0; r < rows; r++) {
        const int64_t m = m0 + r;
        for (int v = 0; v < nt; v++) {
            dcw_vec t = acc[r][v];
            if (bias)
                t = t + bias[m];
            DC_EPILOGUE_NC(t, ab, ab[m], ab[M + m], relu, DCW_NO_CONTRACT);
            *(dcw_vec *)(j->y + (n * M + m) * S + o[v]) = t;
        }
    }
}

/* items [lo, hi): blocks of PWK_WIDE 16-position vectors, image by image */
static void pwk_range_w64(void *ctx, int64_t lo, int64_t hi)
{
    const pwk_job *j = ctx;
    const int64_t M = j->p->M, S = j->q->S, per = (S + 16 * PWK_WIDE - 1) / (16 * PWK_WIDE);
    for (int64_t item = lo; item < hi; item++) {
        const int64_t n = item / per, s0 = item % per * 16 * PWK_WIDE;
        int64_t o[PWK_WIDE];
        int nt = 0;
        for (; nt < PWK_WIDE && s0 + 16 * nt < S; nt++)
            o[nt] = s0 + 16 * nt + 16 <= S ? s0 + 16 * nt : S - 16;
        for (int64_t m0 = 0; m0 < M; m0 += PWK_MR)
            pwk_tile_w64(j, m0, M - m0 < PWK_MR ? (int)(M - m0) : PWK_MR, n, o, nt);
    }
}
#endif


/* channels [m0, m0 + rows) by the tile of this CPU (rows <= j->step) */
static inline void pwk_tile_of(const pwk_job *j, int64_t m0, int rows, const float *xs,
                               int64_t ld, float *dst, int64_t ldd)
{
#ifdef AI_AVX512_KERNEL
    if (j->step > PWK_MR) {
        pwk_tile_v16(j, m0, rows, xs, ld, dst, ldd);
        return;
    }
#endif
    pwk_tile(j, m0, rows, xs, ld, dst, ldd);
}

/* Block blk's positions: their image n and plane offset s0 when they lie in
 * one image (else n = -1), their count; their x values in xs (ld apart),
 * in place or copied into `panel` (zero past the count). */
static int64_t pwk_block(const pwk_job *j, int64_t blk, float *panel, const float **xs,
                         int64_t *ld, int64_t *n, int64_t *s0)
{
    const pwk_geom *q = j->q;
    const int64_t C = j->p->C, S = q->S;
    int64_t q0, nq;
    if (q->per_image) {
        *n = blk / q->per_image;
        *s0 = blk % q->per_image * PWK_NR;
        q0 = *n * S + *s0;
        nq = S - *s0 < PWK_NR ? S - *s0 : PWK_NR;
    } else {
        q0 = blk * PWK_NR;
        nq = j->p->N * S - q0 < PWK_NR ? j->p->N * S - q0 : PWK_NR;
        *n = q0 / S;
        *s0 = q0 % S;
        if (*s0 + nq > S)
            *n = -1;
    }
    if (*n >= 0 && nq == PWK_NR) {
        *xs = j->x + *n * C * S + *s0;
        *ld = S;
        return nq;
    }
    for (int64_t i = 0; i < PWK_NR; i++) { /* column i of the panel: position q0 + i */
        const int64_t qi = q0 + i, ni = qi / S, si = qi % S;
        const float *src = j->x + ni * C * S + si;
        if (i < nq)
            for (int64_t c = 0; c < C; c++)
                panel[c * PWK_NR + i] = src[c * S];
        else
            for (int64_t c = 0; c < C; c++)
                panel[c * PWK_NR + i] = 0;
    }
    *xs = panel;
    *ld = PWK_NR;
    return nq;
}

/* Slots [lo, hi): each its share of the blocks, in order. */
static void pwk_range(void *ctx, int64_t lo, int64_t hi)
{
    const pwk_job *j = ctx;
    const pwk_geom *q = j->q;
    const int64_t C = j->p->C, M = j->p->M, S = q->S;
    for (int64_t s = lo; s < hi; s++) {
        float *panel = j->slots + s * (C + PWK_WIDE * PWK_MR) * PWK_NR, *tile = panel + C * PWK_NR;
        for (int64_t blk = s * q->blocks / j->n_slots; blk < (s + 1) * q->blocks / j->n_slots;
             blk++) {
            const float *xs;
            int64_t ld, n, s0;
            const int64_t nq = pwk_block(j, blk, panel, &xs, &ld, &n, &s0);
            for (int64_t m0 = 0; m0 < M; m0 += j->step) {
                const int mr = M - m0 < j->step ? (int)(M - m0) : (int)j->step;
                if (n >= 0 && nq == PWK_NR) { /* whole vectors into y */
                    pwk_tile_of(j, m0, mr, xs, ld, j->y + (n * M + m0) * S + s0, S);
                    continue;
                }
                pwk_tile_of(j, m0, mr, xs, ld, tile, PWK_NR);
                const int64_t q0 = n >= 0 ? n * S + s0 : blk * PWK_NR;
                for (int64_t i = 0; i < nq;) { /* runs of positions within one image */
                    const int64_t qi = q0 + i, ni = qi / S, si = qi % S;
                    const int64_t run = S - si < nq - i ? S - si : nq - i;
                    for (int r = 0; r < mr; r++)
                        memcpy(j->y + (ni * M + m0 + r) * S + si, tile + r * PWK_NR + i,
                               sizeof(float) * (size_t)run);
                    i += run;
                }
            }
        }
    }
}
#endif

/* y = the pointwise conv p of x by w (M, C), or by w^T with `wt` (w then
 * (C, M): the input gradient of the conv p with C and M swapped). */
static bool pwk_run(const ai_conv_params *p, float *y, const float *x, const float *w,
                    const float *b, float *ws, const ai_conv_epilogue *ep, bool wt)
{
    conv_geom g = conv_geom_of(p, false);
    pwk_geom q;
    if (!pwk_of(p, &g, AI_F32, &q))
        return false;
#if defined(__GNUC__)
    const int64_t C = p->C, M = p->M;
    for (int64_t mt = 0; mt < q.MT; mt++) /* (MT, C, MR), zero rows past M */
        for (int64_t c = 0; c < C; c++)
            for (int r = 0; r < PWK_MR; r++) {
                const int64_t m = mt * PWK_MR + r;
                ws[(mt * C + c) * PWK_MR + r] = m >= M ? 0 : wt ? w[c * M + m] : w[m * C + c];
            }
    pwk_job j = {p, &q, x, ws, b, ep ? ep->ab : NULL, ep && ep->relu, y,
                 ws + q.MT * PWK_MR * C, 0, ai_cpu_avx512() ? PWK_WIDE * PWK_MR : PWK_MR};
#ifdef AI_AVX512_KERNEL
    if (j.step > PWK_MR && q.per_image && q.S >= 16) {
        const int64_t per = (q.S + 16 * PWK_WIDE - 1) / (16 * PWK_WIDE);
        ai_parallel_for(p->N * per, 1, pwk_range_w64, &j);
        return true;
    }
#endif
    j.n_slots = n_slots_of(q.blocks, PWK_SLOTS);
    ai_parallel_for(j.n_slots, 1, pwk_range, &j);
    return true;
#else
    (void)y, (void)x, (void)w, (void)b, (void)ws, (void)ep;
    return false;
#endif
}

/* ------------------------------------------ weight gradient by own tiles (pwb) */
/*
 * dw (M, K) += dy (M, positions) @ cols^T summed over the images, where
 * cols (K, positions) are an image's x (a pointwise conv, K = C) or its
 * im2col (K = C times the kernel size), without the GEMM library, whose
 * calls per image ran well below its large-GEMM speed (KWS's 64 -> 64 on
 * 25x5, beta 1: 130 GF/s with its AVX-512 kernels, 93 with its AVX2 ones;
 * this kernel 185, 1 thread, AVX-512 Zen 5). The images go in chunks of
 * PWB_CHUNK_ELEMS floats of xt: each image's cols transposed into xt
 * (positions, Kp: K rounded up to the vector, zeros past K), the chunk's
 * images on the pool; then a register tile of PWB_MR rows of dw by PWB_NV
 * vectors of its columns walks the positions of every image of the chunk
 * in order: per position NV vector loads of xt's row, MR broadcasts of dy
 * (MR rows read in order) and MR NV FMAs, the tile then added into dw.
 * Threads split the tiles: each dw element is summed on one thread, images
 * and positions in order, the same values at any thread count.
 * Taken for pointwise convs that pw_small takes (then the input gradient
 * runs on pwk, pwb_dx_f32) and for convs of one group whose input needs
 * no gradient (a model's first conv), where K is at least a vector (fewer:
 * the vectors of xt's rows part empty; MobileNet's 8 -> 16 on 48x48 took
 * 1.5x the GEMMs' time) and at most PWB_MAX_K; in the im2col form at least
 * two vectors and PWB_COLS_MIN_M rows of dw, else the direct dw kernel
 * (dconv_dw) stays. KWS's 10x4 stride-2 stem, 1 -> 64 (40 columns): dw
 * 0.20 -> 0.13 ms, training step 0.98 (same-process A/B, 1 thread); with
 * fewer rows the tiles ran part empty: LeNet's 6 rows 1.21, MobileNet's 8
 * and ResNet-8's 16 1.03. Pointwise convs alone, against the GEMMs on
 * OpenBLAS's AVX2 kernels: KWS 0.90, MobileNet 0.975.
 */
#define PWB_MR 6
#define PWB_NV 2   /* vectors of 8 lanes: 12 accumulators (16 registers with AVX2) */
#define PWB_NV16 4 /* vectors of 16 lanes: 24 accumulators (32 registers with AVX-512) */
#define PWB_MAX_K 256
#define PWB_CHUNK_ELEMS (INT64_C(1) << 17) /* xt's floats per chunk of images (512 KB) */
#define PWB_COLS_MIN_M 32 /* the im2col form: rows of dw (fewer: the direct dw kernel) */

typedef struct {
    int L, nv;                /* lanes, vectors per tile */
    bool cols;                /* cols are x's im2col (else x itself) */
    int64_t K, Kp, S, chunk;  /* dw's columns, xt's row; positions; images per chunk */
    int64_t mt, cb;           /* tiles of dw's rows, of its columns */
} pwb_geom;

/* the tiles of vectors of L lanes (16: the AVX-512 kernel); `cols`: the
 * im2col form (a conv that is not pointwise, its input needing no
 * gradient), else a pointwise conv that pw_small takes */
static bool pwb_of(const ai_conv_params *p, const conv_geom *g, int L, bool cols,
                   pwb_geom *q)
{
#if defined(__GNUC__)
    if (cols ? g->pointwise || p->group != 1 || p->N == 0 || g->grid_size == 0
             : !pw_small(p, g))
        return false;
    q->K = cols ? p->C * g->ksize : p->C;
    if (q->K < L || q->K > PWB_MAX_K || (cols && (p->M < PWB_COLS_MIN_M || q->K < 2 * L)))
        return false;
    q->L = L;
    q->nv = L == 16 ? PWB_NV16 : PWB_NV;
    q->cols = cols;
    q->S = g->grid_size;
    q->Kp = (q->K + L - 1) / L * L;
    q->chunk = PWB_CHUNK_ELEMS / (q->S * q->Kp);
    q->chunk = q->chunk < 1 ? 1 : q->chunk > p->N ? p->N : q->chunk;
    q->mt = (p->M + PWB_MR - 1) / PWB_MR;
    q->cb = (q->Kp + q->nv * L - 1) / (q->nv * L);
    return true;
#else
    (void)p, (void)g, (void)L, (void)cols, (void)q;
    return false;
#endif
}

/* a chunk's xt, then (im2col form) its images' cols */
static int64_t pwb_geom_elems(const pwb_geom *q)
{
    return q->chunk * q->S * (q->Kp + (q->cols ? q->K : 0));
}

/* The input gradient of a pointwise conv p that pw_small takes, dx = w^T dy
 * image by image: the forward of the conv with C and M swapped, by the
 * pointwise kernel (pwk) on w^T. */
static bool pwb_dx_params(const ai_conv_params *p, ai_conv_params *q)
{
    const conv_geom g = conv_geom_of(p, false);
    if (!pw_small(p, &g))
        return false;
    *q = *p;
    q->C = p->M;
    q->M = p->C;
    return true;
}

/* the largest of pwb's workspaces at either width (ai_set_avx512 may change
 * it after planning) and the input gradient's pwk workspace */
static int64_t pwb_elems(const ai_conv_params *p, const conv_geom *g)
{
    int64_t e = 0;
    pwb_geom q;
    for (int i = 0; i < 4; i++)
        if (pwb_of(p, g, i & 1 ? 16 : 8, i >= 2, &q) && pwb_geom_elems(&q) > e)
            e = pwb_geom_elems(&q);
    ai_conv_params d;
    pwk_geom k;
    if (pwb_dx_params(p, &d) && pwk_of(&d, g, AI_F32, &k) && pwk_elems(&d, &k) > e)
        e = pwk_elems(&d, &k);
    return e;
}

#if defined(__GNUC__)
typedef struct {
    const ai_conv_params *p;
    const conv_geom *g;
    const pwb_geom *q;
    const float *dy, *x; /* at the chunk's first image */
    float *dw, *xt, *cols;
    int64_t nb;          /* images in the chunk */
} pwb_job;

static void pwb_pack_range(void *ctx, int64_t lo, int64_t hi)
{
    const pwb_job *j = ctx;
    const int64_t K = j->q->K, S = j->q->S, Kp = j->q->Kp;
    for (int64_t n = lo; n < hi; n++) {
        float *xt = j->xt + n * S * Kp;
        const float *src = j->x + n * j->p->C * j->g->img_size;
        if (j->q->cols) {
            float *cols = j->cols + n * K * S;
            im2col_rows_f32(cols, src, j->g, 0, K, S);
            src = cols;
        }
        transpose_f32(xt, Kp, src, S, K, S, false);
        for (int64_t s = 0; K < Kp && s < S; s++)
            memset(xt + s * Kp + K, 0, sizeof(float) * (size_t)(Kp - K));
    }
}

/* dw rows [m0, m0 + PWB_MR) by columns [c0, c0 + NT L) (rows past M read row
 * M - 1; neither they nor columns past K are stored). V: the vector, L lanes. */
#define PWB_TILE(V, L, NT)                                                             \
    {                                                                                  \
        V acc[PWB_MR][NT];                                                             \
        for (int r = 0; r < PWB_MR; r++)                                               \
            for (int v = 0; v < (NT); v++)                                             \
                acc[r][v] = (V){0};                                                    \
        for (int64_t n = 0; n < j->nb; n++) {                                          \
            const float *xt = j->xt + n * S * Kp + c0, *d[PWB_MR];                     \
            for (int r = 0; r < PWB_MR; r++)                                           \
                d[r] = j->dy + (n * M + (m0 + r < M ? m0 + r : M - 1)) * S;            \
            for (int64_t s = 0; s < S; s++, xt += Kp) {                                \
                V xv[NT];                                                              \
                for (int v = 0; v < (NT); v++)                                         \
                    xv[v] = *(const V *)(xt + v * (L));                                \
                for (int r = 0; r < PWB_MR; r++) {                                     \
                    const float dv = d[r][s];                                          \
                    for (int v = 0; v < (NT); v++)                                     \
                        acc[r][v] += dv * xv[v];                                       \
                }                                                                      \
            }                                                                          \
        }                                                                              \
        for (int r = 0; r < PWB_MR && m0 + r < M; r++)                                 \
            for (int v = 0; v < (NT); v++)                                             \
                for (int i = 0; i < (L) && c0 + v * (L) + i < K; i++)                  \
                    j->dw[(m0 + r) * K + c0 + v * (L) + i] += acc[r][v][i];            \
    }

#define PWB_KERNEL(NAME, ATTR, V, L, NV)                                               \
    ATTR static void NAME(const pwb_job *j, int64_t m0, int64_t c0)                    \
    {                                                                                  \
        const int64_t M = j->p->M, K = j->q->K, S = j->q->S, Kp = j->q->Kp;            \
        const int64_t nt = (Kp - c0) / (L) < (NV) ? (Kp - c0) / (L) : (NV);            \
        if (nt >= (NV))                                                                \
            PWB_TILE(V, L, NV)                                                         \
        else if (nt == 3)                                                              \
            PWB_TILE(V, L, 3)                                                          \
        else if (nt == 2)                                                              \
            PWB_TILE(V, L, 2)                                                          \
        else                                                                           \
            PWB_TILE(V, L, 1)                                                          \
    }

PWB_KERNEL(pwb_tile, AI_GEMM_CLONES, dc_vec, 8, PWB_NV)
#ifdef AI_AVX512_KERNEL
PWB_KERNEL(pwb_tile_v16, AI_AVX512_KERNEL, dcw_vec, 16, PWB_NV16)
#endif
#undef PWB_KERNEL
#undef PWB_TILE

static void pwb_range(void *ctx, int64_t lo, int64_t hi)
{
    const pwb_job *j = ctx;
    const pwb_geom *q = j->q;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t m0 = t / q->cb * PWB_MR, c0 = t % q->cb * q->nv * q->L;
#ifdef AI_AVX512_KERNEL
        if (q->L == 16) {
            pwb_tile_v16(j, m0, c0);
            continue;
        }
#endif
        pwb_tile(j, m0, c0);
    }
}
#endif

/* dw += the weight gradient of conv p where pwb_of takes it (`cols`: see
 * there); false where it declines. */
static bool pwb_run(const ai_conv_params *p, float *dw, const float *dy, const float *x,
                    float *ws, bool cols)
{
    const conv_geom g = conv_geom_of(p, false);
    pwb_geom q;
    if (!pwb_of(p, &g, ai_cpu_avx512() ? 16 : 8, cols, &q))
        return false;
#if defined(__GNUC__)
    const int64_t xt_elems = q.chunk * q.S * q.Kp;
    for (int64_t n0 = 0; n0 < p->N; n0 += q.chunk) {
        pwb_job j = {p, &g, &q, dy + n0 * p->M * q.S, x + n0 * p->C * g.img_size, dw, ws,
                     ws + xt_elems, p->N - n0 < q.chunk ? p->N - n0 : q.chunk};
        ai_parallel_for(j.nb, 1, pwb_pack_range, &j);
        ai_parallel_for(q.mt * q.cb, 1, pwb_range, &j);
    }
    return true;
#else
    (void)dw, (void)dy, (void)x, (void)ws, (void)xt_elems;
    return false;
#endif
}

static bool pwb_dw_f32(const ai_conv_params *p, float *dw, const float *dy, const float *x,
                       float *ws)
{
    return pwb_run(p, dw, dy, x, ws, false);
}

/* the im2col form: only where the input needs no gradient (the caller's) */
static bool pwb_cols_dw_f32(const ai_conv_params *p, float *dw, const float *dy,
                            const float *x, float *ws)
{
    return pwb_run(p, dw, dy, x, ws, true);
}

static bool pwb_dx_f32(const ai_conv_params *p, float *dx, const float *dy, const float *w,
                       float *ws)
{
    ai_conv_params q;
    return pwb_dx_params(p, &q) && pwk_run(&q, dx, dy, w, NULL, ws, NULL, true);
}

static bool dconv_forward_f32(const ai_conv_params *p, float *y, const float *x,
                              const float *w, const float *b, float *ws,
                              const ai_conv_epilogue *ep)
{
    if (pwk_run(p, y, x, w, b, ws, ep, false))
        return true;
    return dcl_run(p, y, x, w, b, ws, ep, false, false, NULL) ||
           dconv_run(p, y, x, w, false, b, false, ws, ep);
}

/* dx += (= with `assign`) the input gradient of stride-1 Conv p by the
 * direct kernel. */
static bool dconv_dx_f32(const ai_conv_params *p, float *dx, const float *dy, const float *w,
                         float *ws, bool assign)
{
    ai_conv_params q;
    return dconv_dx_params(p, &q) && dconv_run(&q, dx, dy, w, true, NULL, !assign, ws, NULL);
}

/*
 * The weight gradient of a direct conv: dw[m][c][k] += sum over the images n
 * and grid positions j of dy[n][m][j] * planes[n][c][j + base[k]] (dy laid
 * on the grid "G1 rows of R2" with its junk columns zero; any stride: the
 * forward's indexing of the stride-phase planes, transposed), a chunk
 * of images at a time. A register tile of DC_MR output channels by DW_KR
 * taps of one input channel: per step 4 + 3 vector loads and 12 FMAs into
 * 12 vector partial sums, over the whole grid of every image of the chunk,
 * then summed across lanes into dw. Threads split (channel tile, c) pairs:
 * each dw element is summed on one thread, images in order.
 */
#define DW_KR 3
typedef struct {
    const ai_conv_params *p;
    const dconv *dc;
    const float *planes, *dyg;
    float *dw;
    int64_t ld, nb; /* dyg row stride, images in the chunk */
} dconv_dw_job;

AI_GEMM_CLONES static void dconv_dw_range(void *ctx, int64_t lo, int64_t hi)
{
    const dconv_dw_job *j = ctx;
    const dconv *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, nvec = (dc->L + 7) / 8;
    const int64_t PS = dc->ph.size, groups = (K + DW_KR - 1) / DW_KR;
    /* the partial sums of every tap group, kept across the images of the chunk
     * (an image's plane and dy rows stay in cache for all its tap groups) */
    dc_vec sums[(DW_PAD_MAX_TAPS + DW_KR - 1) / DW_KR][DC_MR][DW_KR];
    for (int64_t item = lo; item < hi; item++) {
        const int64_t mt = item / C, c = item % C;
        memset(sums, 0, sizeof(sums[0]) * (size_t)groups);
        for (int64_t n = 0; n < j->nb; n++) {
            const float *xc = j->planes + (n * C + c) * PS;
            const float *dm[DC_MR];
            for (int r = 0; r < DC_MR; r++) /* rows past M read row 0: computed, not stored */
                dm[r] = j->dyg + (n * M + (mt * DC_MR + r < M ? mt * DC_MR + r : 0)) * j->ld;
            for (int64_t grp = 0; grp < groups; grp++) {
                int64_t off[DW_KR];
                for (int q = 0; q < DW_KR; q++) { /* taps past K repeat the last: not stored */
                    const int64_t k = grp * DW_KR + q;
                    off[q] = dc->ph.base[k < K ? k : K - 1];
                }
                dc_vec acc[DC_MR][DW_KR];
                memcpy(acc, sums[grp], sizeof acc);
                for (int64_t v = 0; v < nvec; v++) {
                    dc_vec xv[DW_KR], dv[DC_MR];
                    for (int q = 0; q < DW_KR; q++)
                        xv[q] = *(const dc_vec *)(xc + off[q] + 8 * v);
                    for (int r = 0; r < DC_MR; r++)
                        dv[r] = *(const dc_vec *)(dm[r] + 8 * v);
                    for (int r = 0; r < DC_MR; r++)
                        for (int q = 0; q < DW_KR; q++)
                            acc[r][q] += dv[r] * xv[q];
                }
                memcpy(sums[grp], acc, sizeof acc);
            }
        }
        for (int64_t grp = 0; grp < groups; grp++)
            for (int r = 0; r < DC_MR && mt * DC_MR + r < M; r++)
                for (int q = 0; q < DW_KR && grp * DW_KR + q < K; q++) {
                    float lanes[8];
                    memcpy(lanes, &sums[grp][r][q], sizeof lanes);
                    j->dw[((mt * DC_MR + r) * C + c) * K + grp * DW_KR + q] +=
                        ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                        ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
                }
    }
}

#ifdef AI_AVX512_KERNEL
/* dconv_dw_range with 16-lane vectors (AVX-512): dy's rows in pairs, 8
 * positions of one row then the same 8 of the other (dconv_dw_f32 lays dyg
 * so when this kernel runs), times x's 8 positions broadcast to both
 * halves. Each half is the 8-lane kernel's accumulator of its row and tap,
 * summed over the same images and positions in the same order (the same
 * values bit for bit), in half the FMAs; a pass takes up to DWW_TAPS taps
 * (2 x 9 accumulators, 2 + 9 loads per step). */
#define DWW_TAPS 9
static inline __attribute__((always_inline)) void dww_steps(ai_vec16_f32 acc[2][DWW_TAPS],
                                                            const float *d0, const float *d1,
                                                            const float *xc,
                                                            const int64_t *off, int64_t nv,
                                                            const int nt)
{
    for (int64_t v = 0; v < nv; v++) {
        const ai_vec16_f32 a = *(const ai_vec16_f32 *)(d0 + 16 * v);
        const ai_vec16_f32 b = *(const ai_vec16_f32 *)(d1 + 16 * v);
        for (int q = 0; q < nt; q++) {
            const dc_vec h = *(const dc_vec *)(xc + off[q] + 8 * v);
            const ai_vec16_f32 xv = __builtin_shufflevector(h, h, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1,
                                                            2, 3, 4, 5, 6, 7);
            acc[0][q] += a * xv;
            acc[1][q] += b * xv;
        }
    }
}

AI_AVX512_KERNEL static void dconv_dw_range_v16(void *ctx, int64_t lo, int64_t hi)
{
    const dconv_dw_job *j = ctx;
    const dconv *dc = j->dc;
    const int64_t C = j->p->C, M = j->p->M, K = dc->ph.K, nv = (dc->L + 7) / 8;
    const int64_t PS = dc->ph.size, MP = (M + 1) / 2, ld = 2 * j->ld; /* a pair's row */
    const int64_t groups = (K + DWW_TAPS - 1) / DWW_TAPS, per = (K + groups - 1) / groups;
    /* the partial sums of every tap group, kept across the images of the chunk */
    ai_vec16_f32 sums[(DW_PAD_MAX_TAPS + DWW_TAPS - 1) / DWW_TAPS][2][DWW_TAPS];
    for (int64_t item = lo; item < hi; item++) {
        const int64_t mt = item / C, c = item % C;
        /* the tile's 2 pairs of rows; a pair past M reads pair 0: computed, not stored */
        const int64_t p0 = 2 * mt, p1 = 2 * mt + 1 < MP ? 2 * mt + 1 : 0;
        memset(sums, 0, sizeof(sums[0]) * (size_t)groups);
        for (int64_t n = 0; n < j->nb; n++) {
            const float *xc = j->planes + (n * C + c) * PS;
            const float *d0 = j->dyg + (n * MP + p0) * ld, *d1 = j->dyg + (n * MP + p1) * ld;
            for (int64_t grp = 0; grp < groups; grp++) {
                const int64_t k0 = grp * per;
                const int nt = (int)(K - k0 < per ? K - k0 : per);
                int64_t off[DWW_TAPS];
                for (int q = 0; q < nt; q++)
                    off[q] = dc->ph.base[k0 + q];
                switch (nt) { /* (constant tap counts: the tap loop unrolled) */
                case 9: dww_steps(sums[grp], d0, d1, xc, off, nv, 9); break;
                case 8: dww_steps(sums[grp], d0, d1, xc, off, nv, 8); break;
                case 7: dww_steps(sums[grp], d0, d1, xc, off, nv, 7); break;
                case 6: dww_steps(sums[grp], d0, d1, xc, off, nv, 6); break;
                case 5: dww_steps(sums[grp], d0, d1, xc, off, nv, 5); break;
                case 4: dww_steps(sums[grp], d0, d1, xc, off, nv, 4); break;
                case 3: dww_steps(sums[grp], d0, d1, xc, off, nv, 3); break;
                case 2: dww_steps(sums[grp], d0, d1, xc, off, nv, 2); break;
                default: dww_steps(sums[grp], d0, d1, xc, off, nv, 1); break;
                }
            }
        }
        for (int64_t grp = 0; grp < groups; grp++) {
            const int64_t k0 = grp * per, nt = K - k0 < per ? K - k0 : per;
            for (int r = 0; r < DC_MR && mt * DC_MR + r < M; r++)
                for (int64_t q = 0; q < nt; q++) {
                    float lanes[16];
                    memcpy(lanes, &sums[grp][r / 2][q], sizeof lanes);
                    const float *l = lanes + 8 * (r % 2);
                    j->dw[((mt * DC_MR + r) * C + c) * K + k0 + q] +=
                        ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
                }
        }
    }
}
#endif

/* dy's planes (rows [lo, hi) of the chunk: image i, channel m) on the grid
 * "G1 rows of R2" in dyg, rows ld apart; with `pairs` (dconv_dw_range_v16)
 * rows m and m + 1 (m even) share a row of 2 ld, in turns of 8 positions */
typedef struct {
    const dconv *dc;
    float *dyg;
    const float *dy; /* the chunk's first image */
    int64_t M, M2, ld;
    bool pairs;
} dyg_job;

static void dyg_fill_range(void *ctx, int64_t lo, int64_t hi)
{
    const dyg_job *j = ctx;
    const int64_t R2 = j->dc->ph.R2, G1 = j->dc->ph.G1, G2 = j->dc->ph.G2;
    for (int64_t row = lo; row < hi; row++) {
        const int64_t i = row / j->M, m = row % j->M;
        const float *src = j->dy + row * G1 * G2;
        if (!j->pairs) {
            for (int64_t o1 = 0; o1 < G1; o1++)
                memcpy(j->dyg + (i * j->M + m) * j->ld + o1 * R2, src + o1 * G2,
                       sizeof(float) * (size_t)G2);
            continue;
        }
        float *d = j->dyg + (i * j->M2 + m - m % 2) * j->ld + 8 * (m % 2);
        /* grid position e lands at e / 8 * 16 + e % 8 = e + (e & ~7); whole
         * turns of 8 (at 2 e) in one move, the rest value by value (a
         * memcpy call per run cost more than the copy: KWS's rows are 5) */
        for (int64_t o1 = 0; o1 < G1; o1++) {
            const float *s = src + o1 * G2;
            int64_t o2 = 0, e = o1 * R2;
            for (; o2 < G2 && (e & 7); o2++, e++)
                d[e + (e & ~INT64_C(7))] = s[o2];
            for (; o2 + 8 <= G2; o2 += 8, e += 8)
                memcpy(d + 2 * e, s + o2, 8 * sizeof(float));
            for (; o2 < G2; o2++, e++)
                d[e + (e & ~INT64_C(7))] = s[o2];
        }
    }
}

/* dw += the weight gradient of Conv p by the direct kernel. Taken where the
 * input gradient is not wanted or went through dconv_dx (else the GEMM paths
 * compute both in one pass): a model's first conv, strided ones included (MobileNet's
 * 3 -> 8, stride 2, 96x96: 2.2 -> 1.2 ms per training step, torch 1.2-1.5). */
static bool dconv_dw_f32(const ai_conv_params *p, float *dw, const float *dy, const float *x,
                         float *ws)
{
    conv_geom g = conv_geom_of(p, false);
    dconv dc;
    conv_shift sh;
    if (!dconv_of(p, &g, AI_F32, &dc) || dc.L * dconv_dw_images(p, &dc) < DW_MIN_GRID ||
        (dc.L < DW_MIN_GRID && conv_shift_of(p, &g, &sh)))
        return false;
    const int64_t C = p->C, M = p->M, G1 = dc.ph.G1, G2 = dc.ph.G2;
    const int64_t ld = dc.L + DC_NR, nb = dconv_dw_images(p, &dc), M2 = (M + 1) / 2 * 2;
    float *planes = ws, *dyg = ws + nb * C * dc.ph.size;
    void (*range)(void *, int64_t, int64_t) = dconv_dw_range;
    bool pairs = false; /* dyg's rows in pairs, 8 positions of each in turn */
#ifdef AI_AVX512_KERNEL
    if (ai_cpu_avx512())
        range = dconv_dw_range_v16, pairs = true;
#endif
    memset(dyg, 0, sizeof(float) * (size_t)(nb * M2 * ld)); /* junk columns and tails */
    for (int64_t n0 = 0; n0 < p->N; n0 += nb) {
        const int64_t cnt = p->N - n0 < nb ? p->N - n0 : nb;
        for (int64_t i = 0; i < cnt; i++) {
            dconv_job pj = {p, &g, &dc, x + (n0 + i) * C * g.img_size, NULL, NULL,
                            planes + i * C * dc.ph.size, NULL, false, n0 > 0};
            ai_parallel_for(C, ai_grain_of(dc.ph.size), dconv_pad_range, &pj);
        }
        dyg_job dj = {&dc, dyg, dy + n0 * M * G1 * G2, M, M2, ld, pairs};
        ai_parallel_for(cnt * M, ai_grain_of(dc.L), dyg_fill_range, &dj);
        dconv_dw_job j = {p, &dc, planes, dyg, dw, ld, cnt};
        ai_parallel_for(dc.MT * C, ai_grain_of(DC_MR * dc.ph.K * dc.L * cnt), range, &j);
    }
    return true;
}

/* ------------------------------------------------ blocked channels (conv.h) */

/*
 * The blocked depthwise sums ("dwb"): dwl_range's jobs (a unit of 8
 * channels of one image, its padded (Hp, Wp, 8) copy xt, the taps' weights
 * wt (K, 8)) with the outputs written straight into the unit's block of y.
 * A row of outputs goes 8 positions at a time (then 4, then 1): per tap one
 * weight vector and 8 FMAs, each reading its input vector at a fixed
 * displacement (stride 1 and 2 compiled as constants), 8 independent
 * accumulators; the epilogue before the store. Rows shorter than 8 or not
 * a multiple of 4 go in flat tiles of 8 positions across rows instead
 * (dwb_flat: a 1-wide tail is a chain of dependent FMAs; MobileNet's
 * 128-channel 6x6 depthwise convs in-model -13 to -17%). The taps are summed in
 * order from the bias with FMAs (dwl, for NCHW outputs, rounds each
 * product: the other depthwise kernels' values).
 */
#if defined(__GNUC__)
#define DWB_TILE(NP, S2)                                                              \
    for (; o2 + (NP) <= G2; o2 += (NP)) {                                             \
        dc_vec acc[NP];                                                               \
        for (int i = 0; i < (NP); i++)                                                \
            acc[i] = bv;                                                              \
        const float *xs = xr + (o2 * (S2) - x0) * 8;                                  \
        for (int64_t k = 0; k < K; k++) {                                             \
            const dc_vec wk = *(const dc_vec *)(wt + wo[k]);                          \
            const float *xk = xs + off[k];                                            \
            for (int i = 0; i < (NP); i++)                                            \
                acc[i] += wk * *(const dc_vec *)(xk + i * (S2) * 8);                  \
        }                                                                             \
        for (int i = 0; i < (NP); i++) {                                              \
            dc_vec t = acc[i];                                                        \
            DC_EPILOGUE(t, ab, av, cv, relu);                                         \
            *(dc_vec *)(yr + (o2 + i) * 8) = t;                                       \
        }                                                                             \
    }

/* A row's outputs [o2, G2): 8 at a time (stride 1 and 2 as constants),
 * then 4, then 1. */
#define DWB_ROW()                                                                     \
    if (s2 == 1)                                                                      \
        DWB_TILE(8, 1)                                                                \
    else if (s2 == 2)                                                                 \
        DWB_TILE(8, 2)                                                                \
    else                                                                              \
        DWB_TILE(8, s2)                                                               \
    DWB_TILE(4, s2)                                                                   \
    DWB_TILE(1, s2)

/* The outputs [0, OS) in flat tiles of DWB_NP positions (rows of G2, the
 * last tile repeating the last position), for rows too short for the row
 * tiles, whose 1-wide tails are chains of dependent FMAs: each position
 * its input pointer (rs: an output row's step, cs: a column's), the same
 * sums in the same order. */
#define DWB_NP 8
/* A flat tile's taps: acc[i] += w_k x_k(i), k in order, position i's input
 * at src[i] (vectors V of VL lanes; 9 taps unrolled) */
#define DWB_TAPS_K(V, VL, KK)                                                         \
    _Pragma("GCC unroll 9") for (int64_t k = 0; k < (KK); k++) {                      \
        const V wk = *(const V *)(wt + k * (VL));                                     \
        for (int i = 0; i < DWB_NP; i++)                                              \
            acc[i] += wk * *(const V *)(src[i] + off[k]);                             \
    }
#define DWB_FLAT_TAPS(V, VL)      \
    if (K == 9)                   \
        DWB_TAPS_K(V, VL, 9)      \
    else                          \
        DWB_TAPS_K(V, VL, K)
static inline void dwb_flat(float *yu, const float *xt, const float *wt, const int64_t *off,
                            int64_t K, int64_t OS, int64_t G2, int64_t rs, int64_t cs,
                            const dc_vec *bvp, const dc_vec *avp, const dc_vec *cvp, bool ab,
                            bool relu)
{
    const dc_vec bv = *bvp, av = *avp, cv = *cvp; /* (pointers: no vector arguments) */
    for (int64_t o = 0, o1 = 0, o2 = 0; o < OS; o += DWB_NP) {
        const float *src[DWB_NP];
        dc_vec acc[DWB_NP];
        for (int i = 0; i < DWB_NP; i++) {
            src[i] = xt + o1 * rs + o2 * cs;
            acc[i] = bv;
            if (o + i + 1 < OS && ++o2 == G2)
                o1++, o2 = 0;
        }
        DWB_FLAT_TAPS(dc_vec, 8)
        for (int i = 0; i < DWB_NP && o + i < OS; i++) {
            dc_vec t = acc[i];
            DC_EPILOGUE(t, ab, av, cv, relu);
            *(dc_vec *)(yu + (o + i) * 8) = t;
        }
    }
}

AI_GEMM_CLONES static void dwb_sums(const void *job, float *yu, const float *xt,
                                    const float *wt, int64_t c)
{
    const dwl_job_f32 *j = job;
    const conv_geom *g = j->g;
    const dwl_geom *q = j->q;
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
    dc_vec bv, av, cv;
    lane_vec_f32(&bv, j->b, c, M);
    lane_vec_f32(&av, abf, c, M);
    lane_vec_f32(&cv, abf ? abf + M : NULL, c, M);
    if (G2 < 8 || G2 % 4) { /* short rows: flat tiles */
        dwb_flat(yu, xt, wt, off, K, g->grid_size, G2, rs, s2 * 8, &bv, &av, &cv, ab, relu);
        return;
    }
    const int64_t x0 = 0; /* xt's padding is inside it */
    for (int64_t o1 = 0; o1 < G1; o1++) {
        const float *xr = xt + o1 * rs;
        float *yr = yu + o1 * G2 * 8;
        int64_t o2 = 0;
        DWB_ROW()
    }
}

/* Taps [lo, hi) of a kernel dim whose input index o s - p + k d falls
 * in [0, n). */
static void dwb_taps(int64_t o, int64_t s, int64_t p, int64_t d, int64_t kn, int64_t n,
                     int64_t *lo, int64_t *hi)
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
 * DWB_DIRECT_MIN outputs or more, whose padded copy (of an input 4 times
 * the output at stride 2) costs as much as the sums. Three-conv chains,
 * batch 16, same process A/B against the copy: stride 2, 16 channels 48x48
 * -12 to -16%, 32 channels -11%; stride 1 (8 and 32 channels, 48x48 and
 * 24x24) came out between -7% and +10% over repeated runs, so stride 1
 * keeps the copy. */
#define DWB_DIRECT_MIN 64
AI_GEMM_CLONES static void dwb_direct(const void *job, float *yu, const float *xu,
                                      const float *wt, int64_t c)
{
    const dwl_job_f32 *j = job;
    const conv_geom *g = j->g;
    const int64_t G1 = g->grid[1], G2 = g->grid[2];
    const int64_t H = g->img[1], W = g->img[2], s1 = g->s[1], s2 = g->s[2];
    const int64_t k1n = g->k[1], k2n = g->k[2], d1 = g->d[1], d2 = g->d[2];
    const int64_t p1 = g->p[1], p2 = g->p[2], x0 = p2;
    const float *abf = j->ep ? j->ep->ab : NULL;
    const bool ab = abf != NULL, relu = j->ep && j->ep->relu;
    const int64_t M = j->p->M;
    dc_vec bv, av, cv;
    lane_vec_f32(&bv, j->b, c, M);
    lane_vec_f32(&av, abf, c, M);
    lane_vec_f32(&cv, abf ? abf + M : NULL, c, M);
    /* outputs [c_lo, c_hi) of a row read only inside columns */
    int64_t c_lo = (p2 + s2 - 1) / s2, c_hi = (W - (k2n - 1) * d2 + p2 + s2 - 1) / s2;
    c_lo = c_lo > G2 ? G2 : c_lo;
    c_hi = c_hi > G2 ? G2 : c_hi < c_lo ? c_lo : c_hi;
    for (int64_t o1 = 0; o1 < G1; o1++) {
        int64_t k1a, k1b, K = 0, off[DW_PAD_MAX_TAPS], wo[DW_PAD_MAX_TAPS];
        dwb_taps(o1, s1, p1, d1, k1n, H, &k1a, &k1b);
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
            DWB_ROW()
        }
        /* the border columns: [0, c_lo) and [c_hi, G2) */
        for (int64_t b = c_lo > 0 ? 0 : c_hi; b < G2; b = b + 1 == c_lo ? c_hi : b + 1) {
            int64_t k2a, k2b;
            dwb_taps(b, s2, p2, d2, k2n, W, &k2a, &k2b);
            const int64_t col = b * s2 - p2;
            dc_vec acc = bv;
            for (int64_t k1 = k1a; k1 < k1b; k1++)
                for (int64_t k2 = k2a; k2 < k2b; k2++)
                    acc += *(const dc_vec *)(wt + (k1 * k2n + k2) * 8) *
                           *(const dc_vec *)(xr + ((k1 - k1a) * d1 * W + col + k2 * d2) * 8);
            DC_EPILOGUE(acc, ab, av, cv, relu);
            *(dc_vec *)(yr + b * 8) = acc;
        }
    }
}
#undef DWB_ROW
#undef DWB_TILE

#ifdef AI_AVX512_KERNEL
/* dwb_range_v16's weights, packed once per call after the slots: per pair
 * of units, its taps (K, 16) then its bias, scale and shift (16 lanes
 * each), zeros past the channels */
static void dwb_pack_v16(const dwl_job_f32 *j)
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
 * dwb with 16-lane vectors (AVX-512), where x is blocked and the units
 * pair up (strided convs too: dwb_direct runs at 8 lanes only): a job is two
 * units of one image (blocks u and u + 1, 16 channels), copied into one
 * padded xt (Hp, Wp, 16) with their lanes side by side; each output
 * position is then one vector product per tap, its result stored as two
 * 8-lane halves, one into each block. Flat tiles of DWB_NP positions
 * (dwb_flat's), each lane's taps in order from the bias with FMAs and the
 * epilogue rounded as dwb_sums does: its values bit for bit, in half the
 * vector instructions. The jobs of slots as dwl_range's, pairs of units
 * in place of units, but a thread's range of slots runs as one (their
 * images, or their run of jobs, are consecutive), in the first slot's
 * buffer, its pads zeroed once; the weights are packed once per call
 * (dwb_pack_v16). Per slot, 128 channels on 6x6 planes, batch 16, had
 * taken 0.071 ms at 1 thread, 0.030 as one range; with a pair's weights
 * packed once per part of the pool's pass, MobileNet's depthwise convs on
 * 6x6 and 3x3 were slower at 2 threads than at 1.
 */
AI_AVX512_KERNEL AI_SHORT_LOOPS static void dwb_range_v16(void *ctx, int64_t lo, int64_t hi)
{
    const dwl_job_f32 *j = ctx;
    const conv_geom *g = j->g;
    const dwl_geom *q = j->q;
    enum { L = 16, B = DWL_UNIT };
    const int64_t N = j->p->N, K = q->K, IS = g->img_size;
    const int64_t OS = g->grid_size, G2 = g->grid[2], H = g->img[1], W = g->img[2];
    const int64_t p1 = g->p[1], p2 = g->p[2], Wp = q->Wp;
    const int64_t rs = g->s[1] * Wp * L, cs = g->s[2] * L; /* an output row's, column's step */
    /* x's columns [i2lo, i2hi) and rows [i1lo, i1hi) land inside xt */
    const int64_t i2lo = p2 > 0 ? 0 : -p2, i2hi = Wp - p2 < W ? Wp - p2 : W;
    const int64_t i1lo = p1 > 0 ? 0 : -p1, i1hi = q->Hp - p1 < H ? q->Hp - p1 : H;
    const int64_t units = q->units, pairs = units / 2, jobs = pairs * N;
    const bool inside = p1 >= 0 && p2 >= 0 && H + p1 <= q->Hp && W + p2 <= Wp;
    const bool by_image = N >= q->slots || N >= ai_parallel_parts(); /* as dwl_range */
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
            const float *wt = j->ws + q->slots * q->slot + pr * (K + 3) * L; /* dwb_pack_v16's */
            const dcw_vec bv = *(const dcw_vec *)(wt + K * L);
            const dcw_vec av = *(const dcw_vec *)(wt + (K + 1) * L);
            const dcw_vec cv = *(const dcw_vec *)(wt + (K + 2) * L);
            const float *xu = j->x + (n * units + 2 * pr) * IS * B; /* block u; u + 1 follows */
            for (int64_t i1 = i1lo; i1 < i1hi; i1++)
                for (int64_t i2 = i2lo; i2 < i2hi; i2++) {
                    float *d = xt + ((i1 + p1) * Wp + i2 + p2) * L;
                    const float *a = xu + (i1 * W + i2) * B;
                    *(dc_vec *)d = *(const dc_vec *)a;
                    *(dc_vec *)(d + B) = *(const dc_vec *)(a + IS * B);
                }
            float *y0 = j->y + (n * units + 2 * pr) * OS * B, *y1 = y0 + OS * B;
            for (int64_t o = 0, o1 = 0, o2 = 0; o < OS; o += DWB_NP) {
                const float *src[DWB_NP];
                dcw_vec acc[DWB_NP];
                for (int i = 0; i < DWB_NP; i++) { /* positions past OS repeat the last */
                    src[i] = xt + o1 * rs + o2 * cs;
                    acc[i] = bv;
                    if (o + i + 1 < OS && ++o2 == G2)
                        o1++, o2 = 0;
                }
                DWB_FLAT_TAPS(dcw_vec, L)
                for (int i = 0; i < DWB_NP && o + i < OS; i++) {
                    dcw_vec t = acc[i];
                    DC_EPILOGUE_NC(t, ab, av, cv, relu, DCW_NO_CONTRACT);
                    *(dc_vec *)(y0 + (o + i) * B) = __builtin_shufflevector(t, t, 0, 1, 2, 3, 4, 5, 6, 7);
                    *(dc_vec *)(y1 + (o + i) * B) =
                        __builtin_shufflevector(t, t, 8, 9, 10, 11, 12, 13, 14, 15);
                }
            }
        }
    }
}
#endif
#undef DWB_FLAT_TAPS
#undef DWB_TAPS_K
#endif

typedef struct {
    char *blocked;
    const char *plain; /* (N, C, S) */
    int64_t C, CB, S;  /* channels, blocks, positions */
    size_t es;         /* element size */
    bool to_blocked;   /* plain -> blocked, else blocked -> plain */
    bool add;          /* add into the destination, else write */
} reorder_job;

/* Blocks [lo, hi) of the batch (n CB + cb): 8 channel planes of S
 * positions <-> S runs of 8 lanes (float32: 8 x 8 transposes). */
AI_VECTOR_CLONES static void reorder_range(void *ctx, int64_t lo, int64_t hi)
{
    enum { B = AI_CONV_BLOCK };
    const reorder_job *j = ctx;
    const size_t es = j->es;
    for (int64_t nb = lo; nb < hi; nb++) {
        const int64_t n = nb / j->CB, c0 = nb % j->CB * B;
        const int64_t nc = j->C - c0 < B ? j->C - c0 : B;
        char *blk = j->blocked + (size_t)(nb * j->S * B) * es;
        char *plane = (char *)j->plain + (size_t)((n * j->C + c0) * j->S) * es;
        if (j->to_blocked && !j->add && nc < B)
            memset(blk, 0, (size_t)(j->S * B) * es);
        int64_t s0 = 0;
#ifdef AI_HAVE_TRANSPOSE8
        for (; es == sizeof(float) && nc == B && !j->add && s0 + 8 <= j->S; s0 += 8) {
            float *b = (float *)blk + s0 * B, *q = (float *)plane + s0;
            if (j->to_blocked)
                transpose8_f32(b, B, q, j->S);
            else
                transpose8_f32(q, j->S, b, B);
        }
#endif
        for (int64_t l = 0; l < nc && s0 < j->S; l++) {
            char *pl = plane + (size_t)(l * j->S) * es;
            if (es == sizeof(float)) {
                float *b = (float *)blk + l, *q = (float *)pl;
                for (int64_t s = s0; s < j->S; s++)
                    if (j->to_blocked)
                        b[s * B] = j->add ? b[s * B] + q[s] : q[s];
                    else
                        q[s] = j->add ? q[s] + b[s * B] : b[s * B];
            } else {
                double *b = (double *)blk + l, *q = (double *)pl;
                for (int64_t s = s0; s < j->S; s++)
                    if (j->to_blocked)
                        b[s * B] = j->add ? b[s * B] + q[s] : q[s];
                    else
                        q[s] = j->add ? q[s] + b[s * B] : b[s * B];
            }
        }
    }
}

void ai_channels_reorder(void *blocked, void *plain, int64_t N, int64_t C, int64_t S,
                         size_t elem_size, bool to_blocked, bool add)
{
    reorder_job j = {blocked, plain, C, (C + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK, S, elem_size,
                     to_blocked, add};
    ai_parallel_for(N * j.CB, ai_grain_of(S * AI_CONV_BLOCK), reorder_range, &j);
}

bool ai_conv_blocked_fast(int64_t C, int64_t M, int64_t group, int64_t ksize)
{
    return (group == 1 && C * ksize <= DCL_MAX_TAPS) ||
           (group == C && M == C && ksize <= DW_PAD_MAX_TAPS);
}

/* The fast kernels' geometry for p (dcl or dwl); false: the fallback */
static bool blocked_fast_of(const ai_conv_params *p, bool xb, const conv_geom *g, dcl_geom *q,
                            dwl_geom *l, bool *dcl)
{
    if (p->nsp != 2)
        return false;
    *dcl = dcl_of(p, g, AI_F32, q, true, xb);
    return *dcl || (conv_depthwise(p) && dwl_of(p, g, l, true));
}

/* The fallback's workspace: x and y as NCHW, then the NCHW conv's */
static int64_t blocked_fallback_elems(const ai_conv_params *p, const conv_geom *g)
{
    return p->N * (p->C * g->img_size + p->M * g->grid_size) +
           (int64_t)(ai_conv_workspace_bytes(p, AI_F32) / sizeof(float));
}

size_t ai_conv_blocked_workspace_bytes(const ai_conv_params *p, bool x_blocked)
{
    conv_geom g = conv_geom_of(p, false);
    dcl_geom q;
    dwl_geom l;
    bool dcl;
    if (!blocked_fast_of(p, x_blocked, &g, &q, &l, &dcl))
        return (size_t)blocked_fallback_elems(p, &g) * sizeof(float);
    return (size_t)(dcl ? dcl_elems(&q) : dwl_elems(&l)) * sizeof(float);
}

typedef struct {
    float *y;
    const float *r;
    bool relu;
} residual_job;

/* y[lo, hi) += r, then the Relu (NaN passes) */
AI_VECTOR_CLONES static void residual_range(void *ctx, int64_t lo, int64_t hi)
{
    const residual_job *j = ctx;
    float *y = j->y;
    const float *r = j->r;
    for (int64_t i = lo; i < hi; i++) {
        const float t = y[i] + r[i];
        y[i] = j->relu && !(t > 0 || t != t) ? 0 : t;
    }
}

void ai_conv_forward_blocked_f32(const ai_conv_params *p, float *y, const float *x,
                                 const float *w, const float *b, float *ws,
                                 const ai_conv_epilogue *ep, bool x_blocked, const float *r)
{
    conv_geom g = conv_geom_of(p, false);
    dcl_geom q;
    dwl_geom l;
    bool dcl;
    const bool fast = blocked_fast_of(p, x_blocked, &g, &q, &l, &dcl);
    if (fast && dcl) {
        dcl_run(p, y, x, w, b, ws, ep, true, x_blocked, r); /* the residual in registers */
        return;
    }
    if (r) { /* the other paths: the conv and affine, then y = relu(y + r) in a pass */
        const ai_conv_epilogue e = {ep ? ep->ab : NULL, false};
        ai_conv_forward_blocked_f32(p, y, x, w, b, ws, &e, x_blocked, NULL);
        residual_job j = {y, r, ep && ep->relu};
        const int64_t blocks = (p->M + AI_CONV_BLOCK - 1) / AI_CONV_BLOCK;
        ai_parallel_for(p->N * blocks * AI_CONV_BLOCK * g.grid_size, AI_GRAIN_ELEMS,
                        residual_range, &j);
        return;
    }
    if (!fast) {
        /* the NCHW conv between reorders (planes too large for the slots,
         * too many taps, groups) */
        float *xs = ws, *ys = xs + p->N * p->C * g.img_size, *rest = ys + p->N * p->M * g.grid_size;
        if (x_blocked)
            ai_channels_reorder((float *)x, xs, p->N, p->C, g.img_size, sizeof(float), false,
                                false);
        ai_conv_forward_f32(p, ys, x_blocked ? xs : x, w, b, rest, ep);
        ai_channels_reorder(y, ys, p->N, p->M, g.grid_size, sizeof(float), true, false);
        return;
    }
#if defined(__GNUC__)
    const bool direct = x_blocked && g.grid_size >= DWB_DIRECT_MIN && g.s[1] * g.s[2] > 1;
    dwl_job_f32 j = {p, &g, &l, y, ws, x, w, b, ep, x_blocked, true, dwb_sums,
                     direct ? dwb_direct : NULL};
#else
    dwl_job_f32 j = {p, &g, &l, y, ws, x, w, b, ep, x_blocked, true, NULL, NULL};
#endif
    const int64_t per_slot = l.jobs / l.slots * DWL_UNIT * (g.img_size + g.grid_size * g.ksize);
#if defined(AI_AVX512_KERNEL)
    /* 16 lanes where the units pair up, strided convs included: on
     * MobileNet's first stride-2 depthwise conv (16 channels, 48x48, in a
     * pointwise-depthwise-pointwise chain, per-node profile against ONNX
     * Runtime in the same run) the copy and 16-lane sums took 0.92-0.98 of
     * dwb_direct's time */
    if (x_blocked && l.units % 2 == 0 && ai_cpu_avx512()) {
        dwb_pack_v16(&j);
        ai_parallel_for(l.slots, ai_grain_of(per_slot), dwb_range_v16, &j);
        return;
    }
#endif
    dwl_pack_f32(&j);
    ai_parallel_for(l.slots, ai_grain_of(per_slot), dwl_range_f32, &j);
}

/* ----------------------------------------------- depthwise, narrow NCHW planes */

/*
 * The forward and input gradient of depthwise convs with one output
 * channel per input channel, stride 1, on narrow planes (width under 16)
 * whose output rows are as wide as the input's ("same" columns: KWS's 3x3
 * on 25x5), straight on the NCHW planes ("dwn"): a vector holds 16
 * consecutive flat positions of a plane (a chunk), and tap k of position f
 * reads f + off[k]. A 16-bit mask per (chunk, tap) clears the lanes whose
 * tap lies outside the plane: their loads read 0 and never fault (AVX-512).
 * The channels-last kernels (dwl) these shapes took before spent about
 * half their time transposing each unit of channels in and out (perf, 64
 * channels of 25x5, batch 16). Each value is summed in the order of the
 * kernels that take these convs where the CPU has no AVX-512 (the
 * forward's: every depthwise kernel's; the input gradient's: dwl's, so it
 * runs only where dwl_backward would), which compute the same values.
 */
#ifdef AI_AVX512_KERNEL
#include <immintrin.h>
#define DWN_MAX_CHUNKS 64 /* chunks per plane at most */
#define DWN_CB 8          /* chunks summed at once: independent sums cover the add's latency */
typedef struct {
    int64_t IS, OS, K, ic, oc; /* x and y plane sizes, taps, their chunks */
    int64_t off[DW_PAD_MAX_TAPS];
    /* y chunk j, tap k: lanes whose tap lies inside x (ym[j K + k]); x chunk
     * j, tap k: lanes of x that tap k of a y position inside reads (xm) */
    uint16_t ym[DWN_MAX_CHUNKS * DW_PAD_MAX_TAPS], xm[DWN_MAX_CHUNKS * DW_PAD_MAX_TAPS];
} dwn_geom;

static bool dwn_of(const ai_conv_params *p, const conv_geom *g, dwn_geom *q)
{
    if (!conv_depthwise(p) || p->M != p->C || p->N == 0 || g->img[0] != 1 || g->s[1] != 1 ||
        g->s[2] != 1 || g->grid[2] != g->img[2] || g->img[2] >= 16 ||
        g->ksize > DW_PAD_MAX_TAPS || g->img_size == 0 || g->grid_size == 0)
        return false;
    const int64_t H = g->img[1], W = g->img[2], G1 = g->grid[1], K = g->ksize;
    q->IS = H * W, q->OS = G1 * W, q->K = K;
    q->ic = (q->IS + 15) / 16, q->oc = (q->OS + 15) / 16;
    if (q->ic > DWN_MAX_CHUNKS || q->oc > DWN_MAX_CHUNKS)
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
    const dwn_geom *q;
    float *y, *dx;
    const float *x, *dy, *w, *b;
    const ai_conv_epilogue *ep;
    bool assign;
} dwn_job;

/* (no contraction into FMAs: each product rounded, as dwl's) */
#define DWN_ATTR __attribute__((target("arch=x86-64-v4")))
#define DWN_INLINE static inline __attribute__((always_inline)) DWN_ATTR

/* Calls BLOCK(j0, nj) over chunks [0, n) in blocks of DWN_CB, then of 4, 2
 * and 1: nj is a constant in each call (the block's sums stay in registers) */
#define DWN_BLOCKS(n, BLOCK)                        \
    do {                                            \
        int64_t b0_ = 0;                            \
        for (; b0_ + DWN_CB <= (n); b0_ += DWN_CB)  \
            BLOCK(b0_, DWN_CB);                     \
        for (; b0_ + 4 <= (n); b0_ += 4)            \
            BLOCK(b0_, 4);                          \
        for (; b0_ + 2 <= (n); b0_ += 2)            \
            BLOCK(b0_, 2);                          \
        for (; b0_ < (n); b0_++)                    \
            BLOCK(b0_, 1);                          \
    } while (0)

/* the first n (1 to 16) floats of v into dst, or added to dst's */
DWN_INLINE void dwn_store(float *dst, __m512 v, int64_t n, bool add)
{
    const __mmask16 m = (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1);
    if (add)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, dst));
    _mm512_mask_storeu_ps(dst, m, v);
}

/* chunks [j0, j0 + nj) of y plane yp: the bias, then taps in order, w[k] *
 * 0 where the tap lies outside (as dwl_sums adds its pads) */
DWN_INLINE void dwn_fwd_chunks(const dwn_geom *q, float *yp, const float *xp, const float *wc,
                               float bias, int64_t j0, const int nj)
{
    const int64_t K = q->K;
    __m512 acc[DWN_CB];
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
        dwn_store(yp + (j0 + jj) * 16, acc[jj], q->OS - (j0 + jj) * 16, false);
}

/* chunks [j0, j0 + nj) of dx plane dxp: 0, then w[k] * dy[i - off[k]] for
 * the taps k whose output lies inside, k from the last to the first (the
 * order in which dwl_backward's scatter reaches i; the other taps are
 * skipped, as there); written or added to dx */
DWN_INLINE void dwn_dx_chunks(const dwn_geom *q, float *dxp, const float *gp, const float *wc,
                              bool add, int64_t j0, const int nj)
{
    const int64_t K = q->K;
    __m512 acc[DWN_CB];
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
        dwn_store(dxp + (j0 + jj) * 16, acc[jj], q->IS - (j0 + jj) * 16, add);
}

/* Planes [lo, hi) of y (then the epilogue on each), or of dx (with dx) */
static DWN_ATTR void dwn_range(void *ctx, int64_t lo, int64_t hi)
{
    const dwn_job *j = ctx;
    const dwn_geom *q = j->q;
    const int64_t C = j->p->C, K = q->K;
    for (int64_t i = lo; i < hi; i++) {
        const int64_t c = i % C;
        const float *wc = j->w + c * K;
        if (j->dx) {
            const float *gp = j->dy + i * q->OS;
            float *dxp = j->dx + i * q->IS;
#define DWN_DX(j0, nj) dwn_dx_chunks(q, dxp, gp, wc, !j->assign, j0, nj)
            DWN_BLOCKS(q->ic, DWN_DX);
#undef DWN_DX
            continue;
        }
        const float *xp = j->x + i * q->IS, bias = j->b ? j->b[c] : 0;
        float *yp = j->y + i * q->OS;
#define DWN_FWD(j0, nj) dwn_fwd_chunks(q, yp, xp, wc, bias, j0, nj)
        DWN_BLOCKS(q->oc, DWN_FWD);
#undef DWN_FWD
        if (j->ep)
            ep_plane_f32(yp, q->OS, j->ep, c, C);
    }
}
#endif

static bool dwn_forward_f32(const ai_conv_params *p, float *y, const float *x, const float *w,
                            const float *b, const ai_conv_epilogue *ep)
{
#ifdef AI_AVX512_KERNEL
    conv_geom g = conv_geom_of(p, false);
    dwn_geom q;
    if (!ai_cpu_avx512() || !dwn_of(p, &g, &q))
        return false;
    dwn_job j = {.p = p, .q = &q, .y = y, .x = x, .w = w, .b = b, .ep = ep};
    ai_parallel_for(p->N * p->C, ai_grain_of(q.OS * q.K), dwn_range, &j);
    return true;
#else
    (void)p, (void)y, (void)x, (void)w, (void)b, (void)ep;
    return false;
#endif
}

/* The input gradient alone, where dwl_backward would compute it (the same
 * values where the CPU has no AVX-512); the weight gradient is left to
 * dwl_backward, whose sums dwn would otherwise have to reproduce. Planes
 * of DWN_DX_MIN positions or more: on smaller ones dwl's one pass for both
 * gradients costs less than two. */
#define DWN_DX_MIN 64
static bool dwn_dx_f32(const ai_conv_params *p, float *dx, const float *dy, const float *w,
                       bool assign)
{
#ifdef AI_AVX512_KERNEL
    conv_geom g = conv_geom_of(p, false);
    dwn_geom q;
    dwl_geom l;
    int64_t slots, slot;
    if (!ai_cpu_avx512() || g.img_size < DWN_DX_MIN || !dwl_backward_of(p, &g, &l, &slots, &slot) ||
        !dwn_of(p, &g, &q))
        return false;
    dwn_job j = {.p = p, .q = &q, .dx = dx, .dy = dy, .w = w, .assign = assign};
    ai_parallel_for(p->N * p->C, ai_grain_of(q.IS * q.K), dwn_range, &j);
    return true;
#else
    (void)p, (void)dx, (void)dy, (void)w, (void)assign;
    return false;
#endif
}
