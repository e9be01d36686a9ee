/* One thread per CPU, each pinned to its CPU, each writes `mib` MiB (argv[1], default 64) of a
 * buffer of its own (malloc family, 2 MiB aligned), one byte per 4 KiB page, then asks move_pages(2) (query mode)
 * which node each page is on. Prints one line per thread: its CPU, its CPU's node, the pages on
 * that node and the pages elsewhere: "cpu=C node=N local=L remote=R". For the multi-node VM
 * tests (crates/zerofault-cli/tests/vm.rs): natively every page is on the thread's node. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static size_t mib = 64;
static int node_of_cpu(int cpu) {
    char path[128];
    for (int n = 0; n < 64; n++) {
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpu%d", n, cpu);
        if (access(path, F_OK) == 0) return n;
    }
    return -1;
}

static void *run(void *arg) {
    int cpu = (int)(long)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set)) { perror("sched_setaffinity"); exit(1); }
    size_t len = mib << 20, pages = len >> 12;
    /* Whole 2 MiB PMDs: natively a transparent huge page that straddled two threads'
     * buffers (adjacent mappings merge) would be allocated by whichever touched it first. */
    unsigned char *p;
    if (posix_memalign((void **)&p, 2 << 20, len)) { perror("posix_memalign"); exit(1); }
    for (size_t i = 0; i < len; i += 4096) p[i] = 1;
    void **addrs = malloc(pages * sizeof *addrs);
    int *status = malloc(pages * sizeof *status);
    for (size_t i = 0; i < pages; i++) addrs[i] = p + (i << 12);
    if (syscall(SYS_move_pages, 0, pages, addrs, NULL, status, 0)) { perror("move_pages"); exit(1); }
    int node = node_of_cpu(cpu);
    size_t local = 0, remote = 0;
    for (size_t i = 0; i < pages; i++) {
        if (status[i] == node) local++;
        else remote++;
    }
    printf("cpu=%d node=%d local=%zu remote=%zu\n", cpu, node, local, remote);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) mib = strtoul(argv[1], NULL, 10);
    int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    pthread_t t[64];
    for (long c = 0; c < cpus && c < 64; c++) pthread_create(&t[c], NULL, run, (void *)c);
    for (int c = 0; c < cpus && c < 64; c++) pthread_join(t[c], NULL);
    return 0;
}
