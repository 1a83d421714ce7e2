/*
 * registry.c — the table of every operator. Each family file (ops/<family>.c)
 * exports one NULL-terminated list; adding an operator means adding it to
 * its family's list, nothing else.
 */
#include <string.h>

#include "../graph.h"

#define AI_FAMILIES(X)                                                                   \
    X(unary) X(binary) X(matmul) X(conv) X(pool) X(norm) X(reduce)                       \
    X(reshape) X(movement) X(index) X(index_nd) X(pad) X(from_shape)                     \
    X(shift) X(fused) X(quant) X(qlinear) X(layout) X(resize) X(generate) X(control)      \
    X(loss) X(text) X(ml) X(random) X(signal) X(rnn) X(scatter) X(linalg)                \
    X(sequence) X(select) X(detection) X(deform_conv) X(training)                      \
    X(grid_sample) X(fold) X(quant_nonlinear) X(attention)

#define DECLARE(f) extern const ai_op_def *const ai_ops_##f[];
AI_FAMILIES(DECLARE)
#undef DECLARE

#define LIST(f) ai_ops_##f,
static const ai_op_def *const *const families[] = {AI_FAMILIES(LIST)};
#undef LIST

const ai_op_def *ai_op_at(int i)
{
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (const ai_op_def *const *op = families[f]; *op; op++)
            if (i-- == 0)
                return *op;
    return NULL;
}

const ai_op_def *ai_op_find(const char *domain, const char *op_type)
{
    if (!domain || strcmp(domain, "ai.onnx") == 0)
        domain = "";
    for (int i = 0;; i++) {
        const ai_op_def *op = ai_op_at(i);
        if (!op)
            return NULL;
        if (strcmp(op->name, op_type) == 0 && strcmp(op->domain, domain) == 0)
            return op;
    }
}
