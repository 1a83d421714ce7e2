/* shape.c — operator family 'shape' (see registry.c). */
#include "../graph.h"

const ai_op_def *const ai_ops_shape[] = {NULL};
