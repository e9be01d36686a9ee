/* Four threads allocate, fill, check and free blocks of 1 KiB..64 MiB (sizes spread evenly over
 * the 16 powers of two, from fixed seeds) for SECONDS seconds, through every entry point of the
 * malloc family: malloc; calloc, whose block must read zero; realloc, growing or shrinking, which
 * must keep the contents that stay; posix_memalign and aligned_alloc, whose alignment must hold.
 * Each thread keeps up to 16 blocks alive and checks every byte of a block before it lets go.
 *
 *   allocs SECONDS
 *
 * The amount of work depends on the machine, the output does not: one line per thread and the
 * total count of errors. What went wrong, and the number of operations, go to stderr. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "measure.h"

#define THREADS 4
#define SLOTS 16

struct block { unsigned char *p; size_t len; uint64_t tag; };
struct worker { int id; double until; long errors, ops; };

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* 1 KiB..64 MiB: a power of two from 2^10 to 2^25, then anything up to twice that. */
static size_t pick_size(uint64_t *s) {
    size_t base = (size_t)1 << (10 + next(s) % 16);
    return base + next(s) % base;
}

/* The contents of a block: 8-byte word i of the block tagged `tag`. */
static uint64_t word(uint64_t tag, size_t i) {
    uint64_t x = tag * 0x9E3779B97F4A7C15ull + i;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static unsigned char byte_at(uint64_t tag, size_t off) {
    return (unsigned char)(word(tag, off / 8) >> (off % 8 * 8));
}

static void fill(unsigned char *p, size_t from, size_t to, uint64_t tag) {
    size_t i = from;
    for (; i < to && i % 8; i++) p[i] = byte_at(tag, i);
    for (; i + 8 <= to; i += 8) {
        uint64_t w = word(tag, i / 8);
        memcpy(p + i, &w, 8);
    }
    for (; i < to; i++) p[i] = byte_at(tag, i);
}

/* The first offset in [from, to) that does not hold the pattern (zero when tag is 0), or to. */
static size_t check(const unsigned char *p, size_t from, size_t to, uint64_t tag) {
    size_t i = from;
    for (; i < to && i % 8; i++)
        if (p[i] != (tag ? byte_at(tag, i) : 0)) return i;
    for (; i + 8 <= to; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w != (tag ? word(tag, i / 8) : 0)) break;
    }
    for (; i < to; i++)
        if (p[i] != (tag ? byte_at(tag, i) : 0)) return i;
    return to;
}

static void *work(void *arg) {
    struct worker *w = arg;
    struct block b[SLOTS] = {{0}};
    uint64_t s = 0x2545F4914F6CDD1Dull * (w->id + 1), tags = 0;
    while (now() < w->until) {
        struct block *k = &b[next(&s) % SLOTS];
        w->ops++;
        if (k->p) {
            size_t bad = check(k->p, 0, k->len, k->tag);
            if (bad != k->len) {
                fprintf(stderr, "thread %d: block %p of %zu bytes differs at %zu\n", w->id, (void *)k->p,
                        k->len, bad);
                w->errors++;
            }
            if (next(&s) % 3 == 0) {
                size_t n = pick_size(&s), keep = n < k->len ? n : k->len;
                unsigned char *q = realloc(k->p, n);
                if (!q) {
                    fprintf(stderr, "thread %d: realloc(%zu -> %zu) failed\n", w->id, k->len, n);
                    w->errors++;
                    free(k->p);
                    k->p = NULL;
                    continue;
                }
                bad = check(q, 0, keep, k->tag);
                if (bad != keep) {
                    fprintf(stderr, "thread %d: realloc(%zu -> %zu) lost the contents at %zu\n", w->id,
                            k->len, n, bad);
                    w->errors++;
                }
                fill(q, keep, n, k->tag);
                k->p = q;
                k->len = n;
            } else {
                free(k->p);
                k->p = NULL;
            }
            continue;
        }
        size_t n = pick_size(&s), align = 16;
        void *p = NULL;
        int how = next(&s) % 4;
        if (how == 0) {
            p = malloc(n);
        } else if (how == 1) {
            p = calloc(n / 8 + 1, 8);
            n = (n / 8 + 1) * 8;
            size_t bad = p ? check(p, 0, n, 0) : n;
            if (p && bad != n) {
                fprintf(stderr, "thread %d: calloc'd %zu bytes not zero at %zu\n", w->id, n, bad);
                w->errors++;
            }
        } else if (how == 2) {
            align = (size_t)16 << (next(&s) % 18); /* 16 B .. 2 MiB */
            if (posix_memalign(&p, align, n) != 0) p = NULL;
        } else {
            align = (size_t)16 << (next(&s) % 18);
            n = (n + align - 1) / align * align;
            p = aligned_alloc(align, n);
        }
        if (!p) {
            fprintf(stderr, "thread %d: allocation %d of %zu bytes failed\n", w->id, how, n);
            w->errors++;
            continue;
        }
        if ((uintptr_t)p % align) {
            fprintf(stderr, "thread %d: %p is not aligned to %zu\n", w->id, p, align);
            w->errors++;
        }
        k->p = p;
        k->len = n;
        k->tag = ++tags * THREADS + w->id;
        fill(k->p, 0, n, k->tag);
    }
    for (int i = 0; i < SLOTS; i++) {
        if (!b[i].p) continue;
        if (check(b[i].p, 0, b[i].len, b[i].tag) != b[i].len) w->errors++;
        free(b[i].p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: allocs SECONDS\n"); return 2; }
    double until = now() + atof(argv[1]);
    struct worker w[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){.id = i, .until = until};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    long errors = 0, ops = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (w[i].errors) printf("thread %d: %ld errors\n", i, w[i].errors);
        else printf("thread %d: ok\n", i);
        errors += w[i].errors;
        ops += w[i].ops;
    }
    printf("errors: %ld\n", errors);
    fprintf(stderr, "allocs: %ld operations\n", ops);
    return errors ? 1 : 0;
}
