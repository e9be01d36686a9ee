/* A huge MAP_NORESERVE reservation (wasm runtimes, GC heaps, sanitizer shadows): 16 TiB, of which
 * 256 MiB are written in order and one byte per GiB, then it is unmapped. Prints what it
 * checked; VmRSS before the mmap, after the writes and after the munmap goes to stderr as
 * "rss_before_kb=N", "rss_after_kb=N" and "rss_unmapped_kb=N". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "measure.h"

int main(void) {
    size_t len = (size_t)16 << 40, gib = (size_t)1 << 30, seq = 256u << 20;
    long before = rss_kb();
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { perror("mmap 16 TiB"); return 1; }
    long bad = 0;
    for (size_t i = 0; i < len; i += gib) {
        bad += p[i + 123] != 0;
        p[i] = 1;
    }
    for (size_t i = 0; i < seq; i += 4096) {
        bad += p[gib + 4096 + i + 7] != 0;
        p[gib + 4096 + i] = 2;
    }
    for (size_t i = 0; i < len; i += gib) bad += p[i] != 1;
    for (size_t i = 0; i < seq; i += 4096) bad += p[gib + 4096 + i] != 2;
    long after = rss_kb();
    if (munmap(p, len)) { perror("munmap"); return 1; }
    printf("16 TiB MAP_NORESERVE: wrote 256 MiB in order and one byte per GiB, bad=%ld, unmapped\n", bad);
    fprintf(stderr, "rss_before_kb=%ld\nrss_after_kb=%ld\nrss_unmapped_kb=%ld\n", before, after, rss_kb());
    return bad ? 1 : 0;
}
