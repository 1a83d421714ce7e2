/*
 * sancov_forward.c — lets gcc's AddressSanitizer and atheris' libFuzzer share
 * one process (used by run_fuzz.py only; not part of the package).
 *
 * The ASan runtime must be preloaded, and it exports no-op versions of the
 * coverage callbacks (__sanitizer_cov_*) that would shadow libFuzzer's in
 * atheris' core module: no coverage, no guidance. Preloaded before it, this
 * library defines those callbacks and forwards them to the core module's own
 * definitions (looked up in that module, whose path is in
 * AIDGE_FUZZ_LIBFUZZER). The callbacks of float comparisons, which gcc's
 * -fsanitize-coverage=trace-cmp emits and libFuzzer lacks, do nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

static void *core(const char *name)
{
    static void *handle;
    if (!handle) {
        const char *path = getenv("AIDGE_FUZZ_LIBFUZZER");
        handle = path ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (!handle)
            return NULL;
    }
    return dlsym(handle, name);
}

#define FORWARD(NAME, PARAMS, ARGS)                                                   \
    void NAME PARAMS                                                                  \
    {                                                                                 \
        static void(*fn) PARAMS;                                                      \
        if (!fn)                                                                      \
            *(void **)&fn = core(#NAME);                                              \
        if (fn)                                                                       \
            fn ARGS;                                                                  \
    }

FORWARD(__sanitizer_cov_8bit_counters_init, (uint8_t *a, uint8_t *b), (a, b))
FORWARD(__sanitizer_cov_pcs_init, (const uintptr_t *a, const uintptr_t *b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp1, (uint8_t a, uint8_t b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp2, (uint16_t a, uint16_t b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp4, (uint32_t a, uint32_t b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp8, (uint64_t a, uint64_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp1, (uint8_t a, uint8_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp2, (uint16_t a, uint16_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp4, (uint32_t a, uint32_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp8, (uint64_t a, uint64_t b), (a, b))
FORWARD(__sanitizer_cov_trace_switch, (uint64_t v, uint64_t *cases), (v, cases))

void __sanitizer_cov_trace_cmpf(float a, float b) { (void)a, (void)b; }
void __sanitizer_cov_trace_cmpd(double a, double b) { (void)a, (void)b; }
