/* Calls the kernel refuses on sealed memory (mseal(2), Linux 6.10) change nothing.
 *
 *   mseal map    64 MiB mapped and written, sealed, then munmap of all of it and of its middle,
 *                mremap and mprotect of another (each refused: EPERM), MADV_DONTNEED of a
 *                sealed read-only mapping (refused) and of a sealed writable one (allowed: it
 *                reads zero afterwards), munmap of a sealed mapping written in half
 *   mseal free   32 MiB malloc'd and written, 16 MiB of it (page aligned) sealed, the block
 *                freed (natively glibc's munmap is refused and the block stays), a calloc of the
 *                same size (zero), written: the sealed part keeps its bytes all along
 *   mseal realloc  such a block, all of it sealed, grown by realloc (natively a copy: the old
 *                block stays)
 *   mseal split  no seal: 64 MiB mapped and written, then one-page mappings (alternately
 *                read-only, so that none merges) until mmap fails at vm.max_map_count, then
 *                munmap of 8 MiB in the middle of the 64 MiB, which would split it: refused
 *                (ENOMEM), the bytes stay
 *
 * Each check prints the call's result and how many pages (one byte each) lost their bytes.
 * Natively every call gives the result above and no page changes; exit 0. A kernel without
 * mseal prints "mseal: unsupported" and exits 3. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MB ((size_t)1 << 20)
#define SYS_MSEAL 462

/* Read through a volatile pointer: the compiler may not assume what memset left there (it
 * would, for a block passed to realloc or free). */
static size_t differ(const volatile unsigned char *p, size_t len, unsigned char v) {
    size_t n = 0;
    for (size_t i = 0; i < len; i += 4096)
        n += p[i] != v;
    return n;
}

static int seal(void *p, size_t len) {
    if (syscall(SYS_MSEAL, p, len, 0) == 0)
        return 0;
    printf("mseal: %s\n", errno == ENOSYS ? "unsupported" : strerror(errno));
    exit(3);
}

static unsigned char *written(size_t len, unsigned char v) {
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        exit(2);
    memset(p, v, len);
    return p;
}

#define SHOW(what, r) printf("%s: %ld %s", what, (long)(r), (r) != 0 ? strerror(errno) : "ok")

static void maps(void) {
    size_t len = 64 * MB;
    unsigned char *p = written(len, 0xAB);
    seal(p, len);
    errno = 0;
    SHOW("munmap whole", munmap(p, len));
    printf(", changed %zu\n", differ(p, len, 0xAB));
    errno = 0;
    SHOW("munmap middle", munmap(p + 8 * MB, 8 * MB));
    printf(", changed %zu\n", differ(p, len, 0xAB));
    unsigned char *m = written(len, 0xCD);
    seal(m, len);
    errno = 0;
    void *q = mremap(m, len, 2 * len, MREMAP_MAYMOVE);
    printf("mremap: %s, changed %zu\n", q == MAP_FAILED ? strerror(errno) : "moved", differ(m, len, 0xCD));
    errno = 0;
    SHOW("mprotect", mprotect(m, len, PROT_READ));
    printf(", changed %zu\n", differ(m, len, 0xCD));
    unsigned char *r = written(len, 0x33);
    mprotect(r, len, PROT_READ);
    seal(r, len);
    errno = 0;
    SHOW("madvise DONTNEED read-only", madvise(r, len, MADV_DONTNEED));
    printf(", changed %zu\n", differ(r, len, 0x33));
    errno = 0;
    SHOW("madvise DONTNEED writable", madvise(p, len, MADV_DONTNEED));
    printf(", not zero %zu\n", differ(p, len, 0));
    unsigned char *u = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(u, 0x11, len / 2);
    seal(u, len);
    errno = 0;
    SHOW("munmap half written", munmap(u, len));
    printf(", changed %zu + %zu\n", differ(u, len / 2, 0x11), differ(u + len / 2, len / 2, 0));
}

/* A written block with `sealed` bytes of it sealed from its first whole page: returns the
 * sealed part. */
static unsigned char *sealed_block(unsigned char **block, size_t len, size_t sealed) {
    unsigned char *b = malloc(len);
    if (!b)
        exit(2);
    memset(b, 0x5A, len);
    unsigned char *part = (unsigned char *)(((uintptr_t)b + 4095) & ~(uintptr_t)4095);
    seal(part, sealed);
    *block = b;
    return part;
}

static void frees(void) {
    size_t len = 32 * MB;
    unsigned char *b, *part = sealed_block(&b, len, 16 * MB);
    free(b);
    printf("free: sealed part changed %zu\n", differ(part, 16 * MB, 0x5A));
    unsigned char *c = calloc(1, len);
    printf("calloc: %s, not zero %zu\n", c ? "ok" : "NULL", c ? differ(c, len, 0) : 0);
    if (c)
        memset(c, 1, len);
    printf("after writing it: sealed part changed %zu\n", differ(part, 16 * MB, 0x5A));
}

static void reallocs(void) {
    size_t len = 32 * MB;
    /* All of it sealed (glibc's chunk ends one page after its first whole page + len). */
    unsigned char *b, *part = sealed_block(&b, len, len);
    /* Something right after the block, so that it cannot grow in place (kept in a volatile,
     * or the compiler drops a malloc whose block is only freed). */
    static void *volatile after;
    after = malloc(32 * MB);
    unsigned char *n = realloc(b, 4 * len);
    printf("realloc: %s, kept %zu of %zu changed\n", n ? "ok" : "NULL", n ? differ(n, len, 0x5A) : 0, len / 4096);
    printf("sealed part changed %zu\n", differ(part, len, 0x5A));
    free(after);
}

static void split(void) {
    size_t len = 64 * MB, n = 0, cap = 1 << 20;
    unsigned char *p = written(len, 0x77);
    void **small = mmap(NULL, cap * sizeof(void *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (small == MAP_FAILED)
        exit(2);
    while (n < cap) {
        void *s = mmap(NULL, 4096, n % 2 ? PROT_READ : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED)
            break;
        small[n++] = s;
    }
    errno = 0;
    int r = munmap(p + 24 * MB, 8 * MB);
    int e = errno;
    for (size_t i = 0; i < n; i++)
        munmap(small[i], 4096);
    errno = e;
    SHOW("munmap that splits, at the limit", r);
    printf(", changed %zu\n", differ(p, len, 0x77));
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    /* The engine starts with a first large request. */
    char *w = malloc(32 * MB);
    memset(w, 7, 32 * MB);
    free(w);
    const char *mode = argc > 1 ? argv[1] : "map";
    if (!strcmp(mode, "map"))
        maps();
    else if (!strcmp(mode, "free"))
        frees();
    else if (!strcmp(mode, "realloc"))
        reallocs();
    else if (!strcmp(mode, "split"))
        split();
    else
        return 2;
    return 0;
}
