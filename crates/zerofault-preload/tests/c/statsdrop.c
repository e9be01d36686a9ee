/* The files the shim writes (ZEROFAULT_STATS=<path>), against what the program does to its
 * rights and its root after start-up. Each mode prints what it saw; natively and under the
 * shim the lines must be the same.
 *
 *   statsdrop drop PATH    root drops to nobody (65534), as a service does after start-up, then
 *                          tries to open PATH (a root-only file) and looks for a descriptor of
 *                          the process that still names it, which it writes to: none natively
 *   statsdrop fork         a forked child writes memory and exits, then the parent
 *   statsdrop chroot DIR   chroot into DIR (empty) after start-up, then exit
 *   statsdrop touch        writes 64 MiB and exits */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define BIG (64 * MIB)

/* A fresh large block, written so that the engine (under the shim) has started and served it. */
static void touch(void) {
    unsigned char *b = malloc(BIG);
    if (!b)
        exit(90);
    for (size_t i = 0; i < BIG; i += 4096)
        b[i] = 1;
    __asm__ volatile("" : : "r"(b) : "memory"); /* the stores are not dead */
    free(b);
}

/* The descriptors of this process that name `path`; each is written to. */
static int descriptors_on(const char *path) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        int fd = atoi(e->d_name);
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (e->d_name[0] == '.' || fd == dirfd(d) || k <= 0)
            continue;
        target[k] = 0;
        if (!strcmp(target, path)) {
            static const char line[] = "INJECTED by nobody\n";
            ssize_t w = write(fd, line, sizeof line - 1);
            printf("fd %d names the file; write %s\n", fd, w > 0 ? "ok" : strerror(errno));
            n++;
        }
    }
    if (d)
        closedir(d);
    return n;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    touch();
    if (!strcmp(mode, "drop") && argc > 2) {
        if (setgroups(0, NULL) || setgid(65534) || setuid(65534)) {
            perror("drop");
            return 2;
        }
        int fd = open(argv[2], O_WRONLY | O_APPEND);
        printf("uid %d: open: %s\n", (int)getuid(), fd < 0 ? strerror(errno) : "ok");
        printf("descriptors naming the file: %d\n", descriptors_on(argv[2]));
        touch();
    } else if (!strcmp(mode, "fork")) {
        pid_t c = fork();
        if (c == 0) {
            touch();
            exit(0);
        }
        int st;
        printf("child %s\n", waitpid(c, &st, 0) == c && WIFEXITED(st) && !WEXITSTATUS(st) ? "ok" : "failed");
    } else if (!strcmp(mode, "chroot") && argc > 2) {
        int r = chroot(argv[2]);
        printf("chroot %d, chdir %d\n", r, chdir("/"));
        touch();
    } else if (strcmp(mode, "touch")) {
        fprintf(stderr, "usage: statsdrop drop PATH | fork | chroot DIR | touch\n");
        return 2;
    }
    printf("done\n");
    return 0;
}
