/* Large blocks made and freed by the thousand: each of 2-16 MiB, eight alive at a time, a
 * quarter MiB of each written (every tenth written whole). The program's own memory stays near
 * 100 MiB; the engine must keep its own beside it small, and inside a memory cgroup.
 *
 *   churn MALLOCS       prints "made N" on stdout, and its peak RSS as "hwm_kb=N" on stderr */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "measure.h"

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 3000;
    unsigned seed = 1;
    unsigned char *alive[8] = {0};
    int made = 0;
    for (int i = 0; i < count; i++) {
        size_t n = ((size_t)(2 + rand_r(&seed) % 14) << 20) + (size_t)(rand_r(&seed) % 4) * 4096;
        unsigned char *p = malloc(n);
        if (!p)
            return 2;
        size_t touch = i % 10 == 0 ? n : (size_t)256 << 10;
        for (size_t o = 0; o < touch; o += 4096)
            p[o] = 1;
        p[n - 1] = 2;
        free(alive[i % 8]);
        alive[i % 8] = p;
        made++;
    }
    for (int k = 0; k < 8; k++)
        free(alive[k]);
    printf("made %d\n", made);
    fprintf(stderr, "hwm_kb=%ld\n", field_kb("/proc/self/status", "VmHWM:"));
    return 0;
}
