/* The shim's benchmark program: first touch of calloc'd memory, timed by the program itself.
 *
 *   touch cold MiB              calloc MiB at start-up, write one byte per page, free
 *   touch bursts MiB N IDLE_MS  N times: calloc MiB, write one byte per page, free, sleep
 *   touch idle MiB SECONDS      calloc MiB, write one byte per page, free, sleep SECONDS
 *
 * Prints the wall time of each touch phase and their sum; `idle` prints VmRSS at the end to
 * stderr as "rss_kb=N". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "measure.h"

static double touch(size_t mib) {
    size_t len = mib << 20;
    double t0 = now();
    volatile unsigned char *p = calloc(1, len);
    if (!p) { perror("calloc"); exit(1); }
    for (size_t i = 0; i < len; i += 4096) p[i] = 1;
    double t = now() - t0;
    free((void *)p);
    return t;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "cold")) {
        double t = touch(strtoul(argv[2], 0, 10));
        printf("cold touch %s MiB: %.4f s\n", argv[2], t);
        return 0;
    }
    if (argc >= 5 && !strcmp(argv[1], "bursts")) {
        size_t mib = strtoul(argv[2], 0, 10);
        int n = atoi(argv[3]), idle = atoi(argv[4]);
        double sum = 0, rest = 0;
        for (int i = 0; i < n; i++) {
            double t = touch(mib);
            sum += t;
            if (i > 0) rest += t;
            printf("burst %d: %.4f s\n", i, t);
            usleep(idle * 1000);
        }
        printf("touch phases: %.4f s in all, %.4f s after the first\n", sum, rest);
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "idle")) {
        double t = touch(strtoul(argv[2], 0, 10));
        printf("touch %s MiB: %.4f s, then idle %s s\n", argv[2], t, argv[3]);
        fflush(stdout);
        sleep((unsigned)atoi(argv[3]));
        fprintf(stderr, "rss_kb=%ld\n", rss_kb());
        return 0;
    }
    fprintf(stderr, "usage: touch cold MiB | touch bursts MiB N IDLE_MS | touch idle MiB SECONDS\n");
    return 2;
}
