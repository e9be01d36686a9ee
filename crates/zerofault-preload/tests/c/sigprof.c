/* A sampling profiler in miniature: SIGPROF at 1 kHz, process-directed (any thread that does not
 * block it may take it), whose handler appends samples to a fresh 16 MiB mmap'ed buffer, one page
 * per sample, while the main thread streams through 256 MiB and drops it with MADV_DONTNEED
 * after each pass, for SECONDS seconds.
 *
 *   sigprof SECONDS
 *
 * Prints "done" and whether samples were taken; the counts go to stderr. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include "measure.h"

#define SAMPLES ((16u << 20) / 8)
#define STRIDE 512 /* one page of 8-byte samples */

static uint64_t *buf;
static volatile size_t at;
static volatile long taken;

static void on_prof(int sig) {
    (void)sig;
    size_t i = at;
    if (i < SAMPLES) {
        buf[i] = i + 1; /* the first touch of a fresh page, inside the handler */
        at = i + STRIDE;
        taken++;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: sigprof SECONDS\n"); return 2; }
    double secs = atof(argv[1]);
    size_t len = 256u << 20;
    buf = mmap(NULL, SAMPLES * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED || p == MAP_FAILED) { perror("mmap"); return 1; }
    signal(SIGPROF, on_prof);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &it, NULL);
    double t0 = now();
    long passes = 0, bad = 0;
    while (now() - t0 < secs) {
        for (size_t i = 0; i < len; i += 4096) {
            if (p[i + 8]) bad++;
            p[i] = (unsigned char)(passes + 1);
        }
        madvise(p, len, MADV_DONTNEED);
        passes++;
        if (at >= SAMPLES) {
            madvise(buf, SAMPLES * 8, MADV_DONTNEED);
            at = 0;
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    fprintf(stderr, "sigprof: %ld passes, %ld samples\n", passes, (long)taken);
    printf("done: bad=%ld, samples taken: %s\n", bad, taken > 0 ? "yes" : "no");
    return bad ? 1 : 0;
}
