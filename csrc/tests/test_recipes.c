/*
 * test_recipes.c — graph rewrites of recipes.c on a graph built in C:
 * x -> Conv -> BatchNormalization -> Relu -> Flatten -> Gemm -> y.
 * Outputs before and after each recipe agree (BatchNorm folding: up to
 * float rounding; fusions and their undoing: exactly, same kernels), and
 * nothing leaks. fuse_pad on x -> Pad -> Conv; fuse_linear on
 * x -> Transpose(W) -> MatMul -> Add(b).
 */
#include <math.h>
#include <string.h>

#include "../graph.h"
#include "ctest.h"

static ai_tensor *filled(int ndim, const int64_t *shape, unsigned seed, double lo, double hi)
{
    ai_tensor *t;
    if (ai_tensor_new(&t, AI_F32, ndim, shape))
        return NULL;
    float *p = t->data;
    for (int64_t i = 0; i < ai_tensor_numel(t); i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)(lo + (hi - lo) * ((seed >> 8) & 0xffff) / 65535.0);
    }
    return t;
}

static ai_graph *build(void)
{
    ai_graph *g;
    if (ai_graph_new(&g))
        return NULL;
    const int64_t w[4] = {3, 2, 3, 3}, c[1] = {3}, fc[2] = {5, 48};
    int64_t pads[4] = {1, 1, 1, 1};
    ai_attr conv_attrs[1] = {{.name = "pads", .type = AI_ATTR_INTS, .n = 4, .ints = pads}};
    ai_attr gemm_attrs[1] = {{.name = "transB", .type = AI_ATTR_INT, .i = 1}};
    const char *conv_in[3] = {"x", "w", "b"}, *bn_in[5] = {"c", "s", "sh", "m", "v"};
    const char *c_out[1] = {"c"}, *bn_out[1] = {"n"}, *relu_in[1] = {"n"}, *relu_out[1] = {"r"};
    const char *flat_in[1] = {"r"}, *flat_out[1] = {"f"}, *gemm_in[2] = {"f", "fc"};
    const char *gemm_out[1] = {"y"};
    ai_status st = ai_graph_add_input(g, "x", AI_F32);
    st = st ? st : ai_graph_add_initializer(g, "w", AI_VAL_PARAM, filled(4, w, 1, -1, 1));
    st = st ? st : ai_graph_add_initializer(g, "b", AI_VAL_PARAM, filled(1, c, 2, -1, 1));
    st = st ? st : ai_graph_add_initializer(g, "s", AI_VAL_PARAM, filled(1, c, 3, 0.5, 1.5));
    st = st ? st : ai_graph_add_initializer(g, "sh", AI_VAL_PARAM, filled(1, c, 4, -0.5, 0.5));
    st = st ? st : ai_graph_add_initializer(g, "m", AI_VAL_BUFFER, filled(1, c, 5, -0.2, 0.2));
    st = st ? st : ai_graph_add_initializer(g, "v", AI_VAL_BUFFER, filled(1, c, 6, 0.5, 1.5));
    st = st ? st : ai_graph_add_initializer(g, "fc", AI_VAL_PARAM, filled(2, fc, 7, -1, 1));
    st = st ? st : ai_graph_add_node(g, "conv", "", "Conv", 17, 3, conv_in, 1, c_out, 1,
                                     conv_attrs);
    st = st ? st : ai_graph_add_node(g, "bn", "", "BatchNormalization", 17, 5, bn_in, 1,
                                     bn_out, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "relu", "", "Relu", 17, 1, relu_in, 1, relu_out, 0,
                                     NULL);
    st = st ? st : ai_graph_add_node(g, "flat", "", "Flatten", 17, 1, flat_in, 1, flat_out, 0,
                                     NULL);
    st = st ? st : ai_graph_add_node(g, "fc", "", "Gemm", 17, 2, gemm_in, 1, gemm_out, 1,
                                     gemm_attrs);
    st = st ? st : ai_graph_set_outputs(g, 1, gemm_out);
    st = st ? st : ai_graph_finalize(g);
    if (st) {
        ai_graph_free(g);
        return NULL;
    }
    return g;
}

static ai_tensor *run(ai_graph *g, const ai_tensor *x)
{
    ai_tensor *y = NULL;
    CHECK_OK(ai_graph_forward(g, 1, &x, 1, &y));
    return y;
}

static double max_diff(const ai_tensor *a, const ai_tensor *b)
{
    double d = 0;
    for (int64_t i = 0; i < ai_tensor_numel(a); i++)
        d = fmax(d, fabs(ai_tensor_get_flat(a, i) - ai_tensor_get_flat(b, i)));
    return d;
}

static int apply(ai_status (*recipe)(ai_graph *, ai_recipe_report *), ai_graph *g)
{
    ai_recipe_report r = {0};
    CHECK_OK(recipe(g, &r));
    int n = r.n_done;
    ai_recipe_report_free(&r);
    return n;
}

TEST(recipes_keep_outputs_and_undo)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build();
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t xs[4] = {2, 2, 4, 4};
    ai_tensor *x = filled(4, xs, 9, -2, 2);
    ai_tensor *y0 = run(g, x);

    ai_recipe_report r = {0};
    g->training = true; /* batch statistics cannot be folded */
    CHECK(ai_recipe_fuse_batchnorm(g, &r) == AI_ERR_VALUE);
    CHECK(strstr(ai_last_error(), "training mode") != NULL);
    ai_recipe_report_free(&r);
    g->training = false;

    CHECK(apply(ai_recipe_fuse_batchnorm, g) == 1);
    CHECK(g->n_nodes == 4 && ai_graph_find_value(g, "s") < 0 && ai_graph_find_value(g, "c") < 0);
    ai_tensor *y1 = run(g, x);
    CHECK(y0 && y1 && max_diff(y0, y1) < 1e-5);

    CHECK(apply(ai_recipe_remove_flatten, g) == 1);
    CHECK(apply(ai_recipe_fuse_activation, g) == 1);
    CHECK(g->n_nodes == 2 && !strcmp(g->nodes[0].op_type, "FusedConv") &&
          !strcmp(g->nodes[1].op_type, "FusedGemm"));
    ai_tensor *y2 = run(g, x);
    CHECK(y2 && max_diff(y1, y2) == 0);

    CHECK(apply(ai_recipe_expand_metaops, g) == 1); /* the Relu; the Flatten stays removed */
    CHECK(g->n_nodes == 3 && !strcmp(g->nodes[0].op_type, "Conv") &&
          !strcmp(g->nodes[1].op_type, "Relu") && !strcmp(g->nodes[2].op_type, "FusedGemm"));
    CHECK(apply(ai_recipe_expand_metaops, g) == 0);
    ai_tensor *y3 = run(g, x);
    CHECK(y3 && max_diff(y1, y3) == 0);
    ai_tensor_free(y3);
    CHECK(apply(ai_recipe_restore_flatten, g) == 1);
    static const char *const ops[4] = {"Conv", "Relu", "Flatten", "Gemm"};
    static const char *const names[4] = {"conv", "relu", "flat", "fc"};
    CHECK(g->n_nodes == 4);
    for (int i = 0; i < 4 && i < g->n_nodes; i++)
        CHECK(!strcmp(g->nodes[i].op_type, ops[i]) && !strcmp(g->nodes[i].name, names[i]));
    CHECK(ai_graph_find_value(g, "n") >= 0 && ai_graph_find_value(g, "f") >= 0);
    y3 = run(g, x);
    CHECK(y3 && max_diff(y1, y3) == 0);
    CHECK(apply(ai_recipe_constant_fold, g) == 0);

    ai_tensor_free(y0);
    ai_tensor_free(y1);
    ai_tensor_free(y2);
    ai_tensor_free(y3);
    ai_tensor_free(x);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

/* x (2, 2, 5, 4) -> Pad (mode, pads on H and W) -> Conv 3@3x2 (pads 1, 0, 0, 1) -> y */
static ai_graph *build_pad_conv(const char *mode)
{
    ai_graph *g;
    if (ai_graph_new(&g))
        return NULL;
    const int64_t w[4] = {3, 2, 3, 2}, c[1] = {3}, np[1] = {8};
    int64_t conv_pads[4] = {1, 0, 0, 1};
    ai_attr conv_attrs[1] = {{.name = "pads", .type = AI_ATTR_INTS, .n = 4, .ints = conv_pads}};
    ai_attr pad_attrs[1] = {{.name = "mode", .type = AI_ATTR_STRING, .s = (char *)mode}};
    const char *pad_in[2] = {"x", "pads"}, *pad_out[1] = {"p"};
    const char *conv_in[3] = {"p", "w", "b"}, *conv_out[1] = {"y"};
    ai_tensor *pads = NULL;
    ai_status st = ai_tensor_new(&pads, AI_I64, 1, np);
    if (!st) {
        const int64_t v[8] = {0, 0, 2, 1, 0, 0, 1, 3}; /* H: 2 before, 1 after; W: 1, 3 */
        memcpy(pads->data, v, sizeof v);
    }
    st = st ? st : ai_graph_add_input(g, "x", AI_F32);
    st = st ? st : ai_graph_add_initializer(g, "pads", AI_VAL_CONST, pads);
    st = st ? st : ai_graph_add_initializer(g, "w", AI_VAL_PARAM, filled(4, w, 11, -1, 1));
    st = st ? st : ai_graph_add_initializer(g, "b", AI_VAL_PARAM, filled(1, c, 12, -1, 1));
    st = st ? st : ai_graph_add_node(g, "pad", "", "Pad", 17, 2, pad_in, 1, pad_out, 1,
                                     pad_attrs);
    st = st ? st : ai_graph_add_node(g, "conv", "", "Conv", 17, 3, conv_in, 1, conv_out, 1,
                                     conv_attrs);
    st = st ? st : ai_graph_set_outputs(g, 1, conv_out);
    st = st ? st : ai_graph_finalize(g);
    if (st) {
        ai_graph_free(g);
        return NULL;
    }
    return g;
}

TEST(fuse_pad_moves_zero_padding_into_the_conv)
{
    int64_t live = ai_debug_live_tensors();
    const int64_t xs[4] = {2, 2, 5, 4};
    ai_tensor *x = filled(4, xs, 13, -2, 2);
    /* constant: the Conv takes the padding (pads 1+2, 0+1, 0+1, 1+3) */
    ai_graph *g = build_pad_conv("constant");
    CHECK(g != NULL && x != NULL);
    if (!g || !x)
        return;
    ai_tensor *y0 = run(g, x);
    CHECK(apply(ai_recipe_fuse_pad, g) == 1);
    CHECK(g->n_nodes == 1 && !strcmp(g->nodes[0].op_type, "Conv") &&
          ai_graph_find_value(g, "p") < 0);
    const ai_attr *a = g->n_nodes ? ai_node_attr(&g->nodes[0], "pads") : NULL;
    static const int64_t want[4] = {3, 1, 1, 4};
    CHECK(a && a->n == 4 && !memcmp(a->ints, want, sizeof want));
    ai_tensor *y1 = run(g, x);
    CHECK(y0 && y1 && y0->shape[2] == y1->shape[2] && y0->shape[3] == y1->shape[3] &&
          max_diff(y0, y1) < 1e-6);
    ai_tensor_free(y0);
    ai_tensor_free(y1);
    ai_graph_free(g);
    /* reflect: kept, with the reason */
    g = build_pad_conv("reflect");
    CHECK(g != NULL);
    if (g) {
        ai_recipe_report r = {0};
        CHECK_OK(ai_recipe_fuse_pad(g, &r));
        CHECK(r.n_done == 0 && r.n_skipped == 1 &&
              strstr(r.skipped[0].text, "mode is not 'constant'") != NULL);
        CHECK(g->n_nodes == 2);
        ai_recipe_report_free(&r);
        ai_graph_free(g);
    }
    ai_tensor_free(x);
    CHECK(ai_debug_live_tensors() == live);
}

/* x (2, 3, 6) -> MatMul(x, Transpose(W (5, 6))) -> Add(b (5,)) -> y (2, 3, 5) */
static ai_graph *build_linear(void)
{
    ai_graph *g;
    if (ai_graph_new(&g))
        return NULL;
    const int64_t w[2] = {5, 6}, b[1] = {5};
    const char *t_in[1] = {"w"}, *t_out[1] = {"wt"}, *mm_in[2] = {"x", "wt"}, *mm_out[1] = {"m"};
    const char *add_in[2] = {"m", "b"}, *add_out[1] = {"y"};
    ai_status st = ai_graph_add_input(g, "x", AI_F32);
    st = st ? st : ai_graph_add_initializer(g, "w", AI_VAL_PARAM, filled(2, w, 21, -1, 1));
    st = st ? st : ai_graph_add_initializer(g, "b", AI_VAL_PARAM, filled(1, b, 22, -1, 1));
    st = st ? st : ai_graph_add_node(g, "t", "", "Transpose", 17, 1, t_in, 1, t_out, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "mm", "", "MatMul", 17, 2, mm_in, 1, mm_out, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "add", "", "Add", 17, 2, add_in, 1, add_out, 0, NULL);
    st = st ? st : ai_graph_set_outputs(g, 1, add_out);
    st = st ? st : ai_graph_finalize(g);
    if (st) {
        ai_graph_free(g);
        return NULL;
    }
    return g;
}

TEST(fuse_linear_reads_the_weight_in_place)
{
    int64_t live = ai_debug_live_tensors();
    const int64_t xs[3] = {2, 3, 6};
    ai_tensor *x = filled(3, xs, 23, -2, 2);
    ai_graph *g = build_linear();
    CHECK(g != NULL && x != NULL);
    if (!g || !x)
        return;
    ai_tensor *y0 = run(g, x);
    CHECK(apply(ai_recipe_fuse_linear, g) == 1);
    CHECK(g->n_nodes == 1 && !strcmp(g->nodes[0].op_type, "FusedMatMul") &&
          ai_graph_find_value(g, "wt") < 0 && ai_graph_find_value(g, "m") < 0);
    ai_tensor *y1 = run(g, x);
    CHECK(y0 && y1 && y1->ndim == 3 && y1->shape[2] == 5 && max_diff(y0, y1) < 1e-5);
    ai_tensor_free(y0);
    ai_tensor_free(y1);
    ai_graph_free(g);
    ai_tensor_free(x);
    CHECK(ai_debug_live_tensors() == live);
}

const ctest_case recipe_cases[] = {
    CASE(recipes_keep_outputs_and_undo),
    CASE(fuse_pad_moves_zero_padding_into_the_conv),
    CASE(fuse_linear_reads_the_weight_in_place),
    {NULL, NULL},
};
