/*
 * detection.c — the operators of object detection heads:
 * NonMaxSuppression (which boxes to keep) and RoiAlign (a fixed-size
 * feature map pooled from each region of interest).
 *
 * NonMaxSuppression's output length depends on the boxes' and scores'
 * values (AI_OP_SHAPE_FROM_DATA: they are known when the graph is planned,
 * docs/engine.md); it has no gradient. RoiAlign samples X bilinearly as
 * ONNX's reference and ONNX Runtime do (which torchvision's roi_align
 * matches in avg mode); its backward goes to X (none to the boxes, as in
 * torchvision).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "movement.h"

/* ---------------------------------------------------------------- NonMaxSuppression */

/* NonMaxSuppression(boxes [B, N, 4], scores [B, C, N],
 * max_output_boxes_per_class?, iou_threshold?, score_threshold?;
 * center_point_box) -> selected_indices int64 [K, 3] of (batch, class,
 * box). Per batch and class: the boxes whose score passes score_threshold
 * (when given: score > threshold), by descending score (ties: the lower
 * index first), each kept unless its IoU with a box kept before is above
 * iou_threshold, at most max_output_boxes_per_class (absent: none). Boxes
 * are [y1, x1, y2, x2] (any two opposite corners), or [x_center, y_center,
 * width, height] with center_point_box = 1. */
typedef struct {
    int64_t max_out;
    double iou, score;
    bool has_score, center;
} nms_args;

static ai_status nms_setup(const ai_ctx *c, nms_args *a)
{
    const ai_tensor *boxes = c->in[0], *scores = c->in[1];
    int64_t center;
    ai_status st = ai_attr_int(c->node, "center_point_box", 0, &center);
    if (st)
        return st;
    if (center != 0 && center != 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "center_point_box is %lld; 0 or 1 "
                             "expected", (long long)center);
    a->center = center == 1;
    if (!ai_dtype_is_float(boxes->dtype) || !ai_dtype_is_float(scores->dtype))
        return ai_node_error(c->node, AI_ERR_TYPE, "boxes and scores must be float, not %s "
                             "and %s", ai_dtype_name(boxes->dtype),
                             ai_dtype_name(scores->dtype));
    if (boxes->ndim != 3 || boxes->shape[2] != 4 || scores->ndim != 3 ||
        scores->shape[0] != boxes->shape[0] || scores->shape[2] != boxes->shape[1])
        return ai_node_error(c->node, AI_ERR_VALUE, "boxes must be [batches, boxes, 4] and "
                             "scores [batches, classes, boxes]");
    static const char *names[] = {"boxes", "scores", "max_output_boxes_per_class",
                                  "iou_threshold", "score_threshold"};
    for (int i = 0; i < c->n_in; i++) {
        const ai_tensor *t = c->in[i];
        if (!t)
            continue;
        if (i >= 2 && ai_tensor_numel(t) > 1)
            return ai_node_error(c->node, AI_ERR_VALUE, "%s has %lld elements; one expected",
                                 names[i], (long long)ai_tensor_numel(t));
        if (!t->data && ai_tensor_numel(t))
            return ai_node_error(c->node, AI_ERR_NOT_IMPLEMENTED,
                                 "the output's shape depends on the values of %s, which are "
                                 "not known when the graph is planned", names[i]);
    }
    const ai_tensor *m = c->n_in > 2 ? c->in[2] : NULL;
    const ai_tensor *iou = c->n_in > 3 ? c->in[3] : NULL;
    const ai_tensor *sc = c->n_in > 4 ? c->in[4] : NULL;
    a->max_out = m && ai_tensor_numel(m) ? ai_tensor_get_flat_i64(m, 0) : 0;
    a->max_out = a->max_out > 0 ? a->max_out : 0;
    a->iou = iou && ai_tensor_numel(iou) ? ai_tensor_get_flat(iou, 0) : 0;
    a->has_score = sc && ai_tensor_numel(sc);
    a->score = a->has_score ? ai_tensor_get_flat(sc, 0) : 0;
    if (a->iou < 0 || a->iou > 1)
        return ai_node_error(c->node, AI_ERR_VALUE, "iou_threshold is %g; 0 to 1 expected",
                             a->iou);
    return AI_OK;
}

/* box as [x_min, y_min, x_max, y_max] */
static void nms_box(const ai_tensor *boxes, int64_t at, bool center, double r[4])
{
    double v[4];
    for (int k = 0; k < 4; k++)
        v[k] = ai_tensor_get_flat(boxes, at + k);
    if (center) {
        r[0] = v[0] - v[2] / 2, r[2] = v[0] + v[2] / 2;
        r[1] = v[1] - v[3] / 2, r[3] = v[1] + v[3] / 2;
    } else {
        r[0] = fmin(v[1], v[3]), r[2] = fmax(v[1], v[3]);
        r[1] = fmin(v[0], v[2]), r[3] = fmax(v[0], v[2]);
    }
}

/* Whether IoU(a, b) > threshold (empty boxes never suppress). */
static bool nms_suppresses(const double *a, const double *b, double threshold)
{
    const double w = fmin(a[2], b[2]) - fmax(a[0], b[0]);
    const double h = fmin(a[3], b[3]) - fmax(a[1], b[1]);
    if (w <= 0 || h <= 0)
        return false;
    const double inter = w * h, area_a = (a[2] - a[0]) * (a[3] - a[1]);
    const double area_b = (b[2] - b[0]) * (b[3] - b[1]), uni = area_a + area_b - inter;
    if (area_a <= 0 || area_b <= 0 || uni <= 0)
        return false;
    return inter / uni > threshold;
}

/* scores of the class being sorted, for the comparison */
typedef struct {
    int64_t box;
    double score;
} nms_cand;

static int nms_cand_cmp(const void *pa, const void *pb)
{
    const nms_cand *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return a->box < b->box ? -1 : a->box > b->box;
}

/* The selected triples: their number in *k; written to y (K x 3) when
 * given, at most `cap` of them. */
static ai_status nms_run(const ai_ctx *c, const nms_args *a, int64_t *k, int64_t *y,
                         int64_t cap)
{
    const ai_tensor *boxes = c->in[0], *scores = c->in[1];
    const int64_t B = boxes->shape[0], N = boxes->shape[1], C = scores->shape[1];
    nms_cand *cand = malloc(sizeof(nms_cand) * (size_t)(N + 1));
    double(*kept)[4] = malloc(sizeof(double[4]) * (size_t)(N + 1));
    if (!cand || !kept) {
        free(cand);
        free(kept);
        return ai_node_error(c->node, AI_ERR_NOMEM, "out of memory for %lld boxes",
                             (long long)N);
    }
    *k = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t cl = 0; cl < C; cl++) {
            int64_t n = 0, nk = 0;
            for (int64_t i = 0; i < N; i++) {
                const double s = ai_tensor_get_flat(scores, (b * C + cl) * N + i);
                if (!a->has_score || s > a->score)
                    cand[n++] = (nms_cand){i, s};
            }
            qsort(cand, (size_t)n, sizeof *cand, nms_cand_cmp);
            for (int64_t i = 0; i < n && nk < a->max_out; i++) {
                double box[4];
                nms_box(boxes, (b * N + cand[i].box) * 4, a->center, box);
                bool keep = true;
                for (int64_t j = 0; keep && j < nk; j++)
                    keep = !nms_suppresses(box, kept[j], a->iou);
                if (!keep)
                    continue;
                memcpy(kept[nk++], box, sizeof box);
                if (y && *k < cap) {
                    y[*k * 3] = b;
                    y[*k * 3 + 1] = cl;
                    y[*k * 3 + 2] = cand[i].box;
                }
                ++*k;
            }
        }
    free(cand);
    free(kept);
    return AI_OK;
}

static ai_status nms_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    nms_args a = {0};
    int64_t s[2] = {0, 3};
    ai_status st = nms_setup(c, &a);
    if (st || (st = nms_run(c, &a, &s[0], NULL, 0)))
        return st;
    return ai_set_meta(&out[0], AI_I64, 2, s);
}

static ai_status nms_forward(ai_ctx *c)
{
    nms_args a = {0};
    int64_t k = 0;
    const int64_t planned = c->out[0]->shape[0];
    ai_status st = nms_setup(c, &a);
    if (st || (st = nms_run(c, &a, &k, c->out[0]->data, planned)))
        return st;
    if (k != planned)
        return ai_node_error(c->node, AI_ERR_VALUE, "%lld boxes selected at forward, %lld "
                             "when the graph was planned", (long long)k, (long long)planned);
    return AI_OK;
}

/* ---------------------------------------------------------------- RoiAlign */

/* RoiAlign(X [N, C, H, W], rois [R, 4] of (x1, y1, x2, y2), batch_indices
 * [R]) -> Y [R, C, output_height, output_width]. Each output cell averages
 * (mode avg) or takes the largest (mode max: of the four weighted corner
 * terms, as ONNX Runtime) of sampling_ratio^2 bilinear samples (0: ceil of
 * the bin size) of X at spatial_scale * the roi, shifted by half a pixel in
 * coordinate_transformation_mode half_pixel (opset 16 on; output_half_pixel
 * is opset 10's: no shift, rois at least 1 x 1). */
typedef struct {
    int64_t oh, ow, sampling;
    double scale;
    bool max, half_pixel;
} roi_args;

static ai_status roi_setup(const ai_ctx *c, roi_args *a)
{
    const ai_tensor *x = c->in[0], *rois = c->in[1], *bi = c->in[2];
    const char *mode, *ctm;
    ai_status st;
    if ((st = ai_attr_int(c->node, "output_height", 1, &a->oh)) ||
        (st = ai_attr_int(c->node, "output_width", 1, &a->ow)) ||
        (st = ai_attr_int(c->node, "sampling_ratio", 0, &a->sampling)) ||
        (st = ai_attr_float(c->node, "spatial_scale", 1.0, &a->scale)) ||
        (st = ai_attr_string(c->node, "mode", "avg", &mode)) ||
        (st = ai_attr_string(c->node, "coordinate_transformation_mode",
                             c->node->opset >= 16 ? "half_pixel" : "output_half_pixel", &ctm)))
        return st;
    if (strcmp(mode, "avg") && strcmp(mode, "max"))
        return ai_node_error(c->node, AI_ERR_VALUE, "mode is '%s'; avg or max expected", mode);
    if (strcmp(ctm, "half_pixel") && strcmp(ctm, "output_half_pixel"))
        return ai_node_error(c->node, AI_ERR_VALUE, "coordinate_transformation_mode is '%s'; "
                             "half_pixel or output_half_pixel expected", ctm);
    a->max = mode[0] == 'm';
    a->half_pixel = ctm[0] == 'h';
    if (a->oh < 1 || a->ow < 1 || a->sampling < 0)
        return ai_node_error(c->node, AI_ERR_VALUE, "output_height %lld and output_width %lld "
                             "must be positive, sampling_ratio %lld not negative",
                             (long long)a->oh, (long long)a->ow, (long long)a->sampling);
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(c->node, AI_ERR_TYPE, "X is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    if (x->ndim != 4 || rois->ndim != 2 || rois->shape[1] != 4 || bi->ndim != 1 ||
        bi->shape[0] != rois->shape[0])
        return ai_node_error(c->node, AI_ERR_VALUE, "X must be [N, C, H, W], rois [R, 4] and "
                             "batch_indices [R]");
    if ((x->shape[2] < 1 || x->shape[3] < 1) && rois->shape[0] && x->shape[1])
        return ai_node_error(c->node, AI_ERR_VALUE, "X is %lld x %lld: no pixel to sample",
                             (long long)x->shape[2], (long long)x->shape[3]);
    if (!ai_dtype_is_float(rois->dtype) || (bi->dtype != AI_I64 && bi->dtype != AI_I32))
        return ai_node_error(c->node, AI_ERR_TYPE, "rois must be float and batch_indices "
                             "integers, not %s and %s", ai_dtype_name(rois->dtype),
                             ai_dtype_name(bi->dtype));
    return AI_OK;
}

static ai_status roi_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)ws;
    (void)state;
    roi_args a = {0};
    ai_status st = roi_setup(c, &a);
    const int64_t s[4] = {c->in[1]->shape[0], c->in[0]->shape[1], a.oh, a.ow};
    return st ? st : ai_set_meta(&out[0], c->in[0]->dtype, 4, s);
}

/* Forward (dx NULL): Y = the pooled values; backward: dX += dY spread back
 * with the same weights (avg: all samples / count; max: the winning term). */
static ai_status roi_run(ai_ctx *c, ai_tensor *dx)
{
    const ai_tensor *x = c->in[0], *rois = c->in[1], *bi = c->in[2];
    roi_args a = {0};
    ai_status st = roi_setup(c, &a);
    if (st)
        return st;
    const int64_t R = rois->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    const double off = a.half_pixel ? 0.5 : 0;
    for (int64_t r = 0; r < R; r++) {
        const int64_t n = ai_tensor_get_flat_i64(bi, r);
        if (n < 0 || n >= x->shape[0])
            return ai_node_error(c->node, AI_ERR_INDEX, "batch_indices[%lld] is %lld; 0 to "
                                 "%lld expected", (long long)r, (long long)n,
                                 (long long)x->shape[0] - 1);
        const double x0 = ai_tensor_get_flat(rois, r * 4) * a.scale - off;
        const double y0 = ai_tensor_get_flat(rois, r * 4 + 1) * a.scale - off;
        double rw = ai_tensor_get_flat(rois, r * 4 + 2) * a.scale - off - x0;
        double rh = ai_tensor_get_flat(rois, r * 4 + 3) * a.scale - off - y0;
        if (!a.half_pixel) {
            rw = fmax(rw, 1.0);
            rh = fmax(rh, 1.0);
        }
        const double bh = rh / (double)a.oh, bw = rw / (double)a.ow;
        const int64_t gh = a.sampling ? a.sampling : (int64_t)ceil(bh);
        const int64_t gw = a.sampling ? a.sampling : (int64_t)ceil(bw);
        const double count = (double)(gh * gw > 1 ? gh * gw : 1);
        for (int64_t ch = 0; ch < C; ch++) {
            const int64_t xbase = (n * C + ch) * H * W;
            for (int64_t ph = 0; ph < a.oh; ph++)
                for (int64_t pw = 0; pw < a.ow; pw++) {
                    const int64_t yi = ((r * C + ch) * a.oh + ph) * a.ow + pw;
                    const double g = dx ? ai_float_at(c->dout[0], yi) : 0;
                    double acc = 0;
                    int64_t best_pos = -1;
                    double best_w = 0;
                    bool first = true;
                    for (int64_t iy = 0; iy < gh; iy++)
                        for (int64_t ix = 0; ix < gw; ix++) {
                            double yy = y0 + (double)ph * bh + ((double)iy + 0.5) * bh / gh;
                            double xx = x0 + (double)pw * bw + ((double)ix + 0.5) * bw / gw;
                            int64_t pos[4] = {0, 0, 0, 0};
                            double w[4] = {0, 0, 0, 0};
                            if (!(yy < -1.0 || yy > (double)H || xx < -1.0 || xx > (double)W)) {
                                yy = fmax(yy, 0);
                                xx = fmax(xx, 0);
                                int64_t ylo = (int64_t)yy, xlo = (int64_t)xx, yhi, xhi;
                                if (ylo >= H - 1)
                                    yhi = ylo = H - 1, yy = (double)ylo;
                                else
                                    yhi = ylo + 1;
                                if (xlo >= W - 1)
                                    xhi = xlo = W - 1, xx = (double)xlo;
                                else
                                    xhi = xlo + 1;
                                const double ly = yy - (double)ylo, lx = xx - (double)xlo;
                                const double hy = 1 - ly, hx = 1 - lx;
                                pos[0] = ylo * W + xlo, w[0] = hy * hx;
                                pos[1] = ylo * W + xhi, w[1] = hy * lx;
                                pos[2] = yhi * W + xlo, w[2] = ly * hx;
                                pos[3] = yhi * W + xhi, w[3] = ly * lx;
                            }
                            for (int k = 0; k < 4; k++) {
                                const double v = w[k] * ai_float_at(x, xbase + pos[k]);
                                if (!a.max) {
                                    acc += v;
                                    if (dx)
                                        ai_float_set(dx, xbase + pos[k],
                                                     ai_float_at(dx, xbase + pos[k]) +
                                                         g * w[k] / count);
                                } else if (first || v > acc) {
                                    acc = v;
                                    best_pos = xbase + pos[k];
                                    best_w = w[k];
                                    first = false;
                                }
                            }
                        }
                    if (dx && a.max && best_pos >= 0)
                        ai_float_set(dx, best_pos, ai_float_at(dx, best_pos) + g * best_w);
                    if (!dx)
                        ai_float_set(c->out[0], yi, a.max ? acc : acc / count);
                }
        }
    }
    return AI_OK;
}

static ai_status roi_forward(ai_ctx *c)
{
    return roi_run(c, NULL);
}

static ai_status roi_backward(ai_ctx *c)
{
    ai_status st = AI_OK;
    if (!c->din[0] || (st = ai_check_grad_dtype(c, c->din[0])))
        return st;
    return roi_run(c, c->din[0]);
}

/* ---------------------------------------------------------------- registry */

/* (AI_OP_HALF: it reads boxes and scores as doubles, also at plan time) */
OP(op_nms, "NonMaxSuppression", 2, 5, 1, AI_OP_HALF | AI_OP_SHAPE_FROM_DATA, nms_shape,
   nms_forward, NULL)
OP(op_roi_align, "RoiAlign", 3, 3, 1, AI_OP_BWD_NO_Y, roi_shape, roi_forward, roi_backward)

const ai_op_def *const ai_ops_detection[] = {&op_nms, &op_roi_align, NULL};
