/* Four threads make their first large request at once: each mallocs 32 MiB and writes one
 * byte per 4 KiB page. Under the shim every one of them is served by the engine (the first
 * loads the shim; the others wait for it). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 4
#define LEN ((size_t)32 << 20)

static pthread_barrier_t go;

static void *run(void *arg) {
    (void)arg;
    pthread_barrier_wait(&go);
    unsigned char *p = malloc(LEN);
    if (!p)
        return NULL;
    for (size_t i = 0; i < LEN; i += 4096)
        p[i] = 1;
    return p; /* used by main: the compiler may not drop the block and its writes */
}

int main(void) {
    pthread_t t[THREADS];
    pthread_barrier_init(&go, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, run, NULL);
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        unsigned char *r;
        pthread_join(t[i], (void **)&r);
        size_t sum = 0;
        for (size_t j = 0; r && j < LEN; j += 4096)
            sum += r[j];
        bad += sum != LEN / 4096;
        free(r);
    }
    printf("first large requests: %d threads, %d failed\n", THREADS, bad);
    return bad != 0;
}
