/*
 * test_rnn.c — the recurrent operators (ops/rnn.c) on a graph built in C: a
 * bidirectional float64 LSTM with sequence lengths, its gradients of X, W
 * and R against central differences of its own forward, Y zero past each
 * entry's length; and a run of 2^40 steps refused by the memory limit
 * before anything is allocated.
 */
#include <stdint.h>
#include <string.h>

#include "../graph.h"
#include "ctest.h"

enum { T = 3, B = 2, I = 2, H = 4, D = 2 };

static ai_graph *build_lstm(void)
{
    ai_graph *g;
    if (ai_graph_new(&g))
        return NULL;
    const char *in[5] = {"X", "W", "R", "", "lens"}, *out[2] = {"Y", "Y_h"};
    ai_attr attrs[2] = {{.name = "direction", .type = AI_ATTR_STRING, .s = "bidirectional"},
                        {.name = "hidden_size", .type = AI_ATTR_INT, .i = H}};
    ai_status st = AI_OK;
    for (int k = 0; k < 3 && !st; k++)
        st = ai_graph_add_input(g, in[k], AI_F64);
    st = st ? st : ai_graph_add_input(g, "lens", AI_I32);
    st = st ? st : ai_graph_add_node(g, "lstm", "", "LSTM", 14, 5, in, 2, out, 2, attrs);
    st = st ? st : ai_graph_set_outputs(g, 2, out);
    st = st ? st : ai_graph_finalize(g);
    if (st) {
        ai_graph_free(g);
        return NULL;
    }
    return g;
}

/* sum(Y wy) + sum(Y_h wh) for the inputs */
static double loss(ai_graph *g, ai_tensor *const *ins, const ai_tensor *const *w)
{
    ai_tensor *outs[2] = {NULL, NULL};
    double l = 0;
    if (ai_graph_forward(g, 4, (const ai_tensor *const *)ins, 2, outs) == AI_OK)
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < ai_tensor_numel(outs[k]); i++)
                l += AI_F64P(outs[k])[i] * AI_F64P(w[k])[i];
    ai_tensor_free(outs[0]);
    ai_tensor_free(outs[1]);
    return l;
}

TEST(rnn_lstm_gradients_match_finite_differences)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build_lstm();
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t xs[3] = {T, B, I}, ws[3] = {D, 4 * H, I}, rs[3] = {D, 4 * H, H}, ls[1] = {B};
    const int64_t ys[4] = {T, D, B, H}, hs[3] = {D, B, H};
    ai_tensor *ins[4], *w[2], *outs[2] = {NULL, NULL}, *grads[4] = {NULL};
    CHECK_OK(ai_tensor_new(&ins[0], AI_F64, 3, xs));
    CHECK_OK(ai_tensor_new(&ins[1], AI_F64, 3, ws));
    CHECK_OK(ai_tensor_new(&ins[2], AI_F64, 3, rs));
    CHECK_OK(ai_tensor_new(&ins[3], AI_I32, 1, ls));
    CHECK_OK(ai_tensor_new(&w[0], AI_F64, 4, ys));
    CHECK_OK(ai_tensor_new(&w[1], AI_F64, 3, hs));
    uint64_t seed = 12345;
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < ai_tensor_numel(ins[k]); i++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            AI_F64P(ins[k])[i] = (double)(seed >> 11) / 9007199254740992.0 - 0.5;
        }
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < ai_tensor_numel(w[k]); i++)
            AI_F64P(w[k])[i] = 0.3 + 0.1 * (double)(i % 7);
    ((int32_t *)ins[3]->data)[0] = 3;
    ((int32_t *)ins[3]->data)[1] = 1;
    g->need_backward = g->input_grads = true;
    CHECK_OK(ai_graph_forward(g, 4, (const ai_tensor *const *)ins, 2, outs));
    CHECK_OK(ai_graph_backward(g, 2, (const ai_tensor *const *)w, 4, grads));
    if (outs[0]) /* entry 1 has one step: Y is zero at t = 1, 2, both directions */
        for (int64_t t = 1; t < T; t++)
            for (int64_t d = 0; d < D; d++)
                for (int64_t j = 0; j < H; j++)
                    CHECK(AI_F64P(outs[0])[((t * D + d) * B + 1) * H + j] == 0);
    CHECK(grads[3] == NULL); /* the lengths have none */
    const double eps = 1e-6;
    for (int k = 0; k < 3; k++) {
        CHECK(grads[k] != NULL);
        for (int64_t i = 0; grads[k] && i < ai_tensor_numel(ins[k]); i++) {
            double *v = &AI_F64P(ins[k])[i], keep = *v;
            *v = keep + eps;
            double up = loss(g, ins, (const ai_tensor *const *)w);
            *v = keep - eps;
            double down = loss(g, ins, (const ai_tensor *const *)w);
            *v = keep;
            CHECK_CLOSE(AI_F64P(grads[k])[i], (up - down) / (2 * eps), 1e-7);
        }
    }
    for (int k = 0; k < 4; k++) {
        ai_tensor_free(ins[k]);
        ai_tensor_free(grads[k]);
    }
    for (int k = 0; k < 2; k++) {
        ai_tensor_free(w[k]);
        ai_tensor_free(outs[k]);
    }
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

/* 2^40 steps of no features (X empty): Y alone needs 2^40 D B H doubles */
TEST(rnn_lstm_of_2_to_the_40_steps_is_refused_by_the_memory_limit)
{
    int64_t live = ai_debug_live_tensors();
    ai_graph *g = build_lstm();
    CHECK(g != NULL);
    if (!g)
        return;
    const int64_t xs[3] = {(int64_t)1 << 40, B, 0}, ws[3] = {D, 4 * H, 0};
    const int64_t rs[3] = {D, 4 * H, H}, ls[1] = {B};
    ai_tensor *ins[4], *outs[2] = {NULL, NULL};
    CHECK_OK(ai_tensor_new(&ins[0], AI_F64, 3, xs));
    CHECK_OK(ai_tensor_new(&ins[1], AI_F64, 3, ws));
    CHECK_OK(ai_tensor_new(&ins[2], AI_F64, 3, rs));
    CHECK_OK(ai_tensor_new(&ins[3], AI_I32, 1, ls));
    int64_t owned = ai_debug_owned_bytes();
    ai_set_memory_limit((size_t)1 << 30);
    CHECK(ai_graph_forward(g, 4, (const ai_tensor *const *)ins, 2, outs) == AI_ERR_NOMEM);
    CHECK(strstr(ai_last_error(), "LSTM node 'lstm': its output 'Y' needs") != NULL);
    CHECK(outs[0] == NULL && ai_debug_owned_bytes() == owned);
    ai_set_memory_limit(0);
    for (int k = 0; k < 4; k++)
        ai_tensor_free(ins[k]);
    ai_graph_free(g);
    CHECK(ai_debug_live_tensors() == live);
}

const ctest_case rnn_cases[] = {
    CASE(rnn_lstm_gradients_match_finite_differences),
    CASE(rnn_lstm_of_2_to_the_40_steps_is_refused_by_the_memory_limit),
    {NULL, NULL},
};
