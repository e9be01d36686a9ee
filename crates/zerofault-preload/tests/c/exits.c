/* Exits: how long until the process is gone, and what it is like to end with faults in flight.
 *
 *   exits loop MiB ROUNDS   ROUNDS times: mmap MiB, write every page, munmap; return from main
 *   exits hold MiB          mmap MiB, write every page, print "ready", wait to be killed
 *   exits during HOW        two threads fault fresh memory without a pause (one maps, checks
 *                           every page reads zero, writes it and unmaps 8 MiB; one does the same
 *                           through calloc and free of 4 MiB); after four rounds of the
 *                           first and 20 ms more, main ends the process by HOW: return (from main), exit, _exit, signal (SIGTERM,
 *                           default action), exec (of /bin/true), fork (a child that faults
 *                           like the parent, then returns; the parent waits for it and passes
 *                           its status on). A page that does not read zero: "bad", status 3.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>

static char *written(size_t len) {
    char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    for (size_t i = 0; i < len; i += 4096) p[i] = 1;
    return p;
}

static void check_and_write(volatile char *p, size_t len) {
    for (size_t i = 0; i < len; i += 4096) {
        if (p[i] != 0) {
            static const char bad[] = "bad\n";
            write(2, bad, sizeof bad - 1);
            _exit(3);
        }
        p[i] = 1;
    }
}

/* Rounds the mapper finished. */
static int rounds;

static void *mapper(void *arg) {
    (void)arg;
    for (size_t len = 8 << 20;;) {
        char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); _exit(1); }
        check_and_write(p, len);
        munmap(p, len);
        __atomic_add_fetch(&rounds, 1, __ATOMIC_RELEASE);
    }
    return 0;
}

static void *callocer(void *arg) {
    (void)arg;
    for (size_t len = 4 << 20;;) {
        char *p = calloc(1, len);
        if (!p) { perror("calloc"); _exit(1); }
        check_and_write(p, len);
        free(p);
    }
    return 0;
}

static void faulters(void) {
    pthread_t t;
    if (pthread_create(&t, 0, mapper, 0) || pthread_create(&t, 0, callocer, 0)) {
        perror("pthread_create");
        _exit(1);
    }
    /* Four rounds (32 MiB: past the shim's start_after, the engine serves), then 20 ms more. */
    __atomic_store_n(&rounds, 0, __ATOMIC_RELEASE);
    while (__atomic_load_n(&rounds, __ATOMIC_ACQUIRE) < 4) usleep(1000);
    usleep(20000);
}

static int during(const char *how) {
    faulters();
    if (!strcmp(how, "return")) return 0;
    if (!strcmp(how, "exit")) exit(0);
    if (!strcmp(how, "_exit")) _exit(0);
    if (!strcmp(how, "signal")) { raise(SIGTERM); return 1; }
    if (!strcmp(how, "exec")) { execl("/bin/true", "true", (char *)0); perror("exec"); return 1; }
    if (!strcmp(how, "fork")) {
        pid_t c = fork();
        if (c < 0) { perror("fork"); return 1; }
        if (c == 0) { faulters(); return 0; }
        int st;
        if (waitpid(c, &st, 0) != c) { perror("waitpid"); return 1; }
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    fprintf(stderr, "exits during: return|exit|_exit|signal|exec|fork, not %s\n", how);
    return 2;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "during")) return during(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "loop")) {
        size_t len = strtoul(argv[2], 0, 10) << 20;
        for (int r = atoi(argv[3]); r > 0; r--) munmap(written(len), len);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "hold")) {
        written(strtoul(argv[2], 0, 10) << 20);
        printf("ready\n");
        fflush(stdout);
        for (;;) pause();
    }
    fprintf(stderr, "usage: exits loop MiB ROUNDS | exits hold MiB | exits during HOW\n");
    return 2;
}
