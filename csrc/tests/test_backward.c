/*
 * test_backward.c — the engine's backward pass on a graph built in C, for the
 * "first writer assigns" mode (AI_OP_GRAD_ASSIGN): h = tanh(x) feeds
 * Mul(h, h) (one value in two slots: the second adds onto the first's write)
 * and Relu; y = h*h + relu(h). dx against the closed form, over two backward
 * passes in a row (no stale values), and nothing leaks.
 */
#include <math.h>
#include <string.h>

#include "../graph.h"
#include "ctest.h"

static ai_graph *build_of(ai_dtype dtype)
{
    ai_graph *g;
    if (ai_graph_new(&g))
        return NULL;
    const char *x[1] = {"x"}, *h[1] = {"h"}, *hh[2] = {"h", "h"}, *m[1] = {"m"};
    const char *r[1] = {"r"}, *mr[2] = {"m", "r"}, *y[1] = {"y"};
    ai_status st = ai_graph_add_input(g, "x", dtype);
    st = st ? st : ai_graph_add_node(g, "tanh", "", "Tanh", 17, 1, x, 1, h, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "square", "", "Mul", 17, 2, hh, 1, m, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "relu", "", "Relu", 17, 1, h, 1, r, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "add", "", "Add", 17, 2, mr, 1, y, 0, NULL);
    st = st ? st : ai_graph_set_outputs(g, 1, y);
    st = st ? st : ai_graph_finalize(g);
    if (st) {
        ai_graph_free(g);
        return NULL;
    }
    g->need_backward = g->input_grads = true;
    return g;
}

static ai_graph *build(void) { return build_of(AI_F64); }

/* dx against the closed form: dy (2 h + [h > 0]) (1 - h^2), h = tanh(x) */
static void check_dx(const ai_tensor *x, const ai_tensor *dy, const ai_tensor *dx)
{
    for (int64_t i = 0; i < ai_tensor_numel(x); i++) {
        double h = tanh(AI_F64P(x)[i]);
        double want = AI_F64P(dy)[i] * (2 * h + (h > 0)) * (1 - h * h);
        CHECK_CLOSE(AI_F64P(dx)[i], want, 1e-12);
    }
}

TEST(backward_first_writer_assigns)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build();
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t shape[2] = {3, 50};
    ai_tensor *x, *dy, *y = NULL;
    CHECK_OK(ai_tensor_new(&x, AI_F64, 2, shape));
    CHECK_OK(ai_tensor_new(&dy, AI_F64, 2, shape));
    const int64_t n = ai_tensor_numel(x);
    for (int64_t i = 0; i < n; i++)
        AI_F64P(x)[i] = -2.0 + 4.0 * (double)i / (double)(n - 1);
    CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&x, 1, &y));
    for (int pass = 1; pass <= 2; pass++) {
        for (int64_t i = 0; i < n; i++)
            AI_F64P(dy)[i] = pass * (1.0 + 0.01 * (double)i);
        ai_tensor *dx = NULL;
        CHECK_OK(ai_graph_backward(g, 1, (const ai_tensor *const *)&dy, 1, &dx));
        CHECK(dx != NULL);
        if (dx)
            check_dx(x, dy, dx);
        ai_tensor_free(dx);
    }
    ai_tensor_free(y);
    ai_tensor_free(dy);
    ai_tensor_free(x);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

/* The same graph in float16 (plan.c, "half precision"): each node computes
 * in float32 and rounds its output once, so y is the per-node rounding of
 * the closed form (within a float16 ulp: tanh's float32 kernel is within 4
 * float32 ulp); dx (gradients rounded per node, then added in float16)
 * within a few float16 ulps of the closed form on the rounded h. */
TEST(backward_float16_per_node_rounding)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build_of(AI_F16);
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t shape[2] = {3, 50};
    ai_tensor *x, *dy, *y = NULL, *dx = NULL;
    CHECK_OK(ai_tensor_new(&x, AI_F16, 2, shape));
    CHECK_OK(ai_tensor_new(&dy, AI_F16, 2, shape));
    const int64_t n = ai_tensor_numel(x);
    uint16_t *xv = x->data, *dyv = dy->data;
    for (int64_t i = 0; i < n; i++) {
        xv[i] = ai_f32_to_f16(-2.0f + 4.0f * (float)i / (float)(n - 1));
        dyv[i] = ai_f32_to_f16(1.0f + 0.01f * (float)i);
    }
    CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&x, 1, &y));
    CHECK_OK(ai_graph_backward(g, 1, (const ai_tensor *const *)&dy, 1, &dx));
    CHECK(y && dx && y->dtype == AI_F16 && dx->dtype == AI_F16);
    for (int64_t i = 0; y && dx && i < n; i++) {
        const float h = ai_f16_to_f32(ai_f32_to_f16(tanhf(ai_f16_to_f32(xv[i]))));
        const float m = ai_f16_to_f32(ai_f32_to_f16(h * h));
        const float want_y = ai_f16_to_f32(ai_f32_to_f16(m + (h > 0 ? h : 0)));
        CHECK_CLOSE(ai_f16_to_f32(((uint16_t *)y->data)[i]), want_y, 1e-3 * fabs(want_y));
        const double want = ai_f16_to_f32(dyv[i]) * (2.0 * h + (h > 0)) * (1.0 - (double)h * h);
        CHECK_CLOSE(ai_f16_to_f32(((uint16_t *)dx->data)[i]), want, 4e-3 * fabs(want) + 1e-4);
    }
    ai_tensor_free(dx);
    ai_tensor_free(y);
    ai_tensor_free(dy);
    ai_tensor_free(x);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

/* input_grads is part of the plan's key: a forward with it set, after one
 * without on the same shapes, re-plans, and backward gives dx (it used to
 * give NULL: the plan of the first forward had no gradient for x). */
TEST(backward_input_grads_replans)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build();
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t shape[2] = {2, 8};
    ai_tensor *x, *dy;
    CHECK_OK(ai_tensor_new(&x, AI_F64, 2, shape));
    CHECK_OK(ai_tensor_new(&dy, AI_F64, 2, shape));
    const int64_t n = ai_tensor_numel(x);
    for (int64_t i = 0; i < n; i++) {
        AI_F64P(x)[i] = -1.5 + 3.0 * (double)i / (double)(n - 1);
        AI_F64P(dy)[i] = 1.0 + 0.1 * (double)i;
    }
    for (int round = 0; round < 4; round++) {
        g->input_grads = round % 2 == 1;
        ai_tensor *y = NULL, *dx = NULL;
        CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&x, 1, &y));
        CHECK_OK(ai_graph_backward(g, 1, (const ai_tensor *const *)&dy, 1, &dx));
        CHECK((dx != NULL) == g->input_grads);
        if (dx)
            check_dx(x, dy, dx);
        ai_tensor_free(dx);
        ai_tensor_free(y);
    }
    ai_tensor_free(dy);
    ai_tensor_free(x);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

/* The memory limit: a plan over it is refused (AI_ERR_NOMEM, naming the
 * node) and allocates nothing; 0 restores the default, under which it runs. */
TEST(backward_memory_limit_refuses_the_plan)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build();
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t shape[2] = {64, 64}; /* 32 KiB per value */
    ai_tensor *x, *y = NULL;
    CHECK_OK(ai_tensor_new(&x, AI_F64, 2, shape));
    int64_t owned = ai_debug_owned_bytes();
    ai_set_memory_limit(40000);
    CHECK(ai_memory_limit() == 40000);
    CHECK(ai_graph_forward(g, 1, (const ai_tensor *const *)&x, 1, &y) == AI_ERR_NOMEM);
    CHECK(strstr(ai_last_error(), "over the memory limit of 40000 bytes") != NULL);
    CHECK(strstr(ai_last_error(), " node '") != NULL);
    CHECK(y == NULL && ai_debug_owned_bytes() == owned);
    ai_set_memory_limit(0);
    CHECK(ai_memory_limit() > 40000);
    CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&x, 1, &y));
    ai_tensor_free(y);
    ai_tensor_free(x);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

/* Views (plan.c): x (3, 4, 5) -> Tanh -> h -> Flatten -> f (3, 20) -> Exp ->
 * y. f is h's buffer (one buffer in the arena at inference), and in
 * backward h's gradient is f's: the Flatten never runs, forward or backward,
 * and dx = dy exp(h) (1 - h^2). */
TEST(backward_views)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g;
    CHECK_OK(ai_graph_new(&g));
    const char *x[1] = {"x"}, *h[1] = {"h"}, *f[1] = {"f"}, *y[1] = {"y"};
    ai_status st = ai_graph_add_input(g, "x", AI_F64);
    st = st ? st : ai_graph_add_node(g, "tanh", "", "Tanh", 17, 1, x, 1, h, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "flatten", "", "Flatten", 17, 1, h, 1, f, 0, NULL);
    st = st ? st : ai_graph_add_node(g, "exp", "", "Exp", 17, 1, f, 1, y, 0, NULL);
    st = st ? st : ai_graph_set_outputs(g, 1, y);
    st = st ? st : ai_graph_finalize(g);
    CHECK_OK(st);
    if (st) {
        ai_graph_free(g);
        return;
    }
    const ai_node *flatten = NULL;
    for (int i = 0; i < g->n_nodes; i++)
        if (!strcmp(g->nodes[i].name, "flatten"))
            flatten = &g->nodes[i];
    const int64_t shape[3] = {3, 4, 5};
    ai_tensor *xt, *dy, *yt = NULL;
    CHECK_OK(ai_tensor_new(&xt, AI_F64, 3, shape));
    CHECK_OK(ai_tensor_new(&dy, AI_F64, 2, (const int64_t[]){3, 20}));
    for (int64_t i = 0; i < 60; i++) {
        AI_F64P(xt)[i] = -1.5 + 3.0 * (double)i / 59.0;
        AI_F64P(dy)[i] = 1.0 + 0.1 * (double)i;
    }
    g->profile = true;
    CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&xt, 1, &yt));
    ai_memory_stats ms;
    CHECK_OK(ai_graph_memory_stats(g, &ms));
    CHECK(ms.arena_bytes == ((60 * sizeof(double) + AI_ALIGN - 1) / AI_ALIGN * AI_ALIGN));
    for (int64_t i = 0; yt && i < 60; i++)
        CHECK_CLOSE(AI_F64P(yt)[i], exp(tanh(AI_F64P(xt)[i])), 1e-14);
    ai_tensor_free(yt);
    yt = NULL;
    g->need_backward = g->input_grads = true;
    for (int pass = 0; pass < 2; pass++) {
        ai_tensor *dx = NULL;
        CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&xt, 1, &yt));
        CHECK_OK(ai_graph_backward(g, 1, (const ai_tensor *const *)&dy, 1, &dx));
        for (int64_t i = 0; dx && i < 60; i++) {
            const double hv = tanh(AI_F64P(xt)[i]);
            CHECK_CLOSE(AI_F64P(dx)[i], AI_F64P(dy)[i] * exp(hv) * (1 - hv * hv), 1e-12);
        }
        ai_tensor_free(dx);
        ai_tensor_free(yt);
        yt = NULL;
    }
    CHECK(flatten && flatten->prof_fwd_n == 0 && flatten->prof_bwd_n == 0);
    CHECK(g->nodes[0].prof_fwd_n + g->nodes[1].prof_fwd_n + g->nodes[2].prof_fwd_n == 6);
    ai_tensor_free(dy);
    ai_tensor_free(xt);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

/* Gradients that are dy (plan.c): y = x + z gives x and z the caller's dy
 * itself (its storage, no copy); in the residual c = a + sigmoid(a), a =
 * tanh(x), y = tanh(c), a's gradient shares c's buffer and the Sigmoid's
 * backward adds into it: dx against the closed form, two passes. */
TEST(backward_gradients_that_are_dy)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g, *r;
    const char *xz[2] = {"x", "z"}, *x[1] = {"x"}, *y[1] = {"y"}, *a[1] = {"a"};
    const char *b[1] = {"b"}, *ab[2] = {"a", "b"}, *c[1] = {"c"};
    CHECK_OK(ai_graph_new(&g));
    CHECK_OK(ai_graph_new(&r));
    ai_status st = ai_graph_add_input(g, "x", AI_F64);
    st = st ? st : ai_graph_add_input(g, "z", AI_F64);
    st = st ? st : ai_graph_add_node(g, "add", "", "Add", 17, 2, xz, 1, y, 0, NULL);
    st = st ? st : ai_graph_set_outputs(g, 1, y);
    st = st ? st : ai_graph_finalize(g);
    st = st ? st : ai_graph_add_input(r, "x", AI_F64);
    st = st ? st : ai_graph_add_node(r, "tanh", "", "Tanh", 17, 1, x, 1, a, 0, NULL);
    st = st ? st : ai_graph_add_node(r, "sigmoid", "", "Sigmoid", 17, 1, a, 1, b, 0, NULL);
    st = st ? st : ai_graph_add_node(r, "add", "", "Add", 17, 2, ab, 1, c, 0, NULL);
    st = st ? st : ai_graph_add_node(r, "out", "", "Tanh", 17, 1, c, 1, y, 0, NULL);
    st = st ? st : ai_graph_set_outputs(r, 1, y);
    st = st ? st : ai_graph_finalize(r);
    CHECK_OK(st);
    g->need_backward = g->input_grads = r->need_backward = r->input_grads = true;
    const int64_t shape[2] = {4, 10};
    ai_tensor *xt, *dy, *yt = NULL, *grads[2] = {NULL, NULL};
    CHECK_OK(ai_tensor_new(&xt, AI_F64, 2, shape));
    CHECK_OK(ai_tensor_new(&dy, AI_F64, 2, shape));
    for (int64_t i = 0; i < 40; i++)
        AI_F64P(xt)[i] = -2.0 + 0.1 * (double)i;
    const ai_tensor *xx[2] = {xt, xt};
    CHECK_OK(ai_graph_forward(g, 2, xx, 1, &yt));
    ai_tensor_free(yt);
    CHECK_OK(ai_graph_backward(g, 1, (const ai_tensor *const *)&dy, 2, grads));
    for (int k = 0; k < 2; k++) {
        CHECK(grads[k] && grads[k]->storage == dy->storage && grads[k]->data == dy->data);
        ai_tensor_free(grads[k]);
    }
    yt = NULL;
    CHECK_OK(ai_graph_forward(r, 1, (const ai_tensor *const *)&xt, 1, &yt));
    for (int pass = 1; pass <= 2; pass++) {
        for (int64_t i = 0; i < 40; i++)
            AI_F64P(dy)[i] = pass * (1.0 - 0.02 * (double)i);
        ai_tensor *dx = NULL;
        CHECK_OK(ai_graph_backward(r, 1, (const ai_tensor *const *)&dy, 1, &dx));
        for (int64_t i = 0; dx && i < 40; i++) {
            const double av = tanh(AI_F64P(xt)[i]), s = 1 / (1 + exp(-av));
            const double yv = tanh(av + s);
            const double want = AI_F64P(dy)[i] * (1 - yv * yv) * (1 + s * (1 - s)) * (1 - av * av);
            CHECK_CLOSE(AI_F64P(dx)[i], want, 1e-12);
        }
        ai_tensor_free(dx);
    }
    ai_tensor_free(yt);
    ai_tensor_free(dy);
    ai_tensor_free(xt);
    ai_graph_free(g);
    ai_graph_free(r);
    CHECK(ai_debug_live_tensors() == live);
}

const ctest_case backward_cases[] = {
    CASE(backward_gradients_that_are_dy),
    CASE(backward_first_writer_assigns),
    CASE(backward_float16_per_node_rounding),
    CASE(backward_input_grads_replans),
    CASE(backward_memory_limit_refuses_the_plan),
    CASE(backward_views),
    {NULL, NULL},
};
