/* Sparse first touch (shared/repro/round2/p_sparse_rss.c, timed): one byte written every
 * STRIDE KiB of a fresh mapping, the way a hash table, a sparse matrix or a page-per-record
 * log first touches its memory. Natively only the touched pages become resident.
 *
 *   sparse STRIDE_KIB MIB mmap|malloc up|down
 *
 * Prints to stderr rss_grew_kb=N (VmRSS growth over the touch), touched_kb=N (the pages
 * touched) and touch_us=N (the touch loop's wall time: the program's own, without start-up). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "measure.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: sparse STRIDE_KIB MIB mmap|malloc up|down\n");
        return 2;
    }
    size_t stride = strtoul(argv[1], 0, 10) << 10, len = strtoul(argv[2], 0, 10) << 20;
    int use_malloc = !strcmp(argv[3], "malloc"), down = !strcmp(argv[4], "down");
    if (!stride || !len) return 2;
    volatile unsigned char *p = use_malloc ? malloc(len)
        : mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!p || p == MAP_FAILED) {
        perror("sparse: allocating");
        return 1;
    }
    long r0 = rss_kb();
    size_t n = len / stride;
    double t0 = now();
    for (size_t i = 0; i < n; i++) p[down ? len - 1 - i * stride : i * stride] = 1;
    double t = now() - t0;
    fprintf(stderr, "rss_grew_kb=%ld\ntouched_kb=%zu\ntouch_us=%.0f\n", rss_kb() - r0, n * 4, t * 1e6);
    return 0;
}
