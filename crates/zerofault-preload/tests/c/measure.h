/* What the tests' programs time and measure of themselves. */
#ifndef ZF_TEST_MEASURE_H
#define ZF_TEST_MEASURE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CLOCK_MONOTONIC, in seconds. */
static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* The value of the line starting with `key` (its colon included, "VmRSS:") in the file at
 * `path` (/proc/self/status, /proc/meminfo), in kB; -1 if there is none or no file. */
static inline long field_kb(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atol(line + n);
    if (f) fclose(f);
    return v;
}

/* The process's VmRSS in kB (-1 if /proc/self/status cannot be read). */
static inline long rss_kb(void) { return field_kb("/proc/self/status", "VmRSS:"); }

#endif
