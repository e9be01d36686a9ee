/* Exits beside a busy machine: how long until the process is gone.
 *
 *   exits loop MiB ROUNDS   ROUNDS times: mmap MiB, write every page, munmap; return from main
 *   exits hold MiB          mmap MiB, write every page, print "ready", wait to be killed
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

static char *written(size_t len) {
    char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    for (size_t i = 0; i < len; i += 4096) p[i] = 1;
    return p;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "loop")) {
        size_t len = strtoul(argv[2], 0, 10) << 20;
        for (int r = atoi(argv[3]); r > 0; r--) munmap(written(len), len);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "hold")) {
        written(strtoul(argv[2], 0, 10) << 20);
        printf("ready\n");
        fflush(stdout);
        for (;;) pause();
    }
    fprintf(stderr, "usage: exits loop MiB ROUNDS | exits hold MiB\n");
    return 2;
}
