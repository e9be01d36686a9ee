/* One block grown with realloc from 64 KiB to 256 MiB in 64 KiB steps (a growing buffer), the
 * new part written at each step and a sample of the old contents checked. Prints the final size,
 * a checksum of the whole block and the number of errors. Natively glibc grows the mapping in
 * place with mremap: about 0.2 s.
 *
 *   regrow [realloc|malloc|calloc]   the first block from realloc(NULL) (the default), malloc
 *                                    or calloc (4 MiB, already past the shim's threshold) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEP ((size_t)64 << 10)

static unsigned char pat(size_t i) { return (unsigned char)(i ^ i >> 8 ^ i >> 16 ^ i >> 24); }

int main(int argc, char **argv) {
    size_t max = (size_t)256 << 20, len = 0;
    unsigned char *p = NULL;
    const char *first = argc > 1 ? argv[1] : "realloc";
    if (strcmp(first, "realloc")) {
        len = (size_t)4 << 20;
        p = strcmp(first, "calloc") ? malloc(len) : calloc(len, 1);
        if (!p) { printf("%s failed\n", first); return 1; }
        for (size_t i = 0; i < len; i++) p[i] = pat(i);
    }
    long errors = 0, steps = 0;
    uint64_t s = 88172645463325252ull;
    while (len < max) {
        unsigned char *q = realloc(p, len + STEP);
        if (!q) { printf("realloc(%zu) failed\n", len + STEP); return 1; }
        p = q;
        steps++;
        for (int k = 0; k < 16 && len; k++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            size_t i = k ? s % len : len - 1;
            errors += p[i] != pat(i);
        }
        for (size_t i = len; i < len + STEP; i++) p[i] = pat(i);
        len += STEP;
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        sum = (sum ^ w) * 0x100000001B3ull;
    }
    printf("grew to %zu bytes in %ld reallocs: checksum %016llx, errors %ld\n", len, steps, (unsigned long long)sum,
           errors);
    free(p);
    return errors ? 1 : 0;
}
