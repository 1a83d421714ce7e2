/*
 * test_select.c — an output whose length depends on values computed in the
 * graph (AI_OP_SHAPE_FROM_DATA, plan.c): y = Compress(x, x > 0) on a graph
 * input x. The comparison runs when the graph is planned so that Compress
 * knows its length; a new x with another number of positives re-plans; the
 * nodes still run at forward, and the gradient reaches x (dY back at the
 * kept places, 0 elsewhere).
 */
#include "../graph.h"
#include "ctest.h"

#define N 5

static ai_graph *build(void)
{
    ai_graph *g;
    if (ai_graph_new(&g))
        return NULL;
    const int64_t none[1] = {0};
    ai_tensor *zero;
    ai_status st = ai_tensor_new(&zero, AI_F64, 0, none);
    if (!st)
        AI_F64P(zero)[0] = 0;
    const char *gt_in[2] = {"x", "zero"}, *gt_out[1] = {"c"};
    const char *cmp_in[2] = {"x", "c"}, *y[1] = {"y"};
    st = st ? st : ai_graph_add_input(g, "x", AI_F64);
    st = st ? st : ai_graph_add_initializer(g, "zero", AI_VAL_CONST, zero);
    st = st ? st : ai_graph_add_node(g, "gt", "", "Greater", 13, 2, gt_in, 1, gt_out, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "pick", "", "Compress", 11, 2, cmp_in, 1, y, 0, NULL);
    st = st ? st : ai_graph_set_outputs(g, 1, y);
    st = st ? st : ai_graph_finalize(g);
    if (st) {
        ai_graph_free(g);
        return NULL;
    }
    g->need_backward = g->input_grads = true;
    return g;
}

/* forward and backward for x; checks y = the positives and dx */
static void check_one(ai_graph *g, const double *xv)
{
    const int64_t n[1] = {N};
    ai_tensor *x, *y = NULL, *dx = NULL, *dy = NULL;
    CHECK_OK(ai_tensor_new(&x, AI_F64, 1, n));
    for (int i = 0; i < N; i++)
        AI_F64P(x)[i] = xv[i];
    CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&x, 1, &y));
    int64_t k = 0;
    for (int i = 0; i < N; i++)
        k += xv[i] > 0;
    CHECK(y && y->ndim == 1 && y->shape[0] == k);
    for (int64_t j = 0, i = 0; y && i < N; i++)
        if (xv[i] > 0)
            CHECK(AI_F64P(y)[j++] == xv[i]);
    CHECK_OK(ai_tensor_new(&dy, AI_F64, 1, &k));
    for (int64_t j = 0; j < k; j++)
        AI_F64P(dy)[j] = (double)(j + 1);
    CHECK_OK(ai_graph_backward(g, 1, (const ai_tensor *const *)&dy, 1, &dx));
    CHECK(dx != NULL);
    for (int64_t j = 0, i = 0; dx && i < N; i++)
        CHECK(AI_F64P(dx)[i] == (xv[i] > 0 ? (double)++j : 0.0));
    ai_tensor_free(dx);
    ai_tensor_free(dy);
    ai_tensor_free(y);
    ai_tensor_free(x);
}

TEST(select_length_from_computed_values)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build();
    CHECK(g != NULL);
    if (!g)
        return;
    const double a[N] = {1.5, -2, 0, 3, 4}, b[N] = {-1, 2, -3, -4, -5}, c[N] = {0, 0, 0, 0, 0};
    check_one(g, a);
    check_one(g, b); /* another length: re-planned */
    check_one(g, c); /* none kept */
    check_one(g, a);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

const ctest_case select_cases[] = {
    CASE(select_length_from_computed_values),
    {NULL, NULL},
};
