/* Crypto-style use of a large buffer: calloc it, mlock it, write a secret into it, free it
 * without munlock (glibc unmaps the chunk, which unlocks it), then calloc the same size again:
 * the new block must read zero, whatever memory it reuses. Three rounds, 8 MiB to 32 MiB.
 * Prints how many bytes of each new block were not zero; exit 1 if any. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The secret is written for real: the compiler may not drop stores to a block freed next. */
static void keep(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

int main(void) {
    long leaked = 0;
    for (int round = 0; round < 3; round++) {
        size_t len = (size_t)8 << (20 + round);
        unsigned char *a = calloc(1, len);
        if (!a) return 2;
        if (mlock(a, len)) perror("mlock");
        memset(a, 0x5A, len);
        keep(a);
        free(a);
        unsigned char *b = calloc(1, len);
        if (!b) return 2;
        long nz = 0;
        for (size_t i = 0; i < len; i++) nz += b[i] != 0;
        printf("round %d: calloc(%zu MiB) after free of a locked block: %ld bytes not zero\n", round, len >> 20,
               nz);
        leaked += nz;
        free(b);
    }
    return leaked ? 1 : 0;
}
