/* How many descriptors a program gets under a soft RLIMIT_NOFILE of 32.
 *
 *   nofile small   a few small mallocs only
 *   nofile large   malloc and write 64 MiB first (a large block is in use)
 *
 * then opens /dev/null until EMFILE and prints how many it opened. The number of the process's
 * userfaultfd descriptors (anon_inode:[userfaultfd] in /proc/self/fd) goes to stderr as
 * "uffd_fds=N". */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The writes are made for real: the block is never used again. */
static void keep(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static int uffd_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char link[256];
        ssize_t k = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (k > 0) {
            link[k] = 0;
            n += strcmp(link, "anon_inode:[userfaultfd]") == 0;
        }
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "small") && strcmp(argv[1], "large"))) {
        fprintf(stderr, "usage: nofile small|large\n");
        return 2;
    }
    void *small[8];
    for (int i = 0; i < 8; i++) small[i] = malloc(100 + 1000 * i);
    if (!strcmp(argv[1], "large")) {
        unsigned char *p = malloc(64u << 20);
        if (!p) return 1;
        for (size_t i = 0; i < (64u << 20); i += 4096) p[i] = 1;
        keep(p);
    }
    struct rlimit r;
    getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = 32;
    if (setrlimit(RLIMIT_NOFILE, &r)) { perror("setrlimit"); return 1; }
    int fds[64], n = 0;
    while (n < 64) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0) {
            if (errno != EMFILE) perror("open");
            break;
        }
        fds[n++] = fd;
    }
    printf("opened %d descriptors before EMFILE\n", n);
    while (n > 0) close(fds[--n]);
    fprintf(stderr, "uffd_fds=%d\n", uffd_fds());
    for (int i = 0; i < 8; i++) free(small[i]);
    return 0;
}
