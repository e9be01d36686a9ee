/* A program that locks its memory (databases, real-time audio, chronyd do) and allocates.
 *
 *   mlockall first   mlockall(MCL_CURRENT | MCL_FUTURE) at start, then malloc and write 64 MiB
 *   mlockall later   malloc and write 64 MiB first (a large block is in use), then
 *                    mlockall(MCL_CURRENT | MCL_FUTURE), then malloc and write 64 MiB more
 *
 * Prints what it did; VmLck and VmRSS of /proc/self/status go to stderr at the end, as
 * "vmlck_kb=N" and "vmrss_kb=N". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key));
    if (f) fclose(f);
    return v;
}

/* The writes are made for real: the block is never used again. */
static void keep(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static int lock_all(void) {
    int r = mlockall(MCL_CURRENT | MCL_FUTURE);
    printf("mlockall: %s\n", r ? strerror(errno) : "ok");
    return r;
}

static int block(void) {
    size_t len = 64u << 20;
    unsigned char *p = malloc(len);
    if (!p) { printf("malloc(64 MiB) failed\n"); return 1; }
    long bad = 0;
    for (size_t i = 0; i < len; i += 4096) {
        bad += p[i + 3] != 0;
        p[i] = 1;
    }
    keep(p);
    printf("wrote 64 MiB: bad=%ld\n", bad);
    return bad != 0; /* kept: still in use when the memory is measured */
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc;
    if (argc == 2 && !strcmp(argv[1], "first")) {
        rc = lock_all() || block();
    } else if (argc == 2 && !strcmp(argv[1], "later")) {
        rc = block() || lock_all() || block();
    } else {
        fprintf(stderr, "usage: mlockall first|later\n");
        return 2;
    }
    fprintf(stderr, "vmlck_kb=%ld\nvmrss_kb=%ld\n", status_kb("VmLck:"), status_kb("VmRSS:"));
    return rc;
}
