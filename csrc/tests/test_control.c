/*
 * test_control.c — a Loop built in C (ops/control.c): its body is a graph
 * attribute that the node owns, with a captured parameter w as an explicit
 * input. acc_{k+1} = acc_k * w + w for M = 3 iterations, every acc_{k+1}
 * stacked as the scan output. Forward against the recurrence, backward
 * (w's gradient flows out of the loop, acc0's through the carried value)
 * against central differences of it, and nothing leaks.
 */
#include <math.h>

#include "../graph.h"
#include "ctest.h"

#define TRIPS 3

static ai_graph *build_body(void)
{
    ai_graph *b;
    if (ai_graph_new(&b))
        return NULL;
    const char *cond[1] = {"cond_in"}, *cond_out[1] = {"cond_out"};
    const char *mul_in[2] = {"acc_in", "w"}, *aw[1] = {"aw"};
    const char *add_in[2] = {"aw", "w"}, *acc_out[1] = {"acc_out"};
    const char *outs[3] = {"cond_out", "acc_out", "acc_out"};
    ai_status st = ai_graph_add_input(b, "i", AI_I64);
    st = st ? st : ai_graph_add_input(b, "cond_in", AI_BOOL);
    st = st ? st : ai_graph_add_input(b, "acc_in", AI_F64);
    st = st ? st : ai_graph_add_input(b, "w", AI_F64);
    st = st ? st : ai_graph_add_node(b, "keep", "", "Identity", 17, 1, cond, 1, cond_out, 0,
                                     NULL);
    st = st ? st : ai_graph_add_node(b, "mul", "", "Mul", 17, 2, mul_in, 1, aw, 0, NULL);
    st = st ? st : ai_graph_add_node(b, "add", "", "Add", 17, 2, add_in, 1, acc_out, 0, NULL);
    st = st ? st : ai_graph_set_outputs(b, 3, outs);
    if (st) {
        ai_graph_free(b);
        return NULL;
    }
    return b;
}

static ai_graph *build(const double *w)
{
    ai_graph *g, *body = build_body();
    if (!body || ai_graph_new(&g)) {
        ai_graph_free(body);
        return NULL;
    }
    const int64_t two[1] = {2}, none[1] = {0};
    ai_tensor *m, *wt;
    ai_status st = ai_tensor_new(&m, AI_I64, 0, none);
    st = st ? st : ai_tensor_new(&wt, AI_F64, 1, two);
    if (!st) {
        *(int64_t *)m->data = TRIPS;
        AI_F64P(wt)[0] = w[0];
        AI_F64P(wt)[1] = w[1];
    }
    const char *ins[4] = {"M", "", "acc0", "w"}, *outs[2] = {"acc", "stack"};
    ai_attr attrs[2] = {{.name = "body", .type = AI_ATTR_GRAPH, .graph = body},
                        {.name = "captures", .type = AI_ATTR_INT, .i = 1}};
    st = st ? st : ai_graph_add_input(g, "acc0", AI_F64);
    st = st ? st : ai_graph_add_initializer(g, "M", AI_VAL_CONST, m);
    st = st ? st : ai_graph_add_initializer(g, "w", AI_VAL_PARAM, wt);
    st = st ? st : ai_graph_add_node(g, "loop", "", "Loop", 17, 4, ins, 2, outs, 2, attrs);
    st = st ? st : ai_graph_set_outputs(g, 2, outs);
    st = st ? st : ai_graph_finalize(g);
    ai_graph_free(body); /* the node keeps its own reference */
    if (st) {
        ai_graph_free(g);
        return NULL;
    }
    g->need_backward = g->input_grads = true;
    return g;
}

/* sum(dacc * acc_final) + sum(dstack * stack) by the recurrence */
static double objective(const double *acc0, const double *w, const double *dacc,
                        const double *dstack, double *stack)
{
    double f = 0;
    for (int j = 0; j < 2; j++) {
        double a = acc0[j];
        for (int k = 0; k < TRIPS; k++) {
            a = a * w[j] + w[j];
            if (stack)
                stack[k * 2 + j] = a;
            f += dstack[k * 2 + j] * a;
        }
        f += dacc[j] * a;
    }
    return f;
}

TEST(control_loop_forward_backward)
{
    int64_t live = ai_debug_live_tensors();
    double w[2] = {0.7, -1.3}, acc0[2] = {0.4, 2.0}, dacc[2] = {1.5, -0.5};
    double dstack[2 * TRIPS] = {0.3, -0.2, 1.1, 0.6, -0.9, 0.25}, want[2 * TRIPS];
    ai_graph *g = build(w);
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t two[1] = {2}, stack_shape[2] = {TRIPS, 2};
    ai_tensor *x, *gy[2], *y[2] = {NULL, NULL}, *dx = NULL;
    CHECK_OK(ai_tensor_new(&x, AI_F64, 1, two));
    CHECK_OK(ai_tensor_new(&gy[0], AI_F64, 1, two));
    CHECK_OK(ai_tensor_new(&gy[1], AI_F64, 2, stack_shape));
    for (int j = 0; j < 2; j++) {
        AI_F64P(x)[j] = acc0[j];
        AI_F64P(gy[0])[j] = dacc[j];
    }
    for (int k = 0; k < 2 * TRIPS; k++)
        AI_F64P(gy[1])[k] = dstack[k];
    objective(acc0, w, dacc, dstack, want);
    CHECK_OK(ai_graph_forward(g, 1, (const ai_tensor *const *)&x, 2, y));
    CHECK(y[1] && y[1]->ndim == 2 && y[1]->shape[0] == TRIPS && y[1]->shape[1] == 2);
    for (int k = 0; k < 2 * TRIPS && y[1]; k++)
        CHECK_CLOSE(AI_F64P(y[1])[k], want[k], 1e-12);
    for (int j = 0; j < 2 && y[0]; j++)
        CHECK_CLOSE(AI_F64P(y[0])[j], want[(TRIPS - 1) * 2 + j], 1e-12);
    ai_graph_zero_grad(g);
    CHECK_OK(ai_graph_backward(g, 2, (const ai_tensor *const *)gy, 1, &dx));
    const ai_tensor *dw = g->values[ai_graph_find_value(g, "w")].grad;
    const double h = 1e-6;
    for (int j = 0; j < 2; j++) {
        double p[2] = {w[0], w[1]}, q[2] = {w[0], w[1]};
        p[j] += h;
        q[j] -= h;
        double num_w = (objective(acc0, p, dacc, dstack, NULL) -
                        objective(acc0, q, dacc, dstack, NULL)) / (2 * h);
        CHECK_CLOSE(AI_F64P(dw)[j], num_w, 1e-6);
        double a[2] = {acc0[0], acc0[1]}, b[2] = {acc0[0], acc0[1]};
        a[j] += h;
        b[j] -= h;
        double num_x = (objective(a, w, dacc, dstack, NULL) -
                        objective(b, w, dacc, dstack, NULL)) / (2 * h);
        CHECK(dx != NULL);
        if (dx)
            CHECK_CLOSE(AI_F64P(dx)[j], num_x, 1e-6);
    }
    ai_tensor_free(dx);
    ai_tensor_free(y[0]);
    ai_tensor_free(y[1]);
    ai_tensor_free(gy[0]);
    ai_tensor_free(gy[1]);
    ai_tensor_free(x);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

const ctest_case control_cases[] = {
    CASE(control_loop_forward_backward),
    {NULL, NULL},
};
