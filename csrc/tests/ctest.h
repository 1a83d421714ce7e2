/*
 * ctest.h — the smallest test runner that does the job: TEST(name) defines a
 * case, CHECK(cond) records a failure with its location and goes on, the
 * runner counts and prints "N passed, N failed" and exits non-zero on any
 * failure. Each test file ends with a NULL-terminated table of its cases,
 * which test_main.c lists.
 */
#ifndef CTEST_H
#define CTEST_H

#include <math.h>
#include <stdio.h>

extern int ctest_failures;

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, \
                    #cond);                                                   \
            ctest_failures++;                                                 \
        }                                                                     \
    } while (0)

#define CHECK_OK(expr)                                                        \
    do {                                                                      \
        ai_status st_ = (expr);                                               \
        if (st_ != AI_OK) {                                                   \
            fprintf(stderr, "  %s:%d: %s returned %s: %s\n", __FILE__,       \
                    __LINE__, #expr, ai_status_name(st_), ai_last_error());    \
            ctest_failures++;                                                 \
        }                                                                     \
    } while (0)

#define CHECK_CLOSE(a, b, tol) CHECK(fabs((double)(a) - (double)(b)) <= (tol))

#define TEST(name) static void test_##name(void)
#define CASE(name) {#name, test_##name}

typedef struct {
    const char *name;
    void (*fn)(void);
} ctest_case;

#endif
