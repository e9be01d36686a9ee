/* A daemon's shutdown path: SIGTERM blocked and read from a signalfd, 20 times.
 *
 *   signalfd        each SIGTERM comes from outside: prints "waiting for SIGTERM k" before the
 *                   k-th read, so that the sender sends one at a time (they would merge)
 *   signalfd self   sends each to itself with kill(getpid()), a process-directed signal
 *
 * A large block is written before SIGTERM is blocked (threads started for it then must not take
 * the signal either) and another after. Exits 0 after reading 20 SIGTERMs; a thread of the
 * process that does not block SIGTERM takes it instead and the process dies of it (143). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <unistd.h>

/* The writes are made for real: the compiler may not drop stores to a block freed later. */
static void keep(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static long touch(unsigned char *p, size_t len) {
    long bad = 0;
    for (size_t i = 0; i < len; i += 4096) {
        if (p[i + 1]) bad++;
        p[i] = 1;
    }
    keep(p);
    return bad;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int self = argc > 1 && !strcmp(argv[1], "self");
    size_t len = 64u << 20;
    unsigned char *a = malloc(len);
    if (!a) return 1;
    long bad = touch(a, len);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigprocmask(SIG_BLOCK, &s, NULL);
    int fd = signalfd(-1, &s, SFD_CLOEXEC);
    if (fd < 0) { perror("signalfd"); return 1; }
    unsigned char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 1;
    bad += touch(b, len);
    for (int i = 1; i <= 20; i++) {
        if (self) kill(getpid(), SIGTERM);
        else printf("waiting for SIGTERM %d\n", i);
        struct signalfd_siginfo si;
        if (read(fd, &si, sizeof si) != sizeof si || si.ssi_signo != SIGTERM) {
            printf("read %d failed\n", i);
            return 2;
        }
    }
    printf("got 20 SIGTERMs through the signalfd, bad=%ld\n", bad);
    free(a);
    return bad ? 1 : 0;
}
