/* A seccomp filter that makes ioctl(2) and userfaultfd(2) fail with EPERM, as a sandbox might.
 *
 *   seccomp after MIB        writes a 64 MiB block (whatever serves faults is running), maps MIB
 *                            MiB, installs the filter on every thread of the process (TSYNC),
 *                            then writes the MIB MiB and a fresh malloc'ed block of MIB MiB: all
 *                            must read zero first and keep what was written
 *   seccomp exec PROG ARGS   installs the filter on itself, then execs PROG (which starts under it)
 *
 * Prints what it did; exit 0 when every byte checked. */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int install(unsigned flags) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_userfaultfd, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

static long touch(unsigned char *p, size_t len, unsigned char v) {
    long bad = 0;
    for (size_t i = 0; i < len; i += 4096) {
        if (p[i + 5]) bad++;
        p[i] = v;
    }
    for (size_t i = 0; i < len; i += 4096) bad += p[i] != v;
    return bad;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 2 && !strcmp(argv[1], "exec")) {
        if (install(0)) { perror("seccomp"); return 1; }
        execv(argv[2], argv + 2);
        perror("exec");
        return 127;
    }
    if (argc != 3 || strcmp(argv[1], "after")) {
        fprintf(stderr, "usage: seccomp after MIB | seccomp exec PROG ARGS\n");
        return 2;
    }
    size_t len = strtoul(argv[2], NULL, 10) << 20;
    unsigned char *a = malloc(64u << 20);
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!a || p == MAP_FAILED) return 1;
    long bad = touch(a, 64u << 20, 1);
    if (install(SECCOMP_FILTER_FLAG_TSYNC)) { perror("seccomp"); return 1; }
    printf("filter installed on every thread\n");
    bad += touch(p, len, 2);
    unsigned char *b = malloc(len);
    if (!b) { printf("malloc after the filter failed\n"); return 1; }
    bad += touch(b, len, 3);
    printf("wrote %s MiB mapped before the filter and %s MiB malloc'ed after it: bad=%ld\n", argv[2], argv[2],
           bad);
    return bad ? 1 : 0;
}
