/* Strict overcommit (vm.overcommit_memory=2, set by the test), round 3's r_commit: a first
 * large block (32 MiB, written: it starts the engine under the shim), then a mapping of 85% of
 * the commit left at the start, then a 256 MiB malloc.
 *
 *   commit
 *
 * Prints "first block ok, mmap ok, malloc ok" (NULL or the error where one failed), and to
 * stderr charged_kb=N: the process's writable private mappings after the first block, which
 * are what mode 2 charges (Committed_AS is machine-wide, and per-CPU batches make it swing by
 * ~100 MB between two reads). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "measure.h"

/* The size of this process's writable private mappings, in kB: what mode 2 charges it. */
static long writable_private_kb(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char l[512];
    long kb = 0;
    unsigned long a, b;
    char perms[8];
    while (f && fgets(l, sizeof l, f))
        if (sscanf(l, "%lx-%lx %7s", &a, &b, perms) == 3 && perms[1] == 'w' && perms[3] == 'p')
            kb += (long)((b - a) >> 10);
    if (f)
        fclose(f);
    return kb;
}

int main(void) {
    long lim = field_kb("/proc/meminfo", "CommitLimit:"), c0 = field_kb("/proc/meminfo", "Committed_AS:");
    size_t want = (size_t)((lim - c0) * 0.85) * 1024;
    char *w = malloc(32 << 20);
    if (w)
        memset(w, 1, 32 << 20);
    __asm__ volatile("" : : "r"(w) : "memory");
    fprintf(stderr, "charged_kb=%ld\n", writable_private_kb());
    void *m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const char *mm = m == MAP_FAILED ? strerror(errno) : "ok";
    char *b = malloc(256 << 20);
    printf("first block %s, mmap %s, malloc %s\n", w ? "ok" : "NULL", mm, b ? "ok" : "NULL");
    if (m != MAP_FAILED)
        munmap(m, want);
    free(b);
    free(w);
    return 0;
}
