/* Where pages land on a NUMA machine, natively and under the shim: the multi-node VM tests of
 * crates/zerofault-cli/tests/vm.rs (issue 11). Each step touches fresh memory, one byte per
 * 4 KiB page, then asks move_pages(2) (query mode) which node each page is on, and prints one
 * line of figures for the test to check. Under the shim (zerofault_stats_json found with
 * dlsym), each step also prints what the engine counted during it:
 * "stats step=S numa_hit=.. numa_miss=.. interleave_hit=.. zlc_skips=.. zlc_marks=..".
 *
 *   local MIB    one thread pinned to each CPU writes MIB of its own (after the main thread
 *                warmed the pool: a sequential writer starts the scrub threads, and a
 *                second's pause lets them fill): "local cpu=C node=N local=L remote=R"
 *   bind         a mapping bound (mbind MPOL_BIND) to the last node, written from CPU 0:
 *                "bind target=T on=X of=P"
 *   interleave   a mapping interleaved over every node, written from CPU 0: "interleave
 *                match=M of=P", M the pages on the node the kernel's interleave names (per
 *                4 KiB page, or per 2 MiB huge page where the whole huge page is on one node)
 *   full         a forked child fills node 0 (pinned to CPU 0, it touches node 0's free
 *                memory); then CPU 0 writes 128 MiB: "full other=X of=P" (pages off node 0);
 *                the child is killed, and two seconds later CPU 0 writes 64 MiB again:
 *                "after local=X of=P"
 *
 * argv: the MiB per thread of `local`, then the steps to run (all four without any). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MPOL_BIND 2
#define MPOL_INTERLEAVE 3

static size_t (*stats_json)(char *, size_t);
static const char *keys[] = {"numa_hit", "numa_miss", "interleave_hit", "zlc_skips", "zlc_marks"};
#define NKEYS (sizeof keys / sizeof *keys)
static unsigned long long before[NKEYS];

static void read_stats(unsigned long long *out) {
    static char buf[1 << 16];
    memset(out, 0, NKEYS * sizeof *out);
    if (!stats_json || stats_json(buf, sizeof buf) >= sizeof buf) return;
    for (size_t k = 0; k < NKEYS; k++) {
        char pat[64];
        snprintf(pat, sizeof pat, "\"%s\":", keys[k]);
        char *p = strstr(buf, pat);
        if (p) out[k] = strtoull(p + strlen(pat), NULL, 10);
    }
}

static void step_begin(void) { read_stats(before); }

static void step_end(const char *step) {
    if (!stats_json) return;
    unsigned long long now[NKEYS];
    read_stats(now);
    printf("stats step=%s", step);
    for (size_t k = 0; k < NKEYS; k++) printf(" %s=%llu", keys[k], now[k] - before[k]);
    printf("\n");
}

static int nodes_online(void) {
    int n = 0;
    char path[128];
    while (n < 64) {
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d", n);
        if (access(path, F_OK)) break;
        n++;
    }
    return n;
}

static int node_of_cpu(int cpu) {
    char path[128];
    for (int n = 0; n < 64; n++) {
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpu%d", n, cpu);
        if (access(path, F_OK) == 0) return n;
    }
    return -1;
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set)) { perror("sched_setaffinity"); exit(1); }
}

/* A fresh mapping of `len` bytes, 2 MiB aligned (so that the kernel's interleave index of a
 * huge page is its address / 2 MiB). */
static unsigned char *map_aligned(size_t len) {
    size_t extra = 2 << 20;
    unsigned char *p = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    unsigned char *a = (unsigned char *)(((unsigned long)p + extra - 1) & ~(extra - 1));
    if (a > p) munmap(p, a - p);
    munmap(a + len, p + len + extra - (a + len));
    return a;
}

static void touch(unsigned char *p, size_t len) {
    for (size_t i = 0; i < len; i += 4096) p[i] = 1;
}

/* The node of each page of [p, p + len) into `status` (malloc'ed, one int per page). */
static int *nodes_of(unsigned char *p, size_t len) {
    size_t pages = len >> 12;
    void **addrs = malloc(pages * sizeof *addrs);
    int *status = malloc(pages * sizeof *status);
    if (!addrs || !status) { perror("malloc"); exit(1); }
    for (size_t i = 0; i < pages; i++) addrs[i] = p + (i << 12);
    if (syscall(SYS_move_pages, 0, pages, addrs, NULL, status, 0)) { perror("move_pages"); exit(1); }
    free(addrs);
    return status;
}

static size_t mib = 64;

static void *local_thread(void *arg) {
    int cpu = (int)(long)arg;
    pin(cpu);
    size_t len = mib << 20, pages = len >> 12;
    /* Whole 2 MiB PMDs: natively a transparent huge page that straddled two threads' buffers
     * (adjacent mappings merge) would be allocated by whichever touched it first. */
    unsigned char *p;
    if (posix_memalign((void **)&p, 2 << 20, len)) { perror("posix_memalign"); exit(1); }
    touch(p, len);
    int *status = nodes_of(p, len);
    int node = node_of_cpu(cpu);
    size_t local = 0, remote = 0;
    for (size_t i = 0; i < pages; i++) {
        if (status[i] == node) local++;
        else remote++;
    }
    printf("local cpu=%d node=%d local=%zu remote=%zu\n", cpu, node, local, remote);
    free(status);
    return NULL;
}

static void step_local(void) {
    /* The warm-up: a sequential writer starts the scrub threads, which fill the pools meanwhile. */
    size_t warm = 32 << 20;
    unsigned char *w = malloc(warm);
    if (!w) { perror("malloc"); exit(1); }
    touch(w, warm);
    sleep(1);
    free(w);
    step_begin();
    int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    pthread_t t[64];
    for (long c = 0; c < cpus && c < 64; c++) pthread_create(&t[c], NULL, local_thread, (void *)c);
    for (int c = 0; c < cpus && c < 64; c++) pthread_join(t[c], NULL);
    step_end("local");
}

static void step_bind(int nodes) {
    step_begin();
    pin(0);
    size_t len = 64 << 20, pages = len >> 12;
    int target = nodes - 1;
    unsigned char *p = map_aligned(len);
    unsigned long mask = 1UL << target;
    if (syscall(SYS_mbind, p, len, MPOL_BIND, &mask, 64, 0)) { perror("mbind"); exit(1); }
    touch(p, len);
    int *status = nodes_of(p, len);
    size_t on = 0;
    for (size_t i = 0; i < pages; i++) on += status[i] == target;
    printf("bind target=%d on=%zu of=%zu\n", target, on, pages);
    free(status);
    munmap(p, len);
    step_end("bind");
}

static void step_interleave(int nodes) {
    step_begin();
    pin(0);
    size_t len = 64 << 20, pages = len >> 12;
    unsigned char *p = map_aligned(len);
    unsigned long mask = (1UL << nodes) - 1;
    if (syscall(SYS_mbind, p, len, MPOL_INTERLEAVE, &mask, 64, 0)) { perror("mbind"); exit(1); }
    touch(p, len);
    int *status = nodes_of(p, len);
    size_t match = 0;
    for (size_t blk = 0; blk < pages; blk += 512) {
        unsigned long a = (unsigned long)p + (blk << 12);
        int whole = 1;
        for (size_t i = blk; i < blk + 512; i++) whole &= status[i] == status[blk];
        for (size_t i = blk; i < blk + 512; i++) {
            unsigned long pa = (unsigned long)p + (i << 12);
            int per_page = (int)((pa >> 12) % nodes), per_huge = (int)((a >> 21) % nodes);
            match += status[i] == per_page || (whole && status[i] == per_huge);
        }
    }
    printf("interleave match=%zu of=%zu\n", match, pages);
    free(status);
    munmap(p, len);
    step_end("interleave");
}

static long node_free_kb(int node) {
    char path[128], line[256];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/meminfo", node);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f)) {
        char *m = strstr(line, "MemFree:");
        if (m) kb = strtol(m + 8, NULL, 10);
    }
    if (f) fclose(f);
    return kb;
}

static void step_full(void) {
    pin(0);
    int ready[2];
    if (pipe(ready)) { perror("pipe"); exit(1); }
    pid_t child = fork();
    if (child == 0) {
        /* Node 0's free memory, touched from CPU 0: the kernel takes node 0's pages until the
         * node is at its watermark, and the next node's after. */
        long kb = node_free_kb(0);
        size_t len = (size_t)(kb > 0 ? kb : 0) << 10;
        unsigned char *h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (h == MAP_FAILED) _exit(1);
        touch(h, len);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c;
    if (read(ready[0], &c, 1) != 1) { fprintf(stderr, "the child filling node 0 failed\n"); exit(1); }
    printf("full node0_free_kb=%ld\n", node_free_kb(0));
    /* Node 0's pool still holds pages made before: the writes below take them first, then
     * find its rings empty; the scrub's next populate on node 0 finds the node full. */
    usleep(1200 * 1000);
    step_begin();
    size_t len = 128 << 20, pages = len >> 12;
    unsigned char *p = map_aligned(len);
    touch(p, len);
    int *status = nodes_of(p, len);
    size_t other = 0;
    for (size_t i = 0; i < pages; i++) other += status[i] != 0;
    printf("full other=%zu of=%zu\n", other, pages);
    free(status);
    step_end("full");
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    sleep(2);
    step_begin();
    len = 64 << 20;
    pages = len >> 12;
    unsigned char *q = map_aligned(len);
    touch(q, len);
    status = nodes_of(q, len);
    size_t local = 0;
    for (size_t i = 0; i < pages; i++) local += status[i] == 0;
    printf("after local=%zu of=%zu\n", local, pages);
    free(status);
    step_end("after");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    stats_json = (size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "zerofault_stats_json");
    if (argc > 1) mib = strtoul(argv[1], NULL, 10);
    int nodes = nodes_online();
    printf("suite nodes=%d shim=%d\n", nodes, stats_json != NULL);
    int all = argc <= 2;
    for (int i = 2; i < argc || all; i++) {
        const char *s = all ? NULL : argv[i];
        if (all || !strcmp(s, "local")) step_local();
        if (all || !strcmp(s, "bind")) step_bind(nodes);
        if (all || !strcmp(s, "interleave")) step_interleave(nodes);
        if (all || !strcmp(s, "full")) step_full();
        if (all) break;
    }
    return 0;
}
