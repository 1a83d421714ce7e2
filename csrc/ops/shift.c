/* shift.c — operator family 'shift' (see registry.c). */
#include "../graph.h"

const ai_op_def *const ai_ops_shift[] = {NULL};
