/* What a program does to its own process, after (or before) its first large request: drops
 * its rights, enters a user namespace, confines itself, registers memory with a userfaultfd of
 * its own, runs futex operations on fresh memory, advises a block it frees. Each mode prints
 * what it saw; run natively and under the shim, the lines must be the same.
 *
 *   rights MODE    (the modes are listed in main) */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "smaps.h"

#define MIB ((size_t)1 << 20)
#define BIG (64 * MIB)

/* A fresh large block, written so that the engine (under the shim) has started and served it. */
static unsigned char *touched_block(void) {
    unsigned char *b = malloc(BIG);
    if (!b)
        exit(90);
    for (size_t i = 0; i < BIG; i += 4096)
        b[i] = 1;
    __asm__ volatile("" : : "r"(b) : "memory"); /* the stores are not dead */
    return b;
}

/* Threads besides the calling one (the engine's, under the shim: the modes that call this
 * start none of their own). Counted, not named: a thread just started may not have its name
 * yet. */
static int engine_threads(void) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.' && atoi(e->d_name) != (int)gettid();
    if (d)
        closedir(d);
    return n;
}

/* A fresh mapping (far from the block, whose stream the engine may have run ahead of), one
 * byte of each page written, then read back with the rest of the page: the engine still serves
 * it (or the kernel does), zero but for what was written. */
static const char *fresh_memory_works(void) {
    fprintf(stderr, "engine threads %d\n", engine_threads());
    unsigned char *b = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED)
        return "mmap failed";
    for (size_t i = 0; i < BIG; i += 4096)
        b[i] = 7;
    for (size_t i = 0; i < BIG; i += 512)
        if (b[i] != (i % 4096 ? 0 : 7))
            return "wrong bytes";
    munmap(b, BIG);
    return "ok";
}

/* A field of every thread's status ("Uid", "CapEff", "NoNewPrivs", "Seccomp"): 1 when every
 * thread's value starts with `want`. */
static int every_thread(const char *field, const char *want) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int all = 1, n = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* the thread left meanwhile */
        size_t fl = strlen(field);
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, field, fl) && line[fl] == ':') {
                const char *v = line + fl + 1;
                while (*v == ' ' || *v == '\t')
                    v++;
                all &= !strncmp(v, want, strlen(want));
                n++;
            }
        fclose(f);
    }
    if (d)
        closedir(d);
    return all && n > 0;
}

static void drop_root(void) {
    int a = setgroups(0, NULL), b = setgid(65534), c = setuid(65534);
    printf("setgroups %d setgid %d setuid %d\n", a, b, c);
    printf("every thread: uid 65534 %d, no capability %d\n", every_thread("Uid", "65534\t65534\t65534\t65534"),
           every_thread("CapEff", "0000000000000000"));
}

/* A second thread, created after the engine started, while main calls setuid: glibc's set*id
 * signals it and waits for it. glibc installs that signal's handler at the program's first
 * pthread_create, only while it still counts one thread (the engine must not say otherwise). */
static void *sleeping(void *arg) {
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

/* A thread writing and discarding served memory: its MADV_DONTNEED waits for the engine to
 * read the event, and glibc's set*id waits for the thread. */
static volatile int stop_discarding;
static void *discarding(void *arg) {
    unsigned char *b = arg;
    while (!stop_discarding) {
        for (size_t i = 0; i < 8 * MIB; i += 4096)
            b[i] = 1;
        madvise(b, 8 * MIB, MADV_DONTNEED);
    }
    return NULL;
}

static void setuid_beside_a_discarding_thread(void) {
    unsigned char *b = touched_block();
    pthread_t t;
    pthread_create(&t, NULL, discarding, b);
    int bad = 0;
    for (int i = 0; i < 20; i++)
        bad += setuid(getuid()) != 0;
    stop_discarding = 1;
    pthread_join(t, NULL);
    printf("setuid 20 times beside a discarding thread, %d failed\n", bad);
}

static void setuid_with_a_second_thread(void) {
    touched_block(); /* the engine starts before the program's first thread */
    pthread_t t;
    pthread_create(&t, NULL, sleeping, NULL);
    int bad = 0;
    for (int i = 0; i < 20; i++)
        bad += setuid(getuid()) != 0;
    printf("setuid 20 times beside a second thread, %d failed\n", bad);
}

static void raw_drop_root(void) {
    long a = syscall(SYS_setgroups, 0, NULL), b = syscall(SYS_setresgid, 65534, 65534, 65534);
    long c = syscall(SYS_setresuid, 65534, 65534, 65534);
    printf("raw setgroups %ld setresgid %ld setresuid %ld\n", a, b, c);
    /* A raw call changes the calling thread only: this program has one of its own. */
    printf("every thread: uid 65534 %d\n", every_thread("Uid", "65534\t65534\t65534\t65534"));
}

/* A seccomp filter that kills the process on execve and allows the rest. */
static int confine(int via_syscall) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_execve, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return -1;
    if (via_syscall)
        return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p);
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p);
}

/* An allowlist of what the rest of the program needs, anything else killing it: installed
 * before the first large request, as a sandboxed program does. */
static int allowlist(void) {
#define ALLOW(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        ALLOW(SYS_read), ALLOW(SYS_write), ALLOW(SYS_close), ALLOW(SYS_fstat), ALLOW(SYS_newfstatat),
        ALLOW(SYS_mmap), ALLOW(SYS_munmap), ALLOW(SYS_mremap), ALLOW(SYS_madvise), ALLOW(SYS_mprotect),
        ALLOW(SYS_brk), ALLOW(SYS_futex), ALLOW(SYS_exit), ALLOW(SYS_exit_group), ALLOW(SYS_rt_sigreturn),
        ALLOW(SYS_rt_sigprocmask), ALLOW(SYS_getpid), ALLOW(SYS_gettid), ALLOW(SYS_clock_gettime),
        ALLOW(SYS_getrandom), ALLOW(SYS_lseek),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
#undef ALLOW
    struct sock_fprog p = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p);
}

/* ---- a userfaultfd of the program's own: every missing page gets the byte (page index | 1) */

static int own_uffd;
static unsigned char *own_base;

static void *own_handler(void *arg) {
    (void)arg;
    static unsigned char page[4096] __attribute__((aligned(4096)));
    for (;;) {
        struct uffd_msg m;
        if (read(own_uffd, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_PAGEFAULT)
            continue;
        unsigned long a = m.arg.pagefault.address & ~4095UL;
        memset(page, (int)(((a - (unsigned long)own_base) >> 12) | 1), sizeof page);
        struct uffdio_copy c = {.dst = a, .src = (unsigned long)page, .len = 4096};
        ioctl(own_uffd, UFFDIO_COPY, &c);
    }
    return NULL;
}

static void own_userfaultfd(unsigned char *region, size_t len, int via_syscall) {
    own_base = region;
    own_uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
    struct uffdio_api api = {.api = UFFD_API};
    if (own_uffd < 0 || ioctl(own_uffd, UFFDIO_API, &api)) {
        printf("userfaultfd: %s\n", strerror(errno));
        return;
    }
    struct uffdio_register r = {.range = {(unsigned long)region, len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    int rc = via_syscall ? (int)syscall(SYS_ioctl, own_uffd, UFFDIO_REGISTER, &r) : ioctl(own_uffd, UFFDIO_REGISTER, &r);
    if (rc) {
        printf("UFFDIO_REGISTER: %s\n", strerror(errno));
        return;
    }
    pthread_t t;
    pthread_create(&t, NULL, own_handler, NULL);
    size_t bad = 0;
    for (size_t i = 0; i < len; i += 4096) {
        unsigned char want = (unsigned char)((i >> 12) | 1);
        bad += region[i] != want || region[i + 4095] != want;
    }
    printf("registered; pages %zu, wrong %zu\n", len / 4096, bad);
}

static void own_write_protect(void) {
    unsigned char *b = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(b, 1, BIG);
    int u = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP};
    struct uffdio_register r = {.range = {(unsigned long)b, BIG}, .mode = UFFDIO_REGISTER_MODE_WP};
    struct uffdio_writeprotect w = {.range = {(unsigned long)b, BIG}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    int a = ioctl(u, UFFDIO_API, &api), g = a ? -1 : ioctl(u, UFFDIO_REGISTER, &r);
    int p = g ? -1 : ioctl(u, UFFDIO_WRITEPROTECT, &w);
    printf("api %d register %d writeprotect %d\n", a, g, p);
}

/* ---- futex operations whose words were never touched */

static long fx(void *a, int op, long v, void *t, void *a2, int v3) { return syscall(SYS_futex, a, op, v, t, a2, v3); }

static void futexes(void) {
    unsigned char *b = malloc(BIG);
    int *w = (int *)(b + 16 * MIB), *w2 = (int *)(b + 32 * MIB), *w3 = (int *)(b + 48 * MIB);
    long r = fx(w, FUTEX_LOCK_PI_PRIVATE, 0, NULL, NULL, 0);
    printf("LOCK_PI %ld, owner is me %d\n", r, (*w & FUTEX_TID_MASK) == (int)gettid());
    r = fx(w + 1024, FUTEX_TRYLOCK_PI, 0, NULL, NULL, 0);
    printf("TRYLOCK_PI %ld\n", r);
    r = fx(w + 2048, FUTEX_WAKE_OP_PRIVATE, 1, (void *)1L, w2, FUTEX_OP(FUTEX_OP_SET, 5, FUTEX_OP_CMP_EQ, 0));
    printf("WAKE_OP %ld, second word %d\n", r, *w2);
    r = fx(w3, FUTEX_CMP_REQUEUE_PI_PRIVATE, 1, (void *)0, w3 + 1024, 0);
    printf("CMP_REQUEUE_PI %ld\n", r);
    r = fx((void *)8, FUTEX_LOCK_PI_PRIVATE, 0, NULL, NULL, 0);
    printf("LOCK_PI on a bad address %ld %s\n", r, strerror(errno));
}

/* ---- advice on a block, the block freed, the same address handed out again, then a fork */

static void advice_reused(int advice) {
    touched_block();
    unsigned char *a = malloc(BIG);
    /* A native block starts 16 bytes into its mapping: its whole pages. */
    int m = madvise((void *)(((unsigned long)a + 4095) & ~4095UL), BIG - 8192, advice);
    free(a);
    unsigned char *b = malloc(BIG);
    fprintf(stderr, "reused %d\n", a == b); /* the shim's arena hands the same block out again */
    memset(b, 9, BIG);
    pid_t c = fork();
    if (c == 0) {
        size_t seen = 0;
        for (size_t i = 0; i < BIG; i += 4096)
            seen += b[i] == 9;
        _exit(seen == BIG / 4096 ? 0 : 3);
    }
    int st;
    waitpid(c, &st, 0);
    printf("madvise %d; child %s\n", m,
           WIFEXITED(st) ? (WEXITSTATUS(st) ? "saw zeros" : "saw the data") : "was killed");
}

/* ---- a debugger's view: a block whose page 0 alone was written */

unsigned char *volatile fresh_block; /* gdb finds the block here */

/* Prints where the block is, then waits for a byte on stdin (a tracer reads and writes the
 * block meanwhile through /proc/PID/mem), then prints two bytes of it. */
static void remote(void) {
    fresh_block = malloc(BIG);
    fresh_block[0] = 1;
    printf("block %p\n", (void *)fresh_block);
    char c;
    if (read(0, &c, 1) != 1)
        exit(94);
    printf("bytes %d %d\n", fresh_block[MIB], fresh_block[2 * MIB]);
}

/* Under gdb: the block, then a breakpoint trap for gdb to print, set and dump it. */
static void debugged(void) {
    fresh_block = malloc(BIG);
    fresh_block[0] = 1;
    raise(SIGTRAP);
    printf("byte %d\n", fresh_block[MIB]);
}

/* A secret in a block, the block freed, a larger one written, then abort: the core must not
 * hold the secret (natively the freed block is unmapped). The secret is made at run time, so
 * that it is nowhere in the program's image. */
static void crash_with_a_freed_secret(void) {
    unsigned char *s = malloc(BIG);
    for (size_t i = 0; i < BIG; i++)
        s[i] = (unsigned char)(((i % 32) * 7 + 13) ^ 0x5a);
    __asm__ volatile("" : : "r"(s) : "memory"); /* the stores are not dead */
    free(s);
    unsigned char *d = malloc(4 * BIG);
    memset(d, 'A', MIB);
    __asm__ volatile("" : : "r"(d) : "memory");
    abort();
}

/* ---- huge pages the program said no to */


/* 256 MiB written whole after MADV_NOHUGEPAGE on the mapping (how 0), after
 * prctl(PR_SET_THP_DISABLE) on a malloc block (how 1), or with no advice at all (how 2: under
 * THP "madvise" natively no huge page either). */
static void no_huge_pages(int how) {
    size_t n = 4 * BIG;
    unsigned char *p;
    int r = 0;
    if (how == 1) {
        r = prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
        p = malloc(n);
    } else if (how == 2) {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    } else {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        r = madvise(p, n, MADV_NOHUGEPAGE);
    }
    memset(p, 1, n);
    __asm__ volatile("" : : "r"(p) : "memory");
    printf("advice %d; huge pages %ld kB\n", r, anon_huge_kb(p, p + n));
    /* Nor any in the engine's pool: they would show in the process's AnonHugePages (after a
     * moment for the scrub to refill it). */
    usleep(300 * 1000);
    printf("in the process %ld kB\n", process_huge_kb());
}

/* A mapping advised `advice` with one page written, grown by an mremap that has to move it
 * (something is mapped right after it), then written whole: the advice moves with the mapping,
 * and the writes take huge pages where the kernel's faults would (to stderr: huge_kb=N). */
static void advised_then_moved(int advice) {
    size_t n = BIG;
    unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *after = mmap(p + n, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    int r = madvise(p, n, advice);
    p[0] = 1;
    unsigned char *q = mremap(p, n, 2 * n, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) {
        perror("mremap");
        exit(1);
    }
    memset(q, 1, 2 * n);
    __asm__ volatile("" : : "r"(q) : "memory");
    printf("advice %d; moved %d\n", r, q != p);
    fprintf(stderr, "huge_kb=%ld\n", anon_huge_kb(q, q + 2 * n));
    if (after != MAP_FAILED)
        munmap(after, 4096);
}

int main(int argc, char **argv) {
    const char *m = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(m, "setuid")) {
        touched_block();
        drop_root();
        printf("fresh memory %s\n", fresh_memory_works());
    } else if (!strcmp(m, "setuid-thread")) {
        setuid_with_a_second_thread();
    } else if (!strcmp(m, "setuid-busy")) {
        setuid_beside_a_discarding_thread();
    } else if (!strcmp(m, "switcher")) {
        /* A file server impersonating each client in turn. */
        touched_block();
        int bad = 0;
        for (int i = 0; i < 100; i++)
            bad += seteuid(65534) != 0 || seteuid(0) != 0;
        printf("switched 100 times, %d failed\n", bad);
        printf("fresh memory %s\n", fresh_memory_works());
    } else if (!strcmp(m, "raw-setuid")) {
        touched_block();
        raw_drop_root();
        printf("fresh memory %s\n", fresh_memory_works());
    } else if (!strcmp(m, "nnp")) {
        touched_block();
        printf("prctl %d\n", prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
        printf("every thread no_new_privs %d\n", every_thread("NoNewPrivs", "1"));
        printf("fresh memory %s\n", fresh_memory_works());
    } else if (!strcmp(m, "userns")) {
        touched_block();
        int r = unshare(CLONE_NEWUSER);
        printf("unshare(CLONE_NEWUSER) %d %s\n", r, r ? strerror(errno) : "");
        printf("fresh memory %s\n", fresh_memory_works());
    } else if (!strcmp(m, "setns")) {
        touched_block();
        int go[2];
        if (pipe(go))
            return 91;
        pid_t c = fork();
        if (c == 0) {
            char x = (char)unshare(CLONE_NEWUSER);
            if (write(go[1], &x, 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
        char x;
        if (read(go[0], &x, 1) != 1)
            return 92;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/user", c);
        int f = open(path, O_RDONLY), r = setns(f, CLONE_NEWUSER);
        printf("setns(user) %d %s\n", r, r ? strerror(errno) : "");
        kill(c, SIGKILL);
        waitpid(c, NULL, 0);
        printf("fresh memory %s\n", fresh_memory_works());
    } else if (!strcmp(m, "seccomp") || !strcmp(m, "seccomp-syscall")) {
        touched_block();
        printf("confine %d\n", confine(m[7] == '-'));
        printf("every thread: seccomp filter %d, no_new_privs %d\n", every_thread("Seccomp", "2"),
               every_thread("NoNewPrivs", "1"));
        printf("fresh memory %s\n", fresh_memory_works());
    } else if (!strcmp(m, "sandbox")) {
        printf("allowlist %d\n", allowlist());
        size_t n = 256 * MIB;
        unsigned char *b = malloc(n);
        if (!b)
            return 2;
        memset(b, 3, n);
        unsigned long s = 0;
        for (size_t i = 0; i < n; i += 4096)
            s += b[i];
        free(b);
        printf("sum %lu\n", s);
    } else if (!strcmp(m, "own-mmap") || !strcmp(m, "own-syscall")) {
        touched_block();
        unsigned char *r = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        own_userfaultfd(r, BIG, m[4] == 's');
    } else if (!strcmp(m, "own-malloc")) {
        /* The first large request: the block's header is the first page the engine serves. */
        void *r;
        if (posix_memalign(&r, 4096, BIG))
            return 93;
        own_userfaultfd(r, BIG, 0);
    } else if (!strcmp(m, "own-wp")) {
        touched_block();
        own_write_protect();
    } else if (!strcmp(m, "futex")) {
        touched_block();
        futexes();
    } else if (!strcmp(m, "remote")) {
        remote();
    } else if (!strcmp(m, "debugged")) {
        debugged();
    } else if (!strcmp(m, "core")) {
        crash_with_a_freed_secret();
    } else if (!strcmp(m, "nohugepage")) {
        no_huge_pages(0);
    } else if (!strcmp(m, "thp-disable")) {
        no_huge_pages(1);
    } else if (!strcmp(m, "no-advice")) {
        no_huge_pages(2);
    } else if (!strcmp(m, "huge-moved")) {
        advised_then_moved(MADV_HUGEPAGE);
    } else if (!strcmp(m, "nohuge-moved")) {
        advised_then_moved(MADV_NOHUGEPAGE);
    } else if (!strcmp(m, "dontfork")) {
        advice_reused(MADV_DONTFORK);
    } else if (!strcmp(m, "wipeonfork")) {
        advice_reused(MADV_WIPEONFORK);
    } else {
        fprintf(stderr, "usage: rights setuid|setuid-thread|setuid-busy|switcher|raw-setuid|nnp|userns|setns|seccomp|seccomp-syscall|sandbox|"
                        "own-mmap|own-syscall|own-malloc|own-wp|futex|remote|debugged|core|nohugepage|thp-disable|no-advice|huge-moved|nohuge-moved|dontfork|wipeonfork\n");
        return 64;
    }
    return 0;
}
