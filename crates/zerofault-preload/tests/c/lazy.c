/* The shim's front loads the shim proper on the first large request, and the shim's own
 * thread-local storage is never allocated on a program thread.
 *
 * Prints whether libzerofault_shim.so is loaded before any large request; then five program
 * threads (main and four) each allocate, fill, check and free large blocks (malloc, calloc,
 * realloc, an anonymous mmap); then prints whether the shim is loaded, whether an engine runs
 * (a thread named zerofault-*, a userfaultfd), and on how many program threads the shim's
 * module has a TLS block. Under the front (dlopen()ed) that module's TLS is dynamic: glibc would
 * allocate a thread's block with the program's malloc on the thread's first touch, from inside
 * a hook, possibly inside that malloc's own mmap under its lock. It must stay 0. Exit 1 on a
 * wrong byte. */
#define _GNU_SOURCE
#include <dirent.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB (1UL << 20)

struct found {
    int loaded;
    int tls;
};

static int each(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct found *f = data;
    if (info->dlpi_name && strstr(info->dlpi_name, "libzerofault_shim.so")) {
        f->loaded = 1;
        f->tls = info->dlpi_tls_data != NULL;
    }
    return 0;
}

static struct found look(void) {
    struct found f = {0, 0};
    dl_iterate_phdr(each, &f);
    return f;
}

static int bad;
static int tls_blocks;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void work(int seed) {
    for (int round = 0; round < 3; round++) {
        size_t n = (16 + 8 * seed + round) * MIB;
        unsigned char *p = malloc(n);
        unsigned char *z = calloc(1, 8 * MIB);
        unsigned char *m = mmap(NULL, 16 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (!p || !z || m == MAP_FAILED) {
            __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
            return;
        }
        memset(p, seed + round, n);
        memset(m, seed ^ round, 16 * MIB);
        p = realloc(p, n + 32 * MIB);
        for (size_t i = 0; i < n; i += 4096)
            if (p[i] != (unsigned char)(seed + round)) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
        for (size_t i = 0; i < 8 * MIB; i += 512)
            if (z[i]) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
        for (size_t i = 0; i < 16 * MIB; i += 4096)
            if (m[i] != (unsigned char)(seed ^ round)) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
        free(p);
        free(z);
        munmap(m, 16 * MIB);
    }
    struct found f = look();
    pthread_mutex_lock(&lock);
    tls_blocks += f.tls;
    pthread_mutex_unlock(&lock);
}

static void *thread(void *arg) {
    work((int)(long)arg);
    return NULL;
}

static int engine_threads(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[300], comm[32] = "";
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && fgets(comm, sizeof comm, f)) n += strncmp(comm, "zerofault", 9) == 0;
        if (f) fclose(f);
    }
    if (d) closedir(d);
    return n;
}

static int userfaultfds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));) {
        char link[256];
        ssize_t k = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (k > 0) {
            link[k] = 0;
            n += strcmp(link, "anon_inode:[userfaultfd]") == 0;
        }
    }
    if (d) closedir(d);
    return n;
}

int main(void) {
    printf("before: shim %s\n", look().loaded ? "loaded" : "not loaded");
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread, (void *)(i + 1));
    work(0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    int engine = engine_threads() > 0 && userfaultfds() == 1;
    printf("after: shim %s, engine %s, shim TLS on %d of 5 program threads, bad bytes %d\n",
           look().loaded ? "loaded" : "not loaded", engine ? "running" : "not running", tls_blocks, bad);
    return bad != 0;
}
