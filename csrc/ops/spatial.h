/*
 * spatial.h — attribute parsing shared by the operators with spatial
 * windows (convolutions and pools): int lists, auto_pad; a Conv node's
 * parameters.
 */
#ifndef AI_OPS_SPATIAL_H
#define AI_OPS_SPATIAL_H

#include "../graph.h"
#include "../kernels/conv.h"

enum { AI_PAD_NOTSET, AI_PAD_SAME_UPPER, AI_PAD_SAME_LOWER, AI_PAD_VALID };

/* An ints attribute: n = -1 when absent. */
typedef struct {
    int64_t n, v[6];
} ai_int_list;

/* Reads ints attribute `name` into *l: at most `max` values, each >= lo. */
ai_status ai_read_int_list(const ai_node *n, const char *name, int max, int64_t lo,
                           ai_int_list *l);
/* Reads auto_pad (NOTSET by default) as one of AI_PAD_*. */
ai_status ai_read_auto_pad(const ai_node *n, int *mode);
/* Copies list l (nsp values; `dflt` for each when absent) into out. */
ai_status ai_spatial_list(const ai_node *n, const char *name, const ai_int_list *l, int nsp,
                          int64_t dflt, int64_t *out);

/* Conv's attributes (auto_pad, group, kernel_shape, strides, dilations,
 * pads) into node->params: the init of Conv and ConvTranspose, and of the
 * integer convolutions of ops/qlinear.c. */
ai_status ai_conv_init(ai_node *n);
/* The parameters of a node whose attributes ai_conv_init read, on input x,
 * weight w and bias b (or NULL) of any dtype, validated; errors name the
 * node and the attribute. */
ai_status ai_conv_geometry(const ai_node *n, const ai_tensor *x, const ai_tensor *w,
                           const ai_tensor *b, ai_conv_params *p);

/* A Conv node's kernel parameters from c's inputs (ops/conv.c), validated;
 * errors name the node. FusedConv (ops/fused.c) calls it on its blocked
 * inputs read as NCHW. */
ai_status ai_conv_params_of(const ai_ctx *c, ai_conv_params *p);

#endif
