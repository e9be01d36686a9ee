/* mremap of memory a program made in pieces, and growth with mremap.
 *
 *   mremap fixed [MIB OFF]      maps MIB MiB (4), maps 1 MiB at OFF MiB (1) again over it with
 *                               MAP_FIXED (as allocators decommit part of an extent), writes it
 *                               all, then moves it with MREMAP_MAYMOVE | MREMAP_FIXED: natively
 *                               the pieces are one VMA again and move as one
 *   mremap dontunmap [MIB OFF]  the same with MREMAP_DONTUNMAP: the old range stays, reading zero
 *   mremap grow                 writes 64 MiB, grows it to 512 MiB with MREMAP_MAYMOVE, then
 *                               writes the grown part, which must read zero first
 *   mremap steps                maps 32 MiB and writes it, then grows it to 256 MiB in 64 KiB
 *                               steps with MREMAP_MAYMOVE (a table grown as it fills), each new
 *                               part read (zero) and written, a sample of the old checked
 *
 * Prints the outcome and, for the moves, how many samples (one per 64 bytes) hold the data at
 * the destination and read zero at the old range. /proc/self/maps around the mapping goes to
 * stderr. Exit 0 when everything checked. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MB ((size_t)1 << 20)

static unsigned char pat(size_t off) { return (unsigned char)((off * 2654435761u) >> 13 | 1); }

static void maps(const char *tag, unsigned char *lo, unsigned char *hi) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    fprintf(stderr, "maps %s:\n", tag);
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && b > (unsigned long)lo && a < (unsigned long)hi)
            fputs(line, stderr);
    }
    if (f) fclose(f);
}

static int move(int dontunmap, size_t len, size_t off) {
    /* A reservation to place the mapping and its destination in, 2 MiB aligned. */
    unsigned char *raw = mmap(NULL, 4 * len + 2 * MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return 2;
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + 2 * MB - 1) & ~(2 * MB - 1)), *dst = p + 2 * len;
    if (mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != p) return 2;
    for (size_t i = 0; i < len; i += 64) p[i] = pat(i);
    if (mmap(p + off, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != p + off) return 2;
    for (size_t i = off; i < off + MB; i += 64) p[i] = pat(i);
    maps("before", raw, raw + 4 * len + 2 * MB);
    void *q = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | (dontunmap ? MREMAP_DONTUNMAP : 0), dst);
    printf("mremap(%zu MiB with 1 MiB remapped at %zu MiB, %s) -> %s\n", len / MB, off / MB,
           dontunmap ? "MREMAP_DONTUNMAP" : "MREMAP_FIXED", q == MAP_FAILED ? strerror(errno) : "ok");
    maps("after", raw, raw + 4 * len + 2 * MB);
    if (q == MAP_FAILED) return 1;
    long at_dst = 0, zero_at_old = 0, n = len / 64;
    for (size_t i = 0; i < len; i += 64) {
        at_dst += dst[i] == pat(i);
        if (dontunmap) zero_at_old += p[i] == 0;
    }
    printf("destination: %ld of %ld samples hold the data\n", at_dst, n);
    if (dontunmap) printf("old range: %ld of %ld samples read zero\n", zero_at_old, n);
    return at_dst == n && (!dontunmap || zero_at_old == n) ? 0 : 1;
}

static int grow(void) {
    size_t len = 64 * MB, grown = 512 * MB;
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    for (size_t i = 0; i < len; i += 4096) p[i] = 1;
    unsigned char *q = mremap(p, len, grown, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) { printf("mremap grow -> %s\n", strerror(errno)); return 1; }
    long bad = 0;
    for (size_t i = 0; i < len; i += 4096) bad += q[i] != 1;
    for (size_t i = len; i < grown; i += 4096) {
        bad += q[i + 9] != 0;
        q[i] = 2;
    }
    for (size_t i = len; i < grown; i += 4096) bad += q[i] != 2;
    printf("grew 64 MiB to 512 MiB and wrote the new part: bad=%ld\n", bad);
    munmap(q, grown);
    return bad ? 1 : 0;
}

static int steps(void) {
    size_t len = 32 * MB, max = 256 * MB, step = 64 << 10;
    long bad = 0, n = 0, moves = 0;
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    for (size_t i = 0; i < len; i += 64) p[i] = pat(i);
    while (len < max) {
        unsigned char *q = mremap(p, len, len + step, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) { printf("mremap to %zu -> %s\n", len + step, strerror(errno)); return 1; }
        moves += q != p;
        p = q;
        for (size_t i = len; i < len + step; i += 64) {
            bad += p[i] != 0;
            p[i] = pat(i);
        }
        for (size_t k = 1; k <= 8; k++) bad += p[len / 9 * k / 64 * 64] != pat(len / 9 * k / 64 * 64);
        len += step;
        n++;
    }
    fprintf(stderr, "moved %ld times\n", moves);
    for (size_t i = 0; i < len; i += 64) bad += p[i] != pat(i);
    printf("grew 32 MiB to %zu MiB in %ld steps of 64 KiB: bad=%ld\n", len / MB, n, bad);
    munmap(p, len);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && !strcmp(argv[1], "grow")) return grow();
    if (argc == 2 && !strcmp(argv[1], "steps")) return steps();
    if ((argc == 2 || argc == 4) && (!strcmp(argv[1], "fixed") || !strcmp(argv[1], "dontunmap"))) {
        size_t len = argc == 4 ? strtoul(argv[2], NULL, 10) * MB : 4 * MB;
        size_t off = argc == 4 ? strtoul(argv[3], NULL, 10) * MB : MB;
        if (off + MB > len) return 2;
        return move(!strcmp(argv[1], "dontunmap"), len, off);
    }
    fprintf(stderr, "usage: mremap fixed|dontunmap [MIB OFF] | mremap grow | mremap steps\n");
    return 2;
}
