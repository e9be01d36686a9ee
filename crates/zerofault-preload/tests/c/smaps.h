/* What the tests' programs read of /proc/self/smaps. */
#ifndef ZF_TEST_SMAPS_H
#define ZF_TEST_SMAPS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* AnonHugePages of the mappings inside [lo, hi), in kB (the engine's own pool holds huge pages
 * too, elsewhere). */
static long anon_huge_kb(const void *lo, const void *hi) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    long sum = 0;
    int in = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = b > (unsigned long)lo && a < (unsigned long)hi;
        else if (in && !strncmp(line, "AnonHugePages:", 14))
            sum += atol(line + 14);
    }
    if (f) fclose(f);
    return sum;
}

/* AnonHugePages of the whole process (smaps_rollup), in kB: the program's and the engine's. */
static inline long process_huge_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[512];
    long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14)) v = atol(line + 14);
    if (f) fclose(f);
    return v;
}

#endif
