/*
 * test_main.c — runs the engine core's C unit tests, without Python.
 * Usage: test_core [substring]   (runs the cases whose name contains it)
 */
#include <string.h>

#include "../aidge.h"
#include "ctest.h"

int ctest_failures;

extern const ctest_case tensor_cases[];
extern const ctest_case kernel_cases[];
extern const ctest_case compare_cases[];
extern const ctest_case portable_cases[];
extern const ctest_case recipe_cases[];
extern const ctest_case backward_cases[];
extern const ctest_case fastmath_cases[];
extern const ctest_case parallel_cases[];
extern const ctest_case control_cases[];
extern const ctest_case rnn_cases[];
extern const ctest_case select_cases[];
extern const ctest_case qkernel_cases[];
extern const ctest_case rows_cases[];

static const ctest_case *const suites[] = {tensor_cases,  kernel_cases,   compare_cases,
                                             portable_cases, recipe_cases,  backward_cases,
                                             fastmath_cases, parallel_cases, control_cases,
                                             rnn_cases, select_cases, qkernel_cases, rows_cases};

int main(int argc, char **argv)
{
    const char *filter = argc > 1 ? argv[1] : "";
    int passed = 0, failed = 0;
    for (size_t s = 0; s < sizeof suites / sizeof suites[0]; s++) {
        for (const ctest_case *c = suites[s]; c->name; c++) {
            if (!strstr(c->name, filter))
                continue;
            int before = ctest_failures;
            c->fn();
            if (ctest_failures == before) {
                passed++;
            } else {
                failed++;
                fprintf(stderr, "FAILED %s\n", c->name);
            }
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
