/* Large blocks written in the parent and in a fork()ed child, which then exec()s; a second
 * child made with vfork() execs at once. Prints checksums; the output must not depend on the
 * shim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned long fill(unsigned char *p, size_t len, unsigned char seed) {
    unsigned long sum = 0;
    for (size_t i = 0; i < len; i += 4096) { p[i] = (unsigned char)(seed + i / 4096); }
    for (size_t i = 0; i < len; i += 512) sum += p[i];
    return sum;
}

int main(int argc, char **argv) {
    if (argc > 1) { printf("exec'd: %s\n", argv[1]); return 0; }
    size_t len = 64u << 20;
    unsigned char *a = calloc(1, len);
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!a || m == MAP_FAILED) return 1;
    printf("parent before fork: %lu %lu\n", fill(a, len / 2, 1), fill(m, len / 2, 2));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *b = malloc(len);
        memset(b, 0, len);
        unsigned long s = fill(b, len, 3) + fill(a + len / 2, len / 2, 4) + fill(m, len, 5);
        printf("child: %lu, first byte of parent's block %u\n", s, a[0]);
        fflush(stdout);
        free(b);
        execl("/proc/self/exe", argv[0], "from the child", (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    printf("child status %d\n", WEXITSTATUS(st));
    printf("parent after fork: %lu %lu\n", fill(a + len / 2, len / 2, 6), fill(m, len, 7));
    fflush(stdout);
    pid = vfork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "from a vfork child", (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &st, 0);
    printf("vfork child status %d\n", WEXITSTATUS(st));
    free(a);
    munmap(m, len);
    return 3;
}
