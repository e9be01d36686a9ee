/* A buffer malloc'd, written whole and freed, over and over, as request buffers and scratch
 * space are (round 3's t_reuse):
 *
 *   reuse MIB ROUNDS
 *
 * Then a calloc of the same size, which must read zero. Prints "done" to stdout, and to
 * stderr minflt=N (the minor faults of the loop, from getrusage: this thread's alone), loop_us=T (its wall time)
 * and bad=B (bytes of the calloc'd block that did not read zero). Natively glibc maps the
 * first block and raises its mmap threshold at its free; the later ones come from its heap
 * with their pages in place: a round's worth of faults or two for the whole loop. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "measure.h"

static long minflt(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_minflt;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: reuse MIB ROUNDS\n");
        return 2;
    }
    size_t len = strtoul(argv[1], 0, 10) << 20;
    long rounds = atol(argv[2]);
    long f0 = minflt();
    double t0 = now();
    for (long i = 0; i < rounds; i++) {
        unsigned char *b = malloc(len);
        if (!b) {
            perror("reuse: malloc");
            return 1;
        }
        memset(b, (int)i, len);
        __asm__ volatile("" : : "r"(b) : "memory");
        free(b);
    }
    double t1 = now();
    long f1 = minflt();
    unsigned char *c = calloc(1, len);
    long bad = 0;
    for (size_t o = 0; o < len; o++)
        bad += c[o] != 0;
    free(c);
    fprintf(stderr, "minflt=%ld\nloop_us=%.0f\nbad=%ld\n", f1 - f0, (t1 - t0) * 1e6, bad);
    printf("done\n");
    return 0;
}
