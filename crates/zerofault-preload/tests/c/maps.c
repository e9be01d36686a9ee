/* Fresh mappings touched at a stride, one after the other (shared/repro/round2/p_stride.c):
 *
 *   maps MIB STRIDE_KIB COUNT [MIB STRIDE_KIB COUNT ...]
 *
 * For each phase: COUNT times map MIB of anonymous memory, read then write one byte every
 * STRIDE_KIB (4 writes every page), check it read zero, unmap. Prints to stderr, per phase,
 * phaseN_us=T (its wall time) and at the end bad=N (bytes that did not read zero). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include "measure.h"

int main(int argc, char **argv) {
    if (argc < 4 || (argc - 1) % 3) {
        fprintf(stderr, "usage: maps MIB STRIDE_KIB COUNT [MIB STRIDE_KIB COUNT ...]\n");
        return 2;
    }
    long bad = 0;
    for (int ph = 0; 1 + 3 * ph < argc; ph++) {
        size_t len = strtoul(argv[1 + 3 * ph], 0, 10) << 20;
        size_t stride = strtoul(argv[2 + 3 * ph], 0, 10) << 10;
        long count = atol(argv[3 + 3 * ph]);
        if (!len || !stride) return 2;
        double t0 = now();
        for (long i = 0; i < count; i++) {
            volatile unsigned char *p =
                mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) {
                perror("maps: mmap");
                return 1;
            }
            for (size_t o = 0; o < len; o += stride) {
                bad += p[o] != 0;
                p[o] = 1;
            }
            munmap((void *)p, len);
        }
        fprintf(stderr, "phase%d_us=%.0f\n", ph, (now() - t0) * 1e6);
    }
    fprintf(stderr, "bad=%ld\n", bad);
    return bad != 0;
}
