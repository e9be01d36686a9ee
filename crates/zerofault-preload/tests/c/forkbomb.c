/* forkbomb EARLY LATE MIB HOLD_MS: processes sharing one memory cgroup. EARLY children are
 * forked at once, each mallocs MIB MiB and writes every page, then waits; HOLD_MS later (time
 * for their engines to fill pools beside them) LATE more are forked at once and do the same.
 * Then every child checks its block and exits. Run in a memory cgroup that holds all the
 * blocks with a little to spare: natively no child is killed; the engines' pools must give
 * way to the late children's faults, or the cgroup's OOM killer kills one.
 * Prints "children N: ok K, killed K (last signal S), other K"; exit 1 unless all ended well. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The writes are made for real: the compiler may not drop stores it thinks nobody reads. */
static void keep(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

/* One ready pipe a phase: the parent reads to the end of each, however its children end. */
static int ready[2], go[2];

static void child(int i, size_t len) {
    close(ready[0]);
    close(go[1]);
    unsigned char *b = malloc(len);
    if (!b) _exit(4);
    for (size_t j = 0; j < len; j += 4096) b[j] = (unsigned char)(i + (j >> 12));
    keep(b);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(5);
    close(ready[1]);
    /* Until the parent closes its end: every child is alive at once. */
    while (read(go[0], &c, 1) > 0) {}
    for (size_t j = 0; j < len; j += 4096)
        if (b[j] != (unsigned char)(i + (j >> 12))) _exit(3);
    _exit(0);
}

/* Forks `n` children numbered from `first`, then waits until each has written its block (or
 * died); returns how many were forked. */
static int phase(int first, int n, size_t len) {
    if (pipe(ready)) { perror("pipe"); return 0; }
    int forked = 0;
    for (; forked < n; forked++) {
        pid_t p = fork();
        if (p == 0) child(first + forked, len);
        if (p < 0) { perror("fork"); break; }
    }
    close(ready[1]);
    char buf[256];
    while (read(ready[0], buf, sizeof buf) > 0) {}
    close(ready[0]);
    return forked;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: forkbomb EARLY LATE MIB HOLD_MS\n"); return 2; }
    int early = atoi(argv[1]), late = atoi(argv[2]);
    size_t len = strtoul(argv[3], NULL, 10) << 20;
    long hold = atol(argv[4]);
    if (pipe(go)) { perror("pipe"); return 2; }
    phase(0, early, len);
    struct timespec t = {hold / 1000, (hold % 1000) * 1000000L};
    nanosleep(&t, NULL);
    phase(early, late, len);
    close(go[1]);
    int ok = 0, killed = 0, other = 0, sig = 0, st;
    while (wait(&st) > 0) {
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
        else if (WIFSIGNALED(st)) { killed++; sig = WTERMSIG(st); }
        else other++;
    }
    printf("children %d: ok %d, killed %d (last signal %d), other %d\n", early + late, ok, killed, sig, other);
    return ok == early + late ? 0 : 1;
}
