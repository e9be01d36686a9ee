/* Frees what is not a live block of malloc, after printing the pointer it passes to free:
 *
 *   badfree double   frees a 16 MiB block twice
 *   badfree inner    frees a pointer 4 KiB inside a 16 MiB block
 *
 * (16 MiB: the shim's engine, whose arena the block comes from, starts at that much.)
 *
 * glibc kills the program in free (abort, or SIGSEGV when the chunk's header is unmapped
 * already); it must never come back from that free. If it does, it says so and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    int inner = argc == 2 && !strcmp(argv[1], "inner");
    if (argc != 2 || (!inner && strcmp(argv[1], "double"))) {
        fprintf(stderr, "usage: badfree double|inner\n");
        return 2;
    }
    size_t len = 16u << 20;
    unsigned char *a = malloc(len);
    if (!a) return 1;
    memset(a, 0xAA, len);
    /* volatile: the compiler is not to see (and refuse) the bad free. */
    unsigned char *volatile bad = inner ? a + 4096 : a;
    if (!inner) free(a);
    printf("freeing %p\n", (void *)bad);
    free(bad);
    printf("free(%p) returned\n", (void *)bad);
    return 0;
}
