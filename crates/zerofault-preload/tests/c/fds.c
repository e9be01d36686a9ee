/* Descriptors and mappings the shim must leave to the program.
 *
 *   fds nofile N   soft and hard RLIMIT_NOFILE set to N first, then two 64 MiB blocks written
 *                  (the engine starts, where it may), then /dev/null opened until EMFILE:
 *                  prints "opened K descriptors"
 *   fds nofile-late N   the same, with two 64 MiB blocks written before the limit is set (the
 *                  engine runs already)
 *   fds list       two 64 MiB blocks written, then the descriptors open beyond those open at
 *                  start: prints "new descriptors: K"; their userfaultfd count goes to stderr
 *                  as "uffd_fds=N"
 *   fds maps       a 64 MiB block written, then 2 MiB mappings (every other one read-only, so
 *                  that none merge) until mmap fails; then malloc(1000) and fopen of
 *                  /proc/self/maps at the limit: prints "at the limit: malloc ok, fopen ok";
 *                  the number of mappings made goes to stderr as "maps=N"
 *   fds maps-raw   as maps, the mappings made by raw system calls (no hook sees them refused);
 *                  then at the limit, with the last one's ENOMEM still in errno, realloc(p, 0)
 *                  of a small block (a free), malloc(1000) and fopen: prints "at the limit:
 *                  realloc(p, 0) NULL, malloc ok, fopen ok"
 *   fds lowfd SECS 128 MiB blocks malloc'd, one byte (every other round: none) written, freed,
 *                  for SECS seconds; between rounds, 2000 times: close(0), open("/dev/null")
 *                  must give 0 (the lowest free number), then the original stdin is put back:
 *                  prints "wrong descriptor W of N opens"; the userfaultfd count goes to stderr
 *                  as "uffd_fds=N"
 *   fds closeall   two 64 MiB blocks written, then every descriptor above 2 closed
 *                  (close_range), the engine's too; then 64 MiB blocks written, checked,
 *                  MADV_DONTNEEDed and freed, 40 rounds: prints "after closing: bad B"; the
 *                  threads of the process 0.3 s later go to stderr as "threads=N"
 *   fds chroot DIR / fds umount
 *                  two 64 MiB blocks written, then the program loses /proc: it chroots into
 *                  the empty directory DIR, or unmounts /proc in a mount namespace of its own;
 *                  then a tracer (a forked child) PTRACE_SEIZEs it, interrupts it 0.3 s later
 *                  and PEEKs a word of a block the program never touched: prints
 *                  "tracer read: V errno E" (natively 0 and 0)
 *
 * In "maps" mode the program's first malloc is the 64 MiB block (natively that call sets the C
 * library's heap up; a heap first made at the limit fails natively too), in the others a
 * small one. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdint.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1ul << 20)

/* The writes are made for real: the blocks are never read again. */
static void keep(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static void write_blocks(int n) {
    for (int i = 0; i < n; i++) {
        unsigned char *p = malloc(64 * MB);
        if (!p) { perror("malloc"); exit(1); }
        for (size_t k = 0; k < 64 * MB; k += 4096) p[k] = 1;
        keep(p);
    }
}

/* Marks in `open` the descriptors open now; returns how many of them are not marked in `was`
 * (NULL: all) and counts the userfaultfd ones among those in *uffd. */
static int scan(char *open, const char *was, int *uffd) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) { perror("opendir"); exit(1); }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd == dirfd(d) || fd < 0 || fd >= 65536) continue;
        open[fd] = 1;
        if (was && was[fd]) continue;
        n++;
        char link[256];
        ssize_t k = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (k > 0) {
            link[k] = 0;
            if (uffd) *uffd += strcmp(link, "anon_inode:[userfaultfd]") == 0;
        }
    }
    closedir(d);
    return n;
}

static int nofile(int lim, int late) {
    struct rlimit r = {lim, lim};
    for (int fd = 3; fd < 1024; fd++) close(fd);
    if (late) write_blocks(2);
    if (setrlimit(RLIMIT_NOFILE, &r)) { perror("setrlimit"); return 1; }
    write_blocks(2);
    int n = 0, fd;
    while ((fd = open("/dev/null", O_RDONLY)) >= 0) n++;
    if (errno != EMFILE) perror("open");
    printf("opened %d descriptors\n", n);
    return 0;
}

static int list(void) {
    static char before[65536], after[65536];
    scan(before, NULL, NULL);
    write_blocks(2);
    int uffd = 0;
    int n = scan(after, before, &uffd);
    printf("new descriptors: %d\n", n);
    fprintf(stderr, "uffd_fds=%d\n", uffd);
    return 0;
}

static int maps(int raw) {
    setvbuf(stdout, NULL, _IONBF, 0);
    write_blocks(1);
    char *small = malloc(100);
    int n = 0;
    for (;;) {
        int prot = (n & 1) ? PROT_READ : PROT_READ | PROT_WRITE;
        int flags = MAP_PRIVATE | MAP_ANONYMOUS;
        unsigned char *p = raw ? (unsigned char *)syscall(SYS_mmap, NULL, 2 * MB, prot, flags, -1, 0)
                               : mmap(NULL, 2 * MB, prot, flags, -1, 0);
        if (p == MAP_FAILED) break;
        if (!(n & 1) && n % 64 == 0) p[0] = 1;
        n++;
    }
    if (errno != ENOMEM) perror("mmap");
    if (raw) {
        void *z = realloc(small, 0); /* glibc frees the block, returns NULL and leaves errno */
        printf("at the limit: realloc(p, 0) %s, ", z ? "a block" : "NULL");
    }
    void *m = malloc(1000);
    FILE *f = fopen("/proc/self/maps", "r");
    printf("%smalloc %s, fopen %s\n", raw ? "" : "at the limit: ", m ? "ok" : "NULL", f ? "ok" : strerror(errno));
    fprintf(stderr, "maps=%d\n", n);
    return 0;
}

static int lowfd(int secs) {
    int saved = dup(0);
    long opens = 0, wrong = 0;
    time_t end = time(NULL) + secs;
    for (int round = 0; time(NULL) < end; round++) {
        unsigned char *b = malloc(128 * MB);
        if (!b) { perror("malloc"); return 1; }
        if (round & 1) b[0] = 1;
        keep(b);
        free(b);
        for (int k = 0; k < 2000; k++) {
            close(0);
            int fd = open("/dev/null", O_RDONLY);
            opens++;
            if (fd != 0) { wrong++; if (fd > 0) close(fd); }
            dup2(saved, 0);
        }
    }
    static char now[65536];
    int uffd = 0;
    scan(now, NULL, &uffd);
    printf("wrong descriptor %ld of %ld opens\n", wrong, opens);
    fprintf(stderr, "uffd_fds=%d\n", uffd);
    return 0;
}

static int closeall(void) {
    write_blocks(2);
    if (syscall(SYS_close_range, 3, ~0u, 0)) { perror("close_range"); return 1; }
    long bad = 0;
    for (int round = 0; round < 40; round++) {
        unsigned char *p = malloc(64 * MB);
        if (!p) { perror("malloc"); return 1; }
        for (size_t k = 0; k < 64 * MB; k += 4096) bad += p[k] != 0 && round == 0, p[k] = (unsigned char)(round + 1);
        for (size_t k = 0; k < 64 * MB; k += 4096) bad += p[k] != (unsigned char)(round + 1);
        unsigned char *a = (unsigned char *)(((uintptr_t)p + 4095) & ~(uintptr_t)4095);
        if (madvise(a, 32 * MB, MADV_DONTNEED)) { perror("madvise"); return 1; }
        for (size_t k = 0; k < 32 * MB; k += 4096) bad += a[k] != 0;
        keep(p);
        free(p);
    }
    printf("after closing: bad %ld\n", bad);
    usleep(300000);
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "Threads:", 8)) fprintf(stderr, "threads=%d\n", atoi(line + 8));
    if (f) fclose(f);
    return 0;
}

static int lose_proc(const char *how, const char *dir) {
    setvbuf(stdout, NULL, _IONBF, 0);
    write_blocks(2);
    usleep(300000);
    if (dir) {
        if (chroot(dir) || chdir("/")) { perror("chroot"); return 1; }
    } else {
        if (unshare(CLONE_NEWNS)) { perror("unshare"); return 1; }
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) { perror("mount"); return 1; }
        if (umount2("/proc", MNT_DETACH)) { perror("umount /proc"); return 1; }
    }
    if (access("/proc/self/status", R_OK) == 0) { fprintf(stderr, "%s: /proc still there\n", how); return 1; }
    usleep(300000);
    unsigned char *fresh = malloc(64 * MB);
    keep(fresh);
    pid_t me = getpid(), tracer = fork();
    if (tracer == 0) {
        if (ptrace(PTRACE_SEIZE, me, 0, 0)) { perror("PTRACE_SEIZE"); _exit(2); }
        usleep(300000);
        ptrace(PTRACE_INTERRUPT, me, 0, 0);
        int ws;
        waitpid(me, &ws, __WALL);
        errno = 0;
        long v = ptrace(PTRACE_PEEKDATA, me, fresh + 32 * MB, 0);
        printf("tracer read: %ld errno %d\n", v, errno);
        ptrace(PTRACE_DETACH, me, 0, 0);
        _exit(0);
    }
    int st;
    if (waitpid(tracer, &st, 0) != tracer || !WIFEXITED(st) || WEXITSTATUS(st)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "maps")) return maps(0);
    if (argc == 2 && !strcmp(argv[1], "maps-raw")) return maps(1);
    void *first = malloc(16);
    keep(first);
    free(first);
    if (argc == 3 && !strcmp(argv[1], "nofile")) return nofile(atoi(argv[2]), 0);
    if (argc == 3 && !strcmp(argv[1], "nofile-late")) return nofile(atoi(argv[2]), 1);
    if (argc == 2 && !strcmp(argv[1], "list")) return list();
    if (argc == 3 && !strcmp(argv[1], "lowfd")) return lowfd(atoi(argv[2]));
    if (argc == 2 && !strcmp(argv[1], "closeall")) return closeall();
    if (argc == 3 && !strcmp(argv[1], "chroot")) return lose_proc("chroot", argv[2]);
    if (argc == 2 && !strcmp(argv[1], "umount")) return lose_proc("umount", NULL);
    fprintf(stderr, "usage: fds nofile N | nofile-late N | list | lowfd SECS | closeall | maps | maps-raw | chroot DIR | umount\n");
    return 2;
}
