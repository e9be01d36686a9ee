/* Freed memory under the shim: free() and munmap() of served memory recycle its pages, and
 * what the program sees is what it sees natively. Each check prints one line and exits
 * non-zero on the first wrong byte:
 *   malloc/free rounds: every block reads zero before it is written (calloc semantics are
 *     not asked for: large blocks of this shim are zero anyway, natively fresh mmaps are);
 *   mmap/munmap rounds: every mapping reads zero;
 *   a munmap punching a hole keeps both sides;
 *   a block freed while a forked child shares its pages: the child keeps its copy. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1UL << 20)

static int nonzero_page(const unsigned char *p, size_t len) {
    for (size_t i = 0; i < len; i += 4096)
        for (size_t j = 0; j < 4096; j += 512)
            if (p[i + j]) return (int)(i / 4096);
    return -1;
}

static void fill(unsigned char *p, size_t len, unsigned char v) {
    for (size_t i = 0; i < len; i += 512) p[i] = v;
}

int main(void) {
    size_t len = 64 * MIB;
    for (int r = 0; r < 6; r++) {
        unsigned char *p = malloc(len);
        if (!p) { perror("malloc"); return 1; }
        int bad = nonzero_page(p, len);
        if (bad >= 0) { printf("malloc round %d: page %d not zero\n", r, bad); return 2; }
        fill(p, len, (unsigned char)(r | 1));
        free(p);
    }
    printf("malloc/free rounds: zero\n");
    for (int r = 0; r < 6; r++) {
        unsigned char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); return 3; }
        fill(p, len, (unsigned char)(r | 1));
        if (munmap(p, len)) { perror("munmap"); return 4; }
        p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int bad = nonzero_page(p, len);
        if (bad >= 0) { printf("mmap round %d: page %d not zero\n", r, bad); return 5; }
        munmap(p, len);
    }
    printf("mmap/munmap rounds: zero\n");
    unsigned char *h = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fill(h, len, 0x5a);
    if (munmap(h + 16 * MIB, 16 * MIB)) { perror("munmap hole"); return 6; }
    for (size_t i = 0; i < len; i += 512)
        if ((i < 16 * MIB || i >= 32 * MIB) && h[i] != 0x5a) { printf("hole: byte %zu lost\n", i); return 7; }
    if (munmap(h + 1, 4096) != -1) { printf("an unaligned munmap succeeded\n"); return 8; }
    if (munmap(h, SIZE_MAX - 100) != -1) { printf("a munmap past the address space succeeded\n"); return 14; }
    munmap(h, 16 * MIB);
    munmap(h + 32 * MIB, len - 32 * MIB);
    printf("munmap of a hole: the rest kept\n");
    unsigned char *f = malloc(len);
    fill(f, len, 0x33);
    int fds[2];
    if (pipe(fds)) { perror("pipe"); return 9; }
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        if (read(fds[0], &c, 1) != 1) _exit(10);
        for (size_t i = 0; i < len; i += 512)
            if (f[i] != 0x33) _exit(11);
        _exit(0);
    }
    free(f);
    if (write(fds[1], "x", 1) != 1) return 12;
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) { printf("the forked child lost its copy (%d)\n", st); return 13; }
    printf("free while a child shares the block: the child keeps its copy\n");
    return 0;
}
