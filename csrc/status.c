/*
 * status.c — error reporting of the engine core: a status code returned by
 * every fallible call and a message kept per thread, read by the binding.
 */
#include <stdarg.h>
#include <stdio.h>

#include "aidge.h"

static _Thread_local char errmsg[1024];

ai_status ai_error(ai_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return status;
}

const char *ai_last_error(void) { return errmsg; }

const char *ai_status_name(ai_status status)
{
    static const char *const names[] = {
        [AI_OK] = "ok",
        [AI_ERR_VALUE] = "value error",
        [AI_ERR_TYPE] = "type error",
        [AI_ERR_NOMEM] = "out of memory",
        [AI_ERR_NOT_IMPLEMENTED] = "not implemented",
        [AI_ERR_INDEX] = "index error",
        [AI_ERR_RUNTIME] = "runtime error",
    };
    _Static_assert(sizeof names / sizeof names[0] == AI_STATUS_COUNT,
                   "one name per status");
    if ((unsigned)status >= AI_STATUS_COUNT)
        return "unknown status";
    return names[status];
}
