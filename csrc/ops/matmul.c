/* matmul.c — operator family 'matmul' (see registry.c). */
#include "../graph.h"

const ai_op_def *const ai_ops_matmul[] = {NULL};
