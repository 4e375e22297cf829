/*
 * c_check.h — the check macro of the C test programs (test_c_abi.c,
 * test_backend_module.c): prints a failed check with its file, line and message and
 * counts it in g_failures; the program exits nonzero if any failed.
 */
#ifndef SHARDADAM_TESTS_C_CHECK_H_
#define SHARDADAM_TESTS_C_CHECK_H_

#include <stdio.h>

static int g_failures = 0;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

#endif /* SHARDADAM_TESTS_C_CHECK_H_ */
