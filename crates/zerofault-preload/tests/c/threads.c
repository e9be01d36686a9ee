/* Threads that allocate and touch large blocks while a 1 ms interval timer interrupts them with
 * SIGALRM; a thread made before the blocks exist, others after. Prints checksums and whether
 * signals arrived; the output must not depend on the shim. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static volatile sig_atomic_t ticks;
static unsigned long sums[4];
static void on_alarm(int sig) { (void)sig; ticks++; }

static void *work(void *arg) {
    size_t id = (size_t)arg, len = (size_t)(32 + 16 * id) << 20;
    unsigned long sum = 0;
    for (int round = 0; round < 3; round++) {
        unsigned char *p = round == 1 ? calloc(1, len) : malloc(len);
        if (!p) return (void *)1;
        if (round != 1) memset(p, 0, len);
        for (size_t i = 0; i < len; i += 4096) p[i] = (unsigned char)(id + i / 4096 + round);
        p = realloc(p, len + (8u << 20));
        for (size_t i = 0; i < len; i += 4096) sum += p[i];
        for (size_t i = len; i < len + (8u << 20); i += 4096) sum += p[i] == 0 ? 0 : 1000000;
        free(p);
    }
    sums[id] = sum;
    return NULL;
}

int main(void) {
    signal(SIGALRM, on_alarm);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
    pthread_t early;
    pthread_create(&early, NULL, work, (void *)0);
    pthread_join(early, NULL);
    pthread_t t[3];
    for (size_t i = 0; i < 3; i++) pthread_create(&t[i], NULL, work, (void *)(i + 1));
    for (size_t i = 0; i < 3; i++) pthread_join(t[i], NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    for (int i = 0; i < 4; i++) printf("thread %d: %lu\n", i, sums[i]);
    printf("signals arrived: %s\n", ticks > 0 ? "yes" : "no");
    return 0;
}
