/* conv.c — operator family 'conv' (see registry.c). */
#include "../graph.h"

const ai_op_def *const ai_ops_conv[] = {NULL};
