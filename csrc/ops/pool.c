/* pool.c — operator family 'pool' (see registry.c). */
#include "../graph.h"

const ai_op_def *const ai_ops_pool[] = {NULL};
