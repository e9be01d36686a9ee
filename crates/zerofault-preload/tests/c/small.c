/* A program that makes no large allocation: a few small mallocs, frees and a 64 KiB mmap. Prints
 * how many threads it has (/proc/self/task) and whether it holds a userfaultfd
 * (anon_inode:[userfaultfd] in /proc/self/fd); with the argument `loaded`, also whether the shim
 * proper (libzerofault_shim.so, which the front loads on a first large request) is loaded. */
#define _GNU_SOURCE
#include <dirent.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int shim_loaded(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "libzerofault_shim.so")) *(int *)data = 1;
    return 0;
}

int main(int argc, char **argv) {
    void *p[16];
    for (int i = 0; i < 16; i++) memset(p[i] = malloc((64 << i) - 1), 1, (64 << i) - 1); /* 63 B .. 2 MiB - 1 */
    for (int i = 0; i < 16; i++) free(p[i]);
    unsigned char *m = mmap(NULL, 64 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    m[0] = 1;
    munmap(m, 64 << 10);
    int threads = 0, uffd = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));) threads += e->d_name[0] != '.';
    if (d) closedir(d);
    d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));) {
        char link[256];
        ssize_t k = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (k > 0) {
            link[k] = 0;
            uffd += strcmp(link, "anon_inode:[userfaultfd]") == 0;
        }
    }
    if (d) closedir(d);
    printf("threads: %d\nuserfaultfd: %s\n", threads, uffd ? "yes" : "no");
    if (argc > 1 && !strcmp(argv[1], "loaded")) {
        int loaded = 0;
        dl_iterate_phdr(shim_loaded, &loaded);
        printf("shim proper: %s\n", loaded ? "loaded" : "not loaded");
    }
    return 0;
}
