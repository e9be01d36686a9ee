/* malloc MIB MiB and write one byte per page: a program to run under limits (RLIMIT_AS) and
 * odd settings. Prints what it did; exit 3 if malloc failed. */
#include <stdio.h>
#include <stdlib.h>

/* The writes are made for real: the compiler may not drop stores to a block freed next. */
static void keep(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: eatmem MIB\n"); return 2; }
    size_t mib = strtoul(argv[1], NULL, 10), len = mib << 20;
    unsigned char *p = malloc(len);
    printf("malloc(%zu MiB): %s\n", mib, p ? "ok" : "NULL");
    if (!p) return 3;
    long bad = 0;
    for (size_t i = 0; i < len; i += 4096) {
        bad += p[i + 7] != 0;
        p[i] = 1;
    }
    keep(p);
    printf("wrote %zu MiB: bad=%ld\n", mib, bad);
    free(p);
    return bad ? 1 : 0;
}
