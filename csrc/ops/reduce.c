/* reduce.c — operator family 'reduce' (see registry.c). */
#include "../graph.h"

const ai_op_def *const ai_ops_reduce[] = {NULL};
