/* norm.c — operator family 'norm' (see registry.c). */
#include "../graph.h"

const ai_op_def *const ai_ops_norm[] = {NULL};
