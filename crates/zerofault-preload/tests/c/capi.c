/* Uses the C API: map engine memory, check it reads zero, write it, read the stats as JSON. */
#include "zerofault.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t len = 64u << 20;
    unsigned char *p = zerofault_map(len);
    if (!p) { perror("zerofault_map"); return 1; }
    for (size_t i = 0; i < len; i += 4096)
        if (p[i + 100] != 0) { fprintf(stderr, "page %zu not zero\n", i / 4096); return 2; }
    for (size_t i = 0; i < len; i += 4096) p[i] = (unsigned char)(i >> 12);
    unsigned long sum = 0;
    for (size_t i = 0; i < len; i += 4096) sum += p[i];
    /* Recycle the second half: it reads zero, the first half keeps its bytes, and the half
     * is served again. */
    if (zerofault_recycle(p + len / 2, len / 2) != 0) { perror("zerofault_recycle"); return 6; }
    for (size_t i = 0; i < len / 2; i += 4096)
        if (p[i] != (unsigned char)(i >> 12)) { fprintf(stderr, "page %zu lost\n", i / 4096); return 7; }
    for (size_t i = len / 2; i < len; i += 4096)
        if (p[i] != 0 || p[i + 4095] != 0) { fprintf(stderr, "page %zu not zero after recycle\n", i / 4096); return 8; }
    for (size_t i = len / 2; i < len; i += 4096) p[i] = (unsigned char)(i >> 12);
    if (zerofault_recycle(p + 1, 4096) != -1) return 9; /* unaligned: EINVAL */
    size_t need = zerofault_stats_json(NULL, 0);
    char *buf = malloc(need + 1);
    if (zerofault_stats_json(buf, need + 1) != need || strlen(buf) != need) return 3;
    char small[8];
    zerofault_stats_json(small, sizeof small);
    if (strlen(small) != sizeof small - 1) return 4;
    if (zerofault_unmap(p, len) != 0) { perror("zerofault_unmap"); return 5; }
    printf("active=%d sum=%lu\n%s\n", zerofault_active(), sum, buf);
    free(buf);
    return 0;
}
