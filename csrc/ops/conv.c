/*
 * conv.c — Conv and ConvTranspose (ONNX opsets 11 to 21) over the kernels of
 * kernels/conv.h: 1 to 3 spatial dims, float32 and float64, optional bias.
 *
 * Attributes: kernel_shape (else the weight's spatial shape), strides,
 * dilations, pads (begin..., end...), auto_pad, group; ConvTranspose also
 * output_padding and output_shape (which, when given, sets the pads as the
 * ONNX spec says and overrides `pads`).
 *
 * Shape inference validates everything and asks the im2col scratch through
 * *workspace; forward and backward rebuild the same ai_conv_params from the
 * input shapes (cheap) and call the kernels. Backward accumulates into dX,
 * dW and dB, each only when asked for.
 */
#include <stdlib.h>
#include <string.h>

#include "../graph.h"
#include "spatial.h"
#include "../kernels/conv.h"


typedef struct {
    bool transposed;
    int auto_pad;
    int64_t group;
    ai_int_list kernel_shape, strides, dilations, pads, output_padding, output_shape;
} conv_attrs;

ai_status ai_conv_init(ai_node *n)
{
    conv_attrs *a = calloc(1, sizeof *a);
    if (!a)
        return ai_error(AI_ERR_NOMEM, "out of memory");
    n->params = a;
    a->transposed = strcmp(n->op_type, "ConvTranspose") == 0;
    ai_status st = ai_read_auto_pad(n, &a->auto_pad);
    if (st)
        return st;
    if ((st = ai_attr_int(n, "group", 1, &a->group)))
        return st;
    if (a->group < 1 || a->group > INT32_MAX)
        return ai_node_error(n, AI_ERR_VALUE, "group is %lld; must be >= 1",
                             (long long)a->group);
    if ((st = ai_read_int_list(n, "kernel_shape", 3, 1, &a->kernel_shape)) ||
        (st = ai_read_int_list(n, "strides", 3, 1, &a->strides)) ||
        (st = ai_read_int_list(n, "dilations", 3, 1, &a->dilations)) ||
        (st = ai_read_int_list(n, "pads", 6, 0, &a->pads)))
        return st;
    if (a->pads.n >= 0 && a->auto_pad != AI_PAD_NOTSET)
        return ai_node_error(n, AI_ERR_VALUE, "pads and auto_pad cannot both be given");
    a->output_padding.n = a->output_shape.n = -1;
    if (!a->transposed)
        return AI_OK;
    if ((st = ai_read_int_list(n, "output_padding", 3, 0, &a->output_padding)) ||
        (st = ai_read_int_list(n, "output_shape", 5, 1, &a->output_shape)))
        return st;
    return AI_OK;
}

/* Splits `total` padding of spatial dim d: SAME_UPPER puts the odd one at
 * the end, SAME_LOWER at the beginning. */
static void split_pad(ai_conv_params *p, int d, int64_t total, bool upper)
{
    p->pad_begin[d] = upper ? total / 2 : total - total / 2;
    p->pad_end[d] = total - p->pad_begin[d];
}

static ai_status check_float(const ai_node *n, const char *what, const ai_tensor *t,
                             ai_dtype want)
{
    if (t->dtype != want)
        return ai_node_error(n, AI_ERR_TYPE, "%s is %s; %s expected", what,
                             ai_dtype_name(t->dtype), ai_dtype_name(want));
    return AI_OK;
}

ai_status ai_conv_geometry(const ai_node *n, const ai_tensor *x, const ai_tensor *w,
                           const ai_tensor *b, ai_conv_params *p)
{
    const conv_attrs *a = n->params;
    ai_status st;
    memset(p, 0, sizeof *p);
    if (x->ndim < 3 || x->ndim > 5)
        return ai_node_error(n, AI_ERR_VALUE, "input has rank %d; (N, C, spatial...) with 1 "
                             "to 3 spatial dims expected", x->ndim);
    if (w->ndim != x->ndim)
        return ai_node_error(n, AI_ERR_VALUE, "weight has rank %d; the input's rank %d "
                             "expected", w->ndim, x->ndim);
    const int nsp = x->ndim - 2;
    p->nsp = nsp;
    p->N = x->shape[0];
    p->C = x->shape[1];
    p->group = a->group;
    if (p->C % p->group)
        return ai_node_error(n, AI_ERR_VALUE, "group %lld does not divide %lld input "
                             "channels", (long long)p->group, (long long)p->C);
    /* Conv weight (M, C/group, k...); ConvTranspose weight (C, M/group, k...) */
    int64_t w_in = a->transposed ? w->shape[0] : w->shape[1] * p->group;
    if (w_in != p->C)
        return ai_node_error(n, AI_ERR_VALUE, "input has %lld channels; the weight expects "
                             "%lld", (long long)p->C, (long long)w_in);
    p->M = a->transposed ? w->shape[1] * p->group : w->shape[0];
    if (!a->transposed && p->M % p->group)
        return ai_node_error(n, AI_ERR_VALUE, "group %lld does not divide the weight's %lld "
                             "output channels", (long long)p->group, (long long)p->M);
    if (b && (b->ndim != 1 || b->shape[0] != p->M))
        return ai_node_error(n, AI_ERR_VALUE, "bias must have shape (%lld,) for %lld output "
                             "channels", (long long)p->M, (long long)p->M);
    int64_t kernel_shape[3]; /* 0: not given */
    if ((st = ai_spatial_list(n, "kernel_shape", &a->kernel_shape, nsp, 0, kernel_shape)) ||
        (st = ai_spatial_list(n, "strides", &a->strides, nsp, 1, p->stride)) ||
        (st = ai_spatial_list(n, "dilations", &a->dilations, nsp, 1, p->dilation)) ||
        (st = ai_spatial_list(n, "output_padding", &a->output_padding, nsp, 0, p->output_padding)))
        return st;
    if (a->pads.n >= 0 && a->pads.n != 2 * nsp)
        return ai_node_error(n, AI_ERR_VALUE, "pads has %lld values; %d (begin..., end...) "
                             "expected", (long long)a->pads.n, 2 * nsp);
    for (int d = 0; d < nsp; d++) {
        p->in[d] = x->shape[2 + d];
        p->kernel[d] = w->shape[2 + d];
        if (kernel_shape[d] && kernel_shape[d] != p->kernel[d])
            return ai_node_error(n, AI_ERR_VALUE, "kernel_shape[%d] is %lld; the weight's "
                                 "kernel is %lld", d, (long long)kernel_shape[d],
                                 (long long)p->kernel[d]);
        p->pad_begin[d] = a->pads.n < 0 ? 0 : a->pads.v[d];
        p->pad_end[d] = a->pads.n < 0 ? 0 : a->pads.v[nsp + d];
        if (a->transposed && p->output_padding[d] >= p->stride[d] &&
            p->output_padding[d] >= p->dilation[d])
            return ai_node_error(n, AI_ERR_VALUE, "output_padding[%d] is %lld; must be "
                                 "smaller than the stride (%lld) or the dilation (%lld)", d,
                                 (long long)p->output_padding[d], (long long)p->stride[d],
                                 (long long)p->dilation[d]);
    }
    const int64_t *out_shape = NULL; /* ConvTranspose: the asked spatial output */
    int64_t same_shape[3];
    if (a->transposed && a->output_shape.n >= 0) {
        if (a->output_shape.n != nsp && a->output_shape.n != nsp + 2)
            return ai_node_error(n, AI_ERR_VALUE, "output_shape has %lld values for %d "
                                 "spatial dims", (long long)a->output_shape.n, nsp);
        out_shape = a->output_shape.v + (a->output_shape.n - nsp);
    } else if (a->transposed && (a->auto_pad == AI_PAD_SAME_UPPER || a->auto_pad == AI_PAD_SAME_LOWER)) {
        for (int d = 0; d < nsp; d++)
            same_shape[d] = p->in[d] * p->stride[d];
        out_shape = same_shape;
    }
    for (int d = 0; d < nsp; d++) {
        int64_t extent = (p->kernel[d] - 1) * p->dilation[d] + 1;
        if (out_shape) {
            /* ONNX ConvTranspose: SAME_UPPER pads more at the end, else at the start */
            int64_t total = p->stride[d] * (p->in[d] - 1) + p->output_padding[d] + extent -
                            out_shape[d];
            if (total < 0) {
                /* a larger output: ONNX splits the negative pads as the
                 * positive ones (rounding down), zeros (the bias) before
                 * and after the output; those after are output_padding */
                const int64_t e = -total, after = a->auto_pad == AI_PAD_SAME_UPPER ? e / 2
                                                                                   : (e + 1) / 2;
                p->output_padding[d] += after;
                if (after < e || (p->output_padding[d] >= p->stride[d] &&
                                  p->output_padding[d] >= p->dilation[d]))
                    return ai_node_error(n, AI_ERR_NOT_IMPLEMENTED, "output_shape[%d] is %lld, "
                                         "%lld more than this input, stride, output_padding "
                                         "and kernel give; up to %lld more, at the end, is "
                                         "supported (output_padding below the stride)", d,
                                         (long long)out_shape[d], (long long)e,
                                         (long long)(p->stride[d] > p->dilation[d]
                                                         ? p->stride[d] : p->dilation[d]) -
                                             1 - (p->output_padding[d] - after));
            } else {
                split_pad(p, d, total, a->auto_pad == AI_PAD_SAME_UPPER);
            }
        } else if (!a->transposed && (a->auto_pad == AI_PAD_SAME_UPPER || a->auto_pad == AI_PAD_SAME_LOWER)) {
            int64_t out = (p->in[d] + p->stride[d] - 1) / p->stride[d];
            int64_t total = (out - 1) * p->stride[d] + extent - p->in[d];
            split_pad(p, d, total > 0 ? total : 0, a->auto_pad == AI_PAD_SAME_UPPER);
        }
        if (!a->transposed && p->in[d] + p->pad_begin[d] + p->pad_end[d] < extent)
            return ai_node_error(n, AI_ERR_VALUE, "spatial dim %d: the kernel spans %lld "
                                 "(kernel_shape %lld, dilations %lld) but the padded input "
                                 "has %lld", d, (long long)extent, (long long)p->kernel[d],
                                 (long long)p->dilation[d],
                                 (long long)(p->in[d] + p->pad_begin[d] + p->pad_end[d]));
    }
    st = a->transposed ? ai_convtranspose_infer_out(p) : ai_conv_infer_out(p);
    return st ? ai_node_error(n, st, "%s", ai_last_error()) : AI_OK;
}

/* Fills *p from the node's attributes and the float inputs' shapes. */
static ai_status conv_setup(const ai_ctx *c, ai_conv_params *p)
{
    const ai_node *n = c->node;
    const ai_tensor *x = c->in[0], *w = c->in[1], *b = c->n_in > 2 ? c->in[2] : NULL;
    ai_status st;
    if (x->dtype != AI_F32 && x->dtype != AI_F64)
        return ai_node_error(n, AI_ERR_TYPE, "input is %s; float32 or float64 expected",
                             ai_dtype_name(x->dtype));
    if ((st = check_float(n, "the weight", w, x->dtype)) ||
        (b && (st = check_float(n, "the bias", b, x->dtype))))
        return st;
    return ai_conv_geometry(n, x, w, b, p);
}

ai_status ai_conv_params_of(const ai_ctx *c, ai_conv_params *p)
{
    return conv_setup(c, p);
}

static ai_status conv_shape(ai_ctx *c, ai_meta *out, size_t *ws, size_t *state)
{
    (void)state;
    const conv_attrs *a = c->node->params;
    ai_conv_params p;
    ai_status st = conv_setup(c, &p);
    if (st)
        return st;
    out[0].dtype = c->in[0]->dtype;
    out[0].ndim = p.nsp + 2;
    out[0].shape[0] = p.N;
    out[0].shape[1] = p.M;
    memcpy(out[0].shape + 2, p.out, sizeof(int64_t) * (size_t)p.nsp);
    *ws = a->transposed ? ai_convtranspose_workspace_bytes(&p, c->in[0]->dtype)
                        : ai_conv_workspace_bytes(&p, c->in[0]->dtype);
    return AI_OK;
}

/* The data of optional tensor t, or NULL. */
static void *data_of(const ai_tensor *t) { return t ? t->data : NULL; }

static ai_status conv_forward(ai_ctx *c)
{
    const conv_attrs *a = c->node->params;
    ai_conv_params p;
    ai_status st = conv_setup(c, &p);
    if (st)
        return st;
    void *y = c->out[0]->data, *ws = c->workspace;
    const void *x = c->in[0]->data, *w = c->in[1]->data;
    const void *b = data_of(c->n_in > 2 ? c->in[2] : NULL);
    if (c->in[0]->dtype == AI_F32) {
        if (a->transposed)
            ai_convtranspose_forward_f32(&p, y, x, w, b, ws);
        else
            ai_conv_forward_f32(&p, y, x, w, b, ws, c->epilogue);
    } else {
        if (a->transposed)
            ai_convtranspose_forward_f64(&p, y, x, w, b, ws);
        else
            ai_conv_forward_f64(&p, y, x, w, b, ws, c->epilogue);
    }
    return AI_OK;
}

static ai_status conv_backward(ai_ctx *c)
{
    const conv_attrs *a = c->node->params;
    ai_conv_params p;
    ai_status st = conv_setup(c, &p);
    if (st)
        return st;
    void *dx = data_of(c->din[0]), *dw = data_of(c->din[1]);
    void *db = data_of(c->n_in > 2 ? c->din[2] : NULL), *ws = c->workspace;
    const void *dy = c->dout[0]->data, *x = c->in[0]->data, *w = c->in[1]->data;
    const bool ax = c->din_assign[0]; /* only dx is ever assigned */
    if (c->in[0]->dtype == AI_F32) {
        if (a->transposed)
            ai_convtranspose_backward_f32(&p, dx, dw, db, dy, x, w, ws, ax);
        else
            ai_conv_backward_f32(&p, dx, dw, db, dy, x, w, ws, ax);
    } else {
        if (a->transposed)
            ai_convtranspose_backward_f64(&p, dx, dw, db, dy, x, w, ws, ax);
        else
            ai_conv_backward_f64(&p, dx, dw, db, dy, x, w, ws, ax);
    }
    return AI_OK;
}

/* dx (input 0) is written on its gradient's first write; dw, db accumulate;
 * backward reads x and w, not y */
static const ai_op_def op_conv = {"Conv", "", 2, 3, 1, 1,
                                  AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_Y, ai_conv_init,
                                  conv_shape, conv_forward, conv_backward};
static const ai_op_def op_conv_transpose = {"ConvTranspose", "", 2, 3, 1, 1,
                                            AI_OP_GRAD_ASSIGN(1) | AI_OP_BWD_NO_Y, ai_conv_init,
                                            conv_shape, conv_forward, conv_backward};

const ai_op_def *const ai_ops_conv[] = {&op_conv, &op_conv_transpose, NULL};
