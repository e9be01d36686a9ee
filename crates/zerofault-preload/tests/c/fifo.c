/* Real-time threads, after the program's first large request. A fault of a real-time thread
 * must not wait behind the real-time threads of its CPU for a handler of normal priority: the
 * kernel serves it at once. Each mode prints what it saw; natively and under the shim the
 * lines must be the same (`main` also reports its time on stderr, `write_s=`).
 *
 *   fifo main      (under `taskset -c 0`, root) makes itself SCHED_FIFO 10, starts a SCHED_FIFO
 *                  10 thread that spins for 1 s, then writes 256 MiB of fresh memory: natively
 *                  the spinner runs after the write, which takes a tenth of a second
 *   fifo thread    starts a SCHED_FIFO thread (an explicit attribute) that writes 64 MiB
 *   fifo setattr   sched_setattr(SCHED_RR) through syscall(), then writes 64 MiB
 *   fifo outside   `chrt -f -p 10 PID` from another process, waits, then writes 64 MiB */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* A fresh block of `len` bytes, one byte a page written and checked: the pages that read wrong. */
static long write_fresh(size_t len) {
    unsigned char *b = malloc(len);
    long bad = 0;
    if (!b)
        exit(90);
    for (size_t i = 0; i < len; i += 4096)
        b[i] = 1;
    __asm__ volatile("" : : "r"(b) : "memory");
    for (size_t i = 0; i < len; i += 4096)
        bad += b[i] != 1;
    free(b);
    return bad;
}

static void *spin(void *arg) {
    double t0 = now();
    while (now() - t0 < 1.0)
        ;
    return arg;
}

static void *writer(void *arg) {
    *(long *)arg = write_fresh(64 * MIB);
    return NULL;
}

/* `struct sched_attr`, its first version. */
struct attr {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    long bad = write_fresh(64 * MIB);
    struct sched_param sp = {.sched_priority = 10};
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setinheritsched(&at, PTHREAD_EXPLICIT_SCHED);
    pthread_attr_setschedpolicy(&at, SCHED_FIFO);
    pthread_attr_setschedparam(&at, &sp);
    pthread_t t;
    if (!strcmp(mode, "main")) {
        printf("sched_setscheduler: %d\n", sched_setscheduler(0, SCHED_FIFO, &sp));
        printf("pthread_create: %d\n", pthread_create(&t, &at, spin, NULL));
        double t0 = now();
        bad += write_fresh(256 * MIB);
        fprintf(stderr, "write_s=%.3f\n", now() - t0);
        pthread_join(t, NULL);
    } else if (!strcmp(mode, "thread")) {
        long wrong = -1;
        printf("pthread_create: %d\n", pthread_create(&t, &at, writer, &wrong));
        pthread_join(t, NULL);
        bad += wrong;
    } else if (!strcmp(mode, "setattr")) {
        struct attr a = {.size = sizeof a, .policy = SCHED_RR, .priority = 10};
        printf("sched_setattr: %ld\n", syscall(SYS_sched_setattr, 0, &a, 0));
        bad += write_fresh(64 * MIB);
    } else if (!strcmp(mode, "outside")) {
        char pid[16];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        pid_t c = fork();
        if (c == 0) {
            execlp("chrt", "chrt", "-f", "-p", "10", pid, (char *)NULL);
            _exit(127);
        }
        int st;
        printf("chrt: %d\n", waitpid(c, &st, 0) == c && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        usleep(400000); /* longer than the engine's periodic look */
        bad += write_fresh(64 * MIB);
    } else {
        fprintf(stderr, "usage: fifo main | thread | setattr | outside\n");
        return 2;
    }
    printf("policy now %d; pages read wrong: %ld\n", sched_getscheduler(0), bad);
    return 0;
}
