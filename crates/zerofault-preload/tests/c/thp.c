/* Maps 1 GiB (2 MiB aligned), asks for transparent huge pages (MADV_HUGEPAGE) and writes one
 * byte per 4 KiB page, in order. Prints what it checked; the mapping's AnonHugePages (summed
 * over its VMAs in /proc/self/smaps) and the process's VmRSS go to stderr as "anon_huge_kb=N"
 * and "rss_kb=N". */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "smaps.h"
#include "measure.h"

#define HUGE ((size_t)2 << 20)


int main(void) {
    size_t len = (size_t)1 << 30;
    unsigned char *raw = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) { perror("mmap"); return 1; }
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + HUGE - 1) & ~(HUGE - 1));
    if (madvise(p, len, MADV_HUGEPAGE)) { perror("madvise"); return 1; }
    long bad = 0;
    for (size_t i = 0; i < len; i += 4096) {
        bad += p[i + 11] != 0;
        p[i] = (unsigned char)(i >> 12 | 1);
    }
    for (size_t i = 0; i < len; i += 4096) bad += p[i] != (unsigned char)(i >> 12 | 1);
    printf("wrote 1 GiB with MADV_HUGEPAGE: bad=%ld\n", bad);
    fprintf(stderr, "anon_huge_kb=%ld\nrss_kb=%ld\n", anon_huge_kb(p, p + len), rss_kb());
    return bad ? 1 : 0;
}
