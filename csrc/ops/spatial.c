/* spatial.c — see spatial.h. */
#include <string.h>

#include "spatial.h"

ai_status ai_read_int_list(const ai_node *n, const char *name, int max, int64_t lo,
                           ai_int_list *l)
{
    const int64_t *v;
    ai_status st = ai_attr_ints(n, name, &v, &l->n);
    if (st || l->n < 0)
        return st;
    if (l->n > max)
        return ai_node_error(n, AI_ERR_VALUE, "%s has %lld values; at most %d expected",
                             name, (long long)l->n, max);
    for (int64_t i = 0; i < l->n; i++) {
        if (v[i] < lo || v[i] > INT32_MAX)
            return ai_node_error(n, AI_ERR_VALUE, "%s[%lld] is %lld; must be in [%lld, %d]",
                                 name, (long long)i, (long long)v[i], (long long)lo, INT32_MAX);
        l->v[i] = v[i];
    }
    return AI_OK;
}

ai_status ai_read_auto_pad(const ai_node *n, int *mode)
{
    static const char *const modes[] = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"};
    return ai_attr_choice(n, "auto_pad", "NOTSET", modes, 4, mode);
}

ai_status ai_spatial_list(const ai_node *n, const char *name, const ai_int_list *l, int nsp,
                          int64_t dflt, int64_t *out)
{
    if (l->n >= 0 && l->n != nsp)
        return ai_node_error(n, AI_ERR_VALUE, "%s has %lld values for %d spatial dims",
                             name, (long long)l->n, nsp);
    for (int d = 0; d < nsp; d++)
        out[d] = l->n < 0 ? dflt : l->v[d];
    return AI_OK;
}
