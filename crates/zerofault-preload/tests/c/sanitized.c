/* A program built with a sanitizer (-fsanitize=address, thread, leak or undefined; the runtime
 * shared or linked in) that makes large requests, as a program the shim would serve does:
 *
 *   sanitized          mallocs, callocs and maps blocks well above the shim's 2 MiB threshold,
 *                      writes and reads them back (in two threads too), frees and unmaps them,
 *                      and prints "checksum N" (the same N whatever the sanitizer)
 *   sanitized SCRIPT   the same (the program as a script's #! interpreter: SCRIPT is ignored)
 *   sanitized bug      does what the sanitizer is there to catch: writes one byte past a
 *                      malloc'd block (ASan) while two threads write one word unsynchronised
 *                      (TSan); the sanitizer reports it, and exits as it exits for it
 *
 * A sanitizer's runtime replaces malloc and the mmap family: the shim must stay out of its
 * process and leave everything to it (no crash, the same output and exit status, the report
 * the sanitizer makes natively). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MB ((size_t)1 << 20)

static void *worker(void *a) {
    size_t n = 4 * MB;
    unsigned char *p = malloc(n);
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31 + (size_t)a);
    unsigned long s = 0;
    for (size_t i = 0; i < n; i += 64)
        s += p[i];
    free(p);
    return (void *)s;
}

static int shared_word;

static void *racer(void *a) {
    shared_word++;
    return a;
}

static int bug(void) {
    pthread_t t;
    pthread_create(&t, NULL, racer, NULL);
    shared_word++;
    pthread_join(t, NULL);
    /* volatile: the compiler is not to drop the write past the end (nor the block's free). */
    volatile size_t n = 10;
    volatile char *p = malloc(n);
    p[n] = 1;
    free((void *)p);
    printf("bug done\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "bug"))
        return bug();
    if (argc > 2) {
        fprintf(stderr, "usage: sanitized [bug|SCRIPT]\n");
        return 2;
    }
    unsigned long total = 0;
    for (int r = 0; r < 4; r++) {
        unsigned char *p = malloc(64 * MB);
        if (!p)
            return 1;
        memset(p, r + 1, 64 * MB);
        for (size_t i = 0; i < 64 * MB; i += 4096)
            total += p[i];
        free(p);
        unsigned char *c = calloc(1, 32 * MB);
        if (!c)
            return 1;
        for (size_t i = 0; i < 32 * MB; i += 4096)
            total += c[i];
        free(c);
        unsigned char *m = mmap(NULL, 8 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return 1;
        memset(m, 2, 8 * MB);
        for (size_t i = 0; i < 8 * MB; i += 4096)
            total += m[i];
        munmap(m, 8 * MB);
    }
    pthread_t t[2];
    void *rv;
    for (long i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], &rv);
        total += (unsigned long)rv;
    }
    printf("checksum %lu\n", total);
    return 0;
}
