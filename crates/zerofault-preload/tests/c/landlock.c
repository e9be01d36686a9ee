/* The program confines itself with Landlock after its first large request: NO_NEW_PRIVS, then
 * a ruleset that handles every filesystem access of ABI 1 and allows none, through libc's
 * syscall() (glibc has no wrapper). A Landlock domain is per thread: the engine's threads must
 * be in it too. It prints what it saw; natively and under the shim the lines must be the same.
 *
 * How a thread's domain is seen from outside it: a process in a domain may read the memory
 * (process_vm_readv) only of a thread in the same domain or one nested in it. So a helper
 * started before the restriction (outside the domain) lists the process's other threads
 * afterwards, and a child forked after it (inside) reads a word through each: a thread left
 * outside the domain refuses it (EPERM). The number of threads goes to stderr.
 *
 *   landlock */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define BIG (64 * MIB)
#define MAX_TIDS 64

static volatile uint64_t word = 0x5a5a5a5a5a5a5a5aULL;

/* A fresh large block, each page written then checked; the number of pages that read wrong. */
static long write_and_check(unsigned char seed) {
    unsigned char *b = malloc(BIG);
    long bad = 0;
    if (!b)
        exit(90);
    for (size_t i = 0; i < BIG; i += 4096)
        b[i] = (unsigned char)(seed + i / 4096);
    __asm__ volatile("" : : "r"(b) : "memory");
    for (size_t i = 0; i < BIG; i += 4096)
        bad += b[i] != (unsigned char)(seed + i / 4096);
    free(b);
    return bad;
}

/* The helper, outside the domain: on a byte from `go`, writes the ids of `pid`'s threads but
 * its main one to `out`, a count first. */
static void list_threads(pid_t pid, int go, int out) {
    char c, dir[64];
    if (read(go, &c, 1) != 1)
        _exit(1);
    int tids[MAX_TIDS], n = 0;
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && n < MAX_TIDS)
        if (e->d_name[0] != '.' && atoi(e->d_name) != pid)
            tids[n++] = atoi(e->d_name);
    if (write(out, &n, sizeof n) != sizeof n || write(out, tids, sizeof tids[0] * n) != (ssize_t)(sizeof tids[0] * n))
        _exit(1);
    _exit(0);
}

/* In a child inside the domain: how many of `tids` refuse a read of `word`. */
static int refused_by(const int *tids, int n) {
    int refused = 0;
    for (int i = 0; i < n; i++) {
        uint64_t got = 0;
        struct iovec here = {&got, sizeof got}, there = {(void *)&word, sizeof word};
        if (syscall(SYS_process_vm_readv, tids[i], &here, 1, &there, 1, 0) != sizeof got) {
            if (errno == ESRCH)
                continue; /* gone meanwhile */
            fprintf(stderr, "thread %d: %s\n", tids[i], strerror(errno));
            refused++;
        }
    }
    return refused;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    long bad = write_and_check(1);
    int go[2], back[2];
    if (pipe(go) || pipe(back))
        return 91;
    pid_t me = getpid(), helper = fork();
    if (helper == 0)
        list_threads(me, go[0], back[1]);

    struct landlock_ruleset_attr attr = {.handled_access_fs = (1ULL << 13) - 1}; /* ABI 1 */
    int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    int nnp = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    long r = syscall(SYS_landlock_restrict_self, rs, 0);
    printf("ruleset %s, no_new_privs %d, landlock_restrict_self %ld\n", rs >= 0 ? "made" : strerror(errno), nnp, r);
    int fd = open("/proc/self/status", O_RDONLY);
    printf("open(/proc/self/status): %s\n", fd < 0 ? strerror(errno) : "opened");
    for (int k = 0; k < 4; k++)
        bad += write_and_check((unsigned char)(k + 2));
    printf("pages read wrong: %ld\n", bad);

    int n = 0, tids[MAX_TIDS];
    if (write(go[1], "x", 1) != 1 || read(back[0], &n, sizeof n) != sizeof n || n < 0 || n > MAX_TIDS ||
        read(back[0], tids, sizeof tids[0] * n) != (ssize_t)(sizeof tids[0] * n))
        return 92;
    waitpid(helper, NULL, 0);
    fprintf(stderr, "other threads %d\n", n);
    pid_t inside = fork();
    if (inside == 0)
        _exit(refused_by(tids, n));
    int st;
    waitpid(inside, &st, 0);
    printf("threads outside the domain: %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}
