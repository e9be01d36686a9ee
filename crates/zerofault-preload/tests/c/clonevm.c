/* A process that shares the memory: clone(CLONE_VM | SIGCHLD) without CLONE_THREAD, whose child
 * outlives its parent.
 *
 *   clonevm MODE   MODE is how the parent ends after the clone:
 *                  wait   waits for the child (nobody outlives anybody)
 *                  exit   returns from its function (exit(3): destructors run)
 *                  _exit  _exit(2): no destructor runs
 *                  kill   SIGKILL to itself: no code of its own runs
 *                  files  as _exit, but the child was cloned with CLONE_FILES too (it shares
 *                         the descriptor table)
 *                  files-first  as files, but the clone comes before the first large request
 *                         (the block is malloc'd after it, the child waits for it)
 *
 * The program forks a scenario process and reports for it. The scenario starts the engine
 * with a first large request, mallocs 256 MiB it never touches and clones the child; the child
 * waits until its parent is gone (except in "wait"), then writes 128 MiB of that block, checks
 * it, and reports through a pipe. The outer process prints the reports and how the scenario's
 * parent ended; a child that does not report within 20 s is reported stuck (exit 1), and
 * whatever is left of it dies with the test's process group. Natively every mode reports
 * "child: wrote 128 MiB, bad 0". */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MB ((size_t)1 << 20)

static unsigned char *volatile blk;
static int report_fd;
static pid_t parent;
static int wait_parent;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int child(void *arg) {
    (void)arg;
    /* Until the parent is gone (reparented), at most 5 s; then the block must be there. */
    for (double t0 = now(); wait_parent && getppid() == parent && now() - t0 < 5;)
        usleep(1000);
    if (!blk) {
        dprintf(report_fd, "child: no block\n");
        return 1;
    }
    size_t len = 128 * MB, bad = 0;
    for (size_t i = 0; i < len; i += 4096)
        blk[i] = (unsigned char)(i >> 12 | 1);
    for (size_t i = 0; i < len; i += 4096)
        bad += blk[i] != (unsigned char)(i >> 12 | 1);
    dprintf(report_fd, "child: wrote 128 MiB, bad %zu\n", bad);
    return 0;
}

static void scenario(const char *mode) {
    int first = !strcmp(mode, "files-first");
    size_t st = MB;
    char *stack = mmap(NULL, st, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    char *w = NULL;
    if (!first) {
        w = malloc(32 * MB);
        memset(w, 1, 32 * MB); /* the engine starts */
        blk = malloc(256 * MB);
    }
    parent = getpid();
    wait_parent = strcmp(mode, "wait") != 0;
    int flags = CLONE_VM | SIGCHLD | (strncmp(mode, "files", 5) ? 0 : CLONE_FILES);
    pid_t pid = stack == MAP_FAILED ? -1 : clone(child, stack + st, flags, NULL);
    if (pid < 0) {
        dprintf(report_fd, "scenario: clone: %s\n", strerror(errno));
        _exit(2);
    }
    if (first) {
        w = malloc(32 * MB);
        memset(w, 1, 32 * MB); /* the engine would start here */
        blk = malloc(256 * MB);
    }
    if (!w || !blk) {
        dprintf(report_fd, "scenario: no memory\n");
        _exit(2);
    }
    if (!strcmp(mode, "wait")) {
        int status;
        waitpid(pid, &status, 0);
        dprintf(report_fd, "parent: child status %d\n", status);
        exit(0);
    }
    if (!strcmp(mode, "exit"))
        exit(0);
    if (!strcmp(mode, "kill"))
        raise(SIGKILL);
    _exit(0);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "wait";
    setvbuf(stdout, NULL, _IONBF, 0);
    int p[2];
    if (pipe(p) != 0)
        return 2;
    pid_t s = fork();
    if (s == 0) {
        close(p[0]);
        report_fd = p[1];
        scenario(mode);
    }
    close(p[1]);
    /* Reports until every writer is gone (the scenario's parent and its child), 20 s at most. */
    char buf[4096];
    size_t got = 0;
    int stuck = 1;
    for (double t0 = now(); now() - t0 < 20;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t n = read(p[0], buf + got, sizeof buf - 1 - got);
        if (n <= 0) {
            stuck = 0;
            break;
        }
        got += n;
    }
    buf[got] = 0;
    fputs(buf, stdout);
    int status;
    waitpid(s, &status, 0);
    if (WIFSIGNALED(status))
        printf("scenario: killed by signal %d\n", WTERMSIG(status));
    else
        printf("scenario: exit %d\n", WEXITSTATUS(status));
    if (stuck || !strstr(buf, "child: wrote 128 MiB, bad 0")) {
        printf("child: no report in 20 s (stuck)\n");
        return 1;
    }
    return 0;
}
