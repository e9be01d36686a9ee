/* A randomized stress of a program's own memory calls, every byte checked.
 *
 *   mmstress SECONDS [SEED]
 *
 * (SEED, 1 by default, seeds the threads' random choices; the threads' interleaving does the
 * rest.) One region of NCH chunks of 2 MiB. Each chunk holds either nothing (it must read zero) or the
 * pattern of one "salt" (a number never used twice), and has a lock: a thread works on a chunk
 * only while it holds its lock. Three kinds of threads run for SECONDS seconds:
 *
 * - touchers (TOUCHERS) stream through the chunks in order, skipping those another thread
 *   holds: each checks what the chunk must hold (zero, or its pattern), writes a new pattern and
 *   checks it. New memory, here and after the operations below, is read first or written first
 *   (one word per page, then the rest of the page checked zero), so that both read and write
 *   faults meet fresh memory.
 * - mm threads (MMERS) take a random chunk nobody holds and do a random operation on it (on all
 *   of it, or on random pages of it), then check all of it:
 *     madvise of every advice that applies to anonymous private memory: DONTNEED, FREE (then
 *       PAGEOUT in one variant: the freed pages are discarded at once), REMOVE (EINVAL on
 *       private memory), COLD, PAGEOUT, WILLNEED, SEQUENTIAL, RANDOM, NORMAL, HUGEPAGE,
 *       NOHUGEPAGE, COLLAPSE, WIPEONFORK, KEEPONFORK, DONTFORK, DOFORK, DONTDUMP, DODUMP,
 *       MERGEABLE (then UNMERGEABLE: see advise()), UNMERGEABLE (KSM may be compiled out:
 *       EINVAL), POPULATE_READ, POPULATE_WRITE;
 *     mprotect read-only, then none, then read-write; mlock (DONTNEED meanwhile must fail with
 *       EINVAL) and mlock2(MLOCK_ONFAULT) (FREE meanwhile must fail with EINVAL), then munlock;
 *     mmap MAP_FIXED over pages of the chunk, munmap then mmap MAP_FIXED, 64 KiB MAP_FIXED
 *       pieces then a move of the whole chunk;
 *     every form of mremap: MAYMOVE|FIXED away and back (the moved chunk is sometimes rewritten
 *       where it is), a range spanning two adjacent chunks moved away and back (both locked),
 *       DONTUNMAP to a given address (new_address with MREMAP_FIXED) and to one the kernel
 *       chooses (the old range stays, empty: it must read zero, and is sometimes written before
 *       the move back replaces it), shrink then grow in place, grow with MAYMOVE elsewhere
 *       (where the kernel chooses, or to a given address) and shrink back (in place and then
 *       moved back, or in one call);
 *     fork: the child checks the chunks the parent holds, as they were when it forked (pages
 *       under WIPEONFORK read zero, pages under DONTFORK are not mapped), overwrites them and
 *       exits; the parent then checks that its copy did not change.
 * - a 1 kHz SIGALRM interval timer (process-directed): the handler checks that it runs on one of
 *   this program's threads, checks that a fresh page of a dedicated 8 MiB buffer reads zero,
 *   fills it and checks it; when the buffer is full it checks every page still holds what was
 *   written and drops the buffer with MADV_DONTNEED.
 *
 * What is checked: every 8-byte word of a chunk, so every byte. A pattern word is a hash of the
 * salt and the word's offset with every byte non-zero, so a zeroed byte, a page from another
 * chunk, a stale page from an earlier pattern of the same chunk, and a page moved to the wrong
 * offset all fail.
 *
 * The region lives at a fixed address far below where the kernel places mappings (which it does
 * top-down from below the stack), so the holes an operation leaves for a moment (munmap before
 * MAP_FIXED, a chunk moved away) are never taken by another thread's mmap(NULL) or mremap
 * MAYMOVE; a chunk grown with MAYMOVE holds the lock of the next chunk, so that it cannot grow
 * into it in place.
 *
 * Output: "mmstress: ok" on stdout, or "mmstress: FAILED". Each failure is one line on stderr
 * naming the chunk, what was checked, the words that differ (how many, the first one with the
 * value read and the one wanted, the span and how many of the pages are all zero) and the last
 * operations on the chunk. stderr then gives the count of each operation (with the errors the
 * kernel may give, such as EBUSY from COLLAPSE, counted apart), and last "fails=N". Exit status
 * 0 when nothing failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "measure.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

#define PAGE ((size_t)4096)
#define CH ((size_t)2 << 20)      /* a chunk */
#define PPC (CH / PAGE)           /* pages per chunk */
#define WPP (PAGE / 8)            /* words per page */
#define NCH 128                   /* chunks: 256 MiB */
#define TOUCHERS 3
#define MMERS 3
#define HIST 8                    /* operations remembered per chunk */
#define BASE ((uintptr_t)0x40000000000) /* 4 TiB */
#define SLOT (8 * CH)             /* an mm thread's scratch slot (a placeholder of 2 chunks) */
#define SIGBUF ((size_t)8 << 20)

#define OPS(X)                                                                                    \
    X(FILL, "fill") X(DONTNEED, "DONTNEED") X(FREE, "FREE") X(FREE_PAGEOUT, "FREE+PAGEOUT")        \
    X(REMOVE, "REMOVE") X(COLD, "COLD") X(PAGEOUT, "PAGEOUT") X(WILLNEED, "WILLNEED")              \
    X(SEQUENTIAL, "SEQUENTIAL") X(RANDOM, "RANDOM") X(NORMAL, "NORMAL") X(HUGEPAGE, "HUGEPAGE")    \
    X(NOHUGEPAGE, "NOHUGEPAGE") X(COLLAPSE, "COLLAPSE") X(WIPEONFORK, "WIPEONFORK")                \
    X(KEEPONFORK, "KEEPONFORK") X(DONTFORK, "DONTFORK") X(DOFORK, "DOFORK")                        \
    X(DONTDUMP, "DONTDUMP") X(DODUMP, "DODUMP") X(MERGEABLE, "MERGEABLE")                          \
    X(UNMERGEABLE, "UNMERGEABLE") X(POPULATE_READ, "POPULATE_READ")                                \
    X(POPULATE_WRITE, "POPULATE_WRITE") X(MPROTECT, "mprotect") X(MLOCK, "mlock")                  \
    X(MLOCK_ONFAULT, "mlock2_ONFAULT") X(MAP_FIXED, "mmap_FIXED") X(MUNMAP_MAP, "munmap+mmap")     \
    X(PIECES_MOVE, "pieces+move") X(MOVE, "mremap_FIXED") X(MOVE2, "mremap_2chunks")               \
    X(DONTUNMAP, "mremap_DONTUNMAP_FIXED") X(DONTUNMAP_ANY, "mremap_DONTUNMAP")                    \
    X(SHRINK_GROW, "mremap_shrink+grow") X(GROW_MOVE, "mremap_grow_MAYMOVE") X(FORK, "fork")

#define ENUM(e, s) OP_##e,
#define NAME(e, s) s,
enum { OPS(ENUM) NOPS };
static const char *opname[NOPS] = {OPS(NAME)};

/* The errors the kernel may give for an operation that are not failures: counted apart. */
static const int soft_errno[] = {EINVAL, EAGAIN, EBUSY, EFAULT, ENOMEM, EPERM};
#define NSOFT 6
static const char *soft_name[NSOFT] = {"EINVAL", "EAGAIN", "EBUSY", "EFAULT", "ENOMEM", "EPERM"};

struct event { uint8_t op, who; uint16_t at, pages; uint32_t salt; };

struct chunk {
    _Atomic int lock;
    uint32_t salt;                  /* 0: reads zero */
    uint64_t wipe[PPC / 64];        /* pages under MADV_WIPEONFORK */
    uint64_t dfork[PPC / 64];       /* pages under MADV_DONTFORK */
    int huge;                       /* 0, or the last of MADV_HUGEPAGE / MADV_NOHUGEPAGE */
    unsigned nhist;
    struct event hist[HIST];
};

static uint8_t *R;                  /* the region */
static struct chunk ch[NCH];
static _Atomic uint32_t salts;
static _Atomic int stop;
static _Atomic long fails;
static _Atomic long count[NOPS], soft[NOPS][NSOFT], freed_zero, grow_fallback;
static int strict_moves;            /* Linux >= 6.17 moves ranges of several VMAs */
static pid_t tids[1 + TOUCHERS + MMERS];
static _Atomic int ntids;
static uint64_t seed = 1;
static _Atomic long progress[TOUCHERS + MMERS]; /* operations done, per thread */

/* ---- the pattern ---------------------------------------------------------------------------- */

/* Word w (0..CH/8) of a chunk holding salt s: never zero in any byte. */
static inline uint64_t word(uint32_t s, size_t w) {
    uint64_t x = ((uint64_t)s << 32 | w) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return x | 0x0101010101010101ull;
}

static inline uint64_t want(uint32_t s, size_t w) { return s ? word(s, w) : 0; }

/* Writes salt s's pattern over byte offsets [from, to) of a chunk whose offset 0 is at m. */
static void fill(uint8_t *m, size_t from, size_t to, uint32_t s) {
    uint64_t *q = (uint64_t *)m;
    for (size_t w = from / 8; w < to / 8; w++) q[w] = word(s, w);
}

static uint32_t new_salt(void) {
    uint32_t s;
    while ((s = ++salts) == 0) {}
    return s;
}

static uint64_t next(uint64_t *r) {
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    return *r;
}

/* ---- failure lines, async-signal-safe (the fork child and the fault handler use them) ------- */

struct line { char b[2048]; size_t n; };

static void put_s(struct line *l, const char *s) {
    while (*s && l->n < sizeof l->b - 2) l->b[l->n++] = *s++;
}
static void put_x(struct line *l, uint64_t v) {
    char t[19];
    int i = 18;
    t[i] = 0;
    do t[--i] = "0123456789abcdef"[v & 15]; while ((v >>= 4) && i > 2);
    t[--i] = 'x';
    t[--i] = '0';
    put_s(l, t + i);
}
static void put_u(struct line *l, uint64_t v) {
    char t[21];
    int i = 20;
    t[i] = 0;
    do t[--i] = (char)('0' + v % 10); while ((v /= 10) && i > 0);
    put_s(l, t + i);
}
static void emit(struct line *l) {
    l->b[l->n++] = '\n';
    for (size_t o = 0; o < l->n;) {
        ssize_t k = write(2, l->b + o, l->n - o);
        if (k <= 0 && errno != EINTR) break;
        if (k > 0) o += (size_t)k;
    }
    l->n = 0;
}
/* Touchers are t0.., mm threads m0.., the main thread "main". */
static void put_who(struct line *l, int who) {
    if (who >= TOUCHERS + MMERS) {
        put_s(l, "main");
        return;
    }
    put_s(l, who < TOUCHERS ? "t" : "m");
    put_u(l, (uint64_t)(who < TOUCHERS ? who : who - TOUCHERS));
}
/* The chunk's last operations, oldest first: NAME[@first_page+pages]/thread:salt. */
static void put_hist(struct line *l, int c) {
    struct chunk *k = &ch[c];
    unsigned n = k->nhist < HIST ? k->nhist : HIST;
    put_s(l, "; history:");
    for (unsigned i = k->nhist - n; i < k->nhist; i++) {
        struct event *e = &k->hist[i % HIST];
        put_s(l, " ");
        put_s(l, e->op < NOPS ? opname[e->op] : "?");
        if (e->pages != PPC) {
            put_s(l, "@");
            put_u(l, e->at);
            put_s(l, "+");
            put_u(l, e->pages);
        }
        put_s(l, "/");
        put_who(l, e->who);
        put_s(l, ":");
        put_u(l, e->salt);
    }
}

static void record(int c, int op, int who, size_t at, size_t pages) {
    struct chunk *k = &ch[c];
    k->hist[k->nhist++ % HIST] = (struct event){(uint8_t)op, (uint8_t)who, (uint16_t)at, (uint16_t)pages, k->salt};
}

/* ---- checks ---------------------------------------------------------------------------------- */

/* Compares byte offsets [from, to) of chunk c, whose offset 0 is now at m, with salt s (zero
 * when s is 0). On a difference: one failure line, and 1 returned. */
static int check_at(int c, const uint8_t *m, size_t from, size_t to, uint32_t s, int who, const char *what) {
    const uint64_t *q = (const uint64_t *)m;
    size_t bad = 0, first = 0, last = 0, pages = 0, zero_pages = 0;
    for (size_t pg = from / PAGE; pg * PAGE < to; pg++) {
        size_t lo = pg * PAGE > from ? pg * PAGE : from, hi = (pg + 1) * PAGE < to ? (pg + 1) * PAGE : to;
        size_t b = 0, z = 0;
        for (size_t w = lo / 8; w < hi / 8; w++) {
            uint64_t v = q[w];
            z += v == 0;
            if (v != want(s, w)) {
                if (!bad) first = w * 8;
                last = w * 8;
                bad++, b++;
            }
        }
        if (b) pages++, zero_pages += z == (hi - lo) / 8;
    }
    if (!bad) return 0;
    fails++;
    struct line l = {.n = 0};
    put_s(&l, "FAIL: chunk ");
    put_u(&l, (uint64_t)c);
    put_s(&l, " at ");
    put_x(&l, (uintptr_t)m);
    put_s(&l, " (");
    put_who(&l, who);
    put_s(&l, "), ");
    put_s(&l, what);
    put_s(&l, ": ");
    put_u(&l, bad);
    put_s(&l, " of ");
    put_u(&l, (to - from) / 8);
    put_s(&l, " words differ in [");
    put_x(&l, from);
    put_s(&l, ", ");
    put_x(&l, to);
    put_s(&l, "), first at ");
    put_x(&l, first);
    put_s(&l, " got ");
    put_x(&l, q[first / 8]);
    put_s(&l, " want ");
    put_x(&l, want(s, first / 8));
    put_s(&l, " (salt ");
    put_u(&l, s);
    put_s(&l, "), last at ");
    put_x(&l, last);
    put_s(&l, ", ");
    put_u(&l, pages);
    put_s(&l, " pages differ, ");
    put_u(&l, zero_pages);
    put_s(&l, " of them all zero");
    put_hist(&l, c);
    emit(&l);
    return 1;
}

static int check(int c, size_t from, size_t to, uint32_t s, int who, const char *what) {
    return check_at(c, R + c * CH, from, to, s, who, what);
}

/* The pages of chunk c outside [a, a+n) must read salt s. */
static int check_outside(int c, const uint8_t *m, size_t a, size_t n, uint32_t s, int who, const char *what) {
    int bad = 0;
    if (a) bad |= check_at(c, m, 0, a * PAGE, s, who, what);
    if (a + n < PPC) bad |= check_at(c, m, (a + n) * PAGE, CH, s, who, what);
    return bad;
}

/* Pages [a, a+n) of chunk c (offset 0 at m) are new memory: they must read zero. Then they are
 * written with salt s (left as they are when s is 0). Half the time they are read first (read
 * faults on fresh memory); else each page is written first, one word at a random offset (a write
 * fault), and the rest of it is checked zero before it is written. */
static int fresh(int c, uint8_t *m, size_t a, size_t n, uint32_t s, uint64_t *r, int who, const char *what) {
    if (!s || next(r) & 1) {
        int bad = check_at(c, m, a * PAGE, (a + n) * PAGE, 0, who, what);
        if (s) fill(m, a * PAGE, (a + n) * PAGE, s);
        return bad;
    }
    int bad = 0;
    uint64_t *q = (uint64_t *)m;
    for (size_t pg = a; pg < a + n; pg++) {
        size_t w0 = pg * WPP + (size_t)(next(r) % WPP);
        q[w0] = word(s, w0);
        for (size_t w = pg * WPP; w < (pg + 1) * WPP; w++)
            if (w != w0 && q[w]) {
                q[w0] = 0; /* report the page as it was found */
                bad |= check_at(c, m, pg * PAGE, (pg + 1) * PAGE, 0, who, what);
                break;
            }
        fill(m, pg * PAGE, (pg + 1) * PAGE, s);
    }
    return bad;
}

/* A failed call that must not fail, or an unexpected result: one line. */
static void fail_call(int c, int who, const char *what, long rc, int err) {
    fails++;
    struct line l = {.n = 0};
    put_s(&l, "FAIL: chunk ");
    put_u(&l, (uint64_t)c);
    put_s(&l, " (");
    put_who(&l, who);
    put_s(&l, "), ");
    put_s(&l, what);
    put_s(&l, " returned ");
    put_x(&l, (uint64_t)rc);
    put_s(&l, " errno ");
    put_s(&l, strerrorname_np(err) ? strerrorname_np(err) : "?");
    put_hist(&l, c);
    emit(&l);
}

/* The result of a call that may give one of the soft errors: 0 if it succeeded or gave one of
 * them (counted), else a failure. */
static int soft_ok(int op, int c, int who, const char *what, long rc, int err, const int *allowed) {
    if (rc == 0) return 0;
    for (const int *a = allowed; *a; a++)
        if (*a == err)
            for (int i = 0; i < NSOFT; i++)
                if (soft_errno[i] == err) {
                    soft[op][i]++;
                    return 1;
                }
    fail_call(c, who, what, rc, err);
    return 1;
}

static const int none[] = {0};

/* Whether [p, p+len) is all mapped (mincore fails with ENOMEM on a hole). */
static int mapped(const void *p, size_t len) {
    unsigned char v[PPC * 2];
    return mincore((void *)p, len, v) == 0;
}

/* /proc/self/maps around the region, to stderr (after a move that must not fail did). */
static void dump_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char s[512];
    while (f && fgets(s, sizeof s, f)) {
        unsigned long a, b;
        if (sscanf(s, "%lx-%lx", &a, &b) == 2 && b > BASE && a < BASE + (NCH + 16 + 8 * MMERS) * CH)
            fprintf(stderr, "  %s", s);
    }
    if (f) fclose(f);
}

/* ---- locks ----------------------------------------------------------------------------------- */

static int trylock(int c) {
    int z = 0;
    return atomic_compare_exchange_strong(&ch[c].lock, &z, 1);
}
static void unlock(int c) { atomic_store(&ch[c].lock, 0); }

/* ---- the page flags the fork child needs ----------------------------------------------------- */

static void set_bits(uint64_t *b, size_t a, size_t n, int on) {
    for (size_t i = a; i < a + n; i++) {
        if (on) b[i / 64] |= 1ull << (i % 64);
        else b[i / 64] &= ~(1ull << (i % 64));
    }
}
static int bit(const uint64_t *b, size_t i) { return b[i / 64] >> (i % 64) & 1; }

/* ---- the touchers ---------------------------------------------------------------------------- */

static void *toucher(void *arg) {
    int who = (int)(intptr_t)arg;
    tids[atomic_fetch_add(&ntids, 1)] = (pid_t)syscall(SYS_gettid);
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(who + 1) ^ seed << 32;
    for (int c = who * NCH / TOUCHERS; !stop; c = (c + 1) % NCH) {
        if (!trylock(c)) continue;
        struct chunk *k = &ch[c];
        uint8_t *p = R + c * CH;
        uint32_t s = k->salt, t = new_salt();
        if (s) {
            check(c, 0, CH, s, who, "toucher: the chunk's pattern");
            fill(p, 0, CH, t);
        } else {
            fresh(c, p, 0, PPC, t, &r, who, "toucher: a fresh chunk reads zero");
        }
        k->salt = t;
        check(c, 0, CH, t, who, "toucher: the pattern just written");
        record(c, OP_FILL, who, 0, PPC);
        count[OP_FILL]++;
        progress[who]++;
        unlock(c);
    }
    return NULL;
}

/* ---- the mm threads -------------------------------------------------------------------------- */

struct mm { int who; uint64_t r; uint8_t *sc; };

/* A page range of a chunk: all of it half the time, else random pages [*a, *a + *n). */
static void pick(uint64_t *r, size_t *a, size_t *n) {
    if (next(r) & 1) {
        *a = 0, *n = PPC;
        return;
    }
    size_t x = next(r) % PPC, y = next(r) % PPC;
    if (x > y) {
        size_t t = x;
        x = y, y = t;
    }
    *a = x, *n = y - x + 1;
}

static void placeholder(uint8_t *sc) {
    if (mmap(sc, 2 * CH, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) != sc) {
        perror("mmstress: scratch placeholder");
        _exit(2);
    }
}

/* The chunk's VMA flags made the same over all of it (so that its pieces merge where they can):
 * before the operations that resize, which the kernel does on one VMA only. */
static void normalize(int c, int who) {
    uint8_t *p = R + c * CH;
    static const int advice[] = {MADV_KEEPONFORK, MADV_DOFORK, MADV_DODUMP, MADV_NORMAL};
    for (size_t i = 0; i < sizeof advice / sizeof *advice; i++) {
        int rc = madvise(p, CH, advice[i]);
        if (rc) fail_call(c, who, "madvise (normalize)", rc, errno);
    }
    int rc = madvise(p, CH, MADV_UNMERGEABLE);
    if (rc && errno != EINVAL) fail_call(c, who, "madvise UNMERGEABLE (normalize)", rc, errno);
    if (ch[c].huge) {
        rc = madvise(p, CH, ch[c].huge);
        if (rc && errno != EINVAL) fail_call(c, who, "madvise huge advice (normalize)", rc, errno);
    }
    memset(ch[c].wipe, 0, sizeof ch[c].wipe);
    memset(ch[c].dfork, 0, sizeof ch[c].dfork);
}

/* Rewrites a chunk with a fresh pattern after a failure, so that one damage is reported once. */
static void resync(int c) {
    ch[c].salt = new_salt();
    fill(R + c * CH, 0, CH, ch[c].salt);
}

/* madvise with one advice over pages [a, a+n) of chunk c, then the whole chunk checked. */
static int advise(struct mm *t, int op, int c) {
    static const int advice[NOPS] = {
        [OP_REMOVE] = MADV_REMOVE, [OP_COLD] = MADV_COLD, [OP_PAGEOUT] = MADV_PAGEOUT,
        [OP_WILLNEED] = MADV_WILLNEED, [OP_SEQUENTIAL] = MADV_SEQUENTIAL, [OP_RANDOM] = MADV_RANDOM,
        [OP_NORMAL] = MADV_NORMAL, [OP_HUGEPAGE] = MADV_HUGEPAGE, [OP_NOHUGEPAGE] = MADV_NOHUGEPAGE,
        [OP_COLLAPSE] = MADV_COLLAPSE, [OP_WIPEONFORK] = MADV_WIPEONFORK, [OP_KEEPONFORK] = MADV_KEEPONFORK,
        [OP_DONTFORK] = MADV_DONTFORK, [OP_DOFORK] = MADV_DOFORK, [OP_DONTDUMP] = MADV_DONTDUMP,
        [OP_DODUMP] = MADV_DODUMP, [OP_MERGEABLE] = MADV_MERGEABLE, [OP_UNMERGEABLE] = MADV_UNMERGEABLE,
        [OP_POPULATE_READ] = MADV_POPULATE_READ, [OP_POPULATE_WRITE] = MADV_POPULATE_WRITE,
    };
    static const int thp[] = {EINVAL, 0}, collapse[] = {EINVAL, EAGAIN, EBUSY, ENOMEM, 0}, ksm[] = {EINVAL, 0};
    struct chunk *k = &ch[c];
    uint8_t *p = R + c * CH;
    size_t a = 0, n = PPC;
    int whole = op == OP_HUGEPAGE || op == OP_NOHUGEPAGE || op == OP_COLLAPSE;
    if (!whole) pick(&t->r, &a, &n);
    int rc = madvise(p + a * PAGE, n * PAGE, advice[op]), err = errno;
    const char *what = opname[op];
    if (op == OP_REMOVE) {
        if (rc != -1 || err != EINVAL) fail_call(c, t->who, "madvise REMOVE (must be EINVAL on private memory)", rc, err);
    } else if (op == OP_HUGEPAGE || op == OP_NOHUGEPAGE) {
        if (!soft_ok(op, c, t->who, what, rc, err, thp)) k->huge = advice[op];
    } else if (op == OP_COLLAPSE) {
        soft_ok(op, c, t->who, what, rc, err, collapse);
    } else if (op == OP_MERGEABLE || op == OP_UNMERGEABLE) {
        soft_ok(op, c, t->who, what, rc, err, ksm);
        if (op == OP_MERGEABLE) {
            /* Not left on: a move of several VMAs, one of them VM_MERGEABLE, is not restartable
             * (Linux 6.17+: the KSM unmerge before each VMA's move gives -ERESTARTSYS when a
             * signal is pending, after the first VMAs moved; the restarted call then finds the
             * start of the range gone and fails with EFAULT, the range split in two). */
            check(c, 0, CH, k->salt, t->who, what);
            rc = madvise(p + a * PAGE, n * PAGE, MADV_UNMERGEABLE);
            soft_ok(op, c, t->who, "UNMERGEABLE after MERGEABLE", rc, errno, ksm);
        }
    } else if (!soft_ok(op, c, t->who, what, rc, err, none)) {
        if (op == OP_WIPEONFORK || op == OP_KEEPONFORK) set_bits(k->wipe, a, n, op == OP_WIPEONFORK);
        if (op == OP_DONTFORK || op == OP_DOFORK) set_bits(k->dfork, a, n, op == OP_DONTFORK);
    }
    record(c, op, t->who, a, n);
    return check(c, 0, CH, k->salt, t->who, what);
}

/* DONTNEED, FREE, FREE then PAGEOUT over pages [a, a+n): they read zero (FREE: each page its
 * pattern or zero), the rest keeps its pattern; then the pages are written again. */
static int discard(struct mm *t, int op, int c) {
    struct chunk *k = &ch[c];
    uint8_t *p = R + c * CH;
    uint32_t s = k->salt;
    size_t a, n;
    pick(&t->r, &a, &n);
    int bad = 0, rc = madvise(p + a * PAGE, n * PAGE, op == OP_DONTNEED ? MADV_DONTNEED : MADV_FREE);
    if (rc) fail_call(c, t->who, op == OP_DONTNEED ? "madvise DONTNEED" : "madvise FREE", rc, errno);
    if (op == OP_FREE_PAGEOUT && (rc = madvise(p + a * PAGE, n * PAGE, MADV_PAGEOUT)))
        fail_call(c, t->who, "madvise PAGEOUT after FREE", rc, errno);
    record(c, op, t->who, a, n);
    if (op == OP_DONTNEED) {
        bad = check_outside(c, p, a, n, s, t->who, "DONTNEED: the rest is kept");
        if (!s && n == PPC && next(&t->r) & 1) s = k->salt = new_salt(); /* all of it is new */
        bad |= fresh(c, p, a, n, s, &t->r, t->who, "DONTNEED: the pages read zero");
    } else {
        /* Each freed page: all its pattern, or all zero (discarded). */
        for (size_t pg = a; pg < a + n; pg++) {
            const uint64_t *q = (const uint64_t *)(p + pg * PAGE);
            int zero = 1;
            for (size_t i = 0; i < WPP; i++) zero &= q[i] == 0;
            if (zero) {
                freed_zero++;
                continue;
            }
            bad |= check(c, pg * PAGE, (pg + 1) * PAGE, s, t->who, "FREE: a freed page holds its pattern or zero");
        }
        bad |= check_outside(c, p, a, n, s, t->who, "FREE: the pages not freed are kept");
        if (s) fill(p, a * PAGE, (a + n) * PAGE, s);
    }
    return bad | check(c, 0, CH, s, t->who, "rewritten after DONTNEED/FREE");
}

static int protect(struct mm *t, int c) {
    uint8_t *p = R + c * CH;
    uint32_t s = ch[c].salt;
    size_t a, n;
    pick(&t->r, &a, &n);
    int rc = mprotect(p + a * PAGE, n * PAGE, PROT_READ), bad = 0;
    if (rc) fail_call(c, t->who, "mprotect PROT_READ", rc, errno);
    bad |= check(c, 0, CH, s, t->who, "mprotect PROT_READ");
    if ((rc = mprotect(p + a * PAGE, n * PAGE, PROT_NONE))) fail_call(c, t->who, "mprotect PROT_NONE", rc, errno);
    if ((rc = mprotect(p + a * PAGE, n * PAGE, PROT_READ | PROT_WRITE)))
        fail_call(c, t->who, "mprotect PROT_READ|PROT_WRITE", rc, errno);
    record(c, OP_MPROTECT, t->who, a, n);
    bad |= check(c, 0, CH, s, t->who, "mprotect back to read-write");
    if (s) {
        fill(p, a * PAGE, (a + n) * PAGE, s);
        bad |= check(c, 0, CH, s, t->who, "rewritten after mprotect");
    }
    return bad;
}

/* mlock (or mlock2 MLOCK_ONFAULT) over pages [a, a+n); meanwhile DONTNEED (FREE) there must fail
 * with EINVAL and change nothing. */
static int lock(struct mm *t, int op, int c) {
    static const int limits[] = {ENOMEM, EPERM, EAGAIN, 0};
    uint8_t *p = R + c * CH;
    uint32_t s = ch[c].salt;
    size_t a, n;
    pick(&t->r, &a, &n);
    long rc = op == OP_MLOCK ? mlock(p + a * PAGE, n * PAGE) : mlock2(p + a * PAGE, n * PAGE, MLOCK_ONFAULT);
    int err = errno;
    record(c, op, t->who, a, n);
    if (soft_ok(op, c, t->who, op == OP_MLOCK ? "mlock" : "mlock2 MLOCK_ONFAULT", rc, err, limits))
        return check(c, 0, CH, s, t->who, opname[op]);
    int bad = check(c, 0, CH, s, t->who, op == OP_MLOCK ? "mlock" : "mlock2 MLOCK_ONFAULT");
    rc = madvise(p + a * PAGE, n * PAGE, op == OP_MLOCK ? MADV_DONTNEED : MADV_FREE);
    if (rc != -1 || errno != EINVAL)
        fail_call(c, t->who, "DONTNEED/FREE of locked memory (must be EINVAL)", rc, errno);
    bad |= check(c, 0, CH, s, t->who, "locked, after DONTNEED/FREE refused");
    if ((rc = munlock(p + a * PAGE, n * PAGE))) fail_call(c, t->who, "munlock", rc, errno);
    return bad;
}

/* New memory over pages [a, a+n): mmap MAP_FIXED over them, or munmap then mmap MAP_FIXED. */
static int remap(struct mm *t, int op, int c) {
    struct chunk *k = &ch[c];
    uint8_t *p = R + c * CH;
    uint32_t s = k->salt;
    size_t a, n;
    pick(&t->r, &a, &n);
    if (op == OP_MUNMAP_MAP) {
        int rc = munmap(p + a * PAGE, n * PAGE);
        if (rc) fail_call(c, t->who, "munmap", rc, errno);
    }
    void *q = mmap(p + a * PAGE, n * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (q != p + a * PAGE) {
        fail_call(c, t->who, "mmap MAP_FIXED", (long)q, errno);
        stop = 1;
        return 1;
    }
    set_bits(k->wipe, a, n, 0);
    set_bits(k->dfork, a, n, 0);
    if (n == PPC) s = k->salt = next(&t->r) & 1 ? new_salt() : 0; /* all of it is new */
    record(c, op, t->who, a, n);
    int bad = check_outside(c, p, a, n, s, t->who, "mmap MAP_FIXED: the rest is kept");
    bad |= fresh(c, p, a, n, s, &t->r, t->who, "mmap MAP_FIXED: new memory reads zero");
    return bad | check(c, 0, CH, s, t->who, "new memory written");
}

/* mremap of [old, old+len) to `to` with MAYMOVE|FIXED (and `extra` flags): a move that must
 * succeed on this kernel. On a failure the range is checked to be all there still (older
 * kernels refuse ranges of several VMAs, before moving any). */
static int move(struct mm *t, int op, int c, uint8_t *old, size_t len, uint8_t *to, int extra, const char *what) {
    void *q = mremap(old, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | extra, to);
    if (q == to) return 0;
    int err = errno;
    if (q != MAP_FAILED || strict_moves || err != EFAULT || !mapped(old, len)) {
        fail_call(c, t->who, what, (long)q, err);
        dump_maps();
        stop = 1;
        return -1;
    }
    soft[op][3]++;
    return 1;
}

/* The whole chunk moved away (sometimes rewritten there) and back. With `pieces`, 64 KiB pieces
 * of it are mapped again first (new VMAs, which merge with the rest or not). */
static int move_away(struct mm *t, int op, int c) {
    struct chunk *k = &ch[c];
    uint8_t *p = R + c * CH;
    int bad = 0;
    if (op == OP_PIECES_MOVE) {
        for (int i = 1 + (int)(next(&t->r) % 4); i > 0; i--) {
            size_t a = next(&t->r) % (PPC - 16);
            if (mmap(p + a * PAGE, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
                p + a * PAGE) {
                fail_call(c, t->who, "mmap MAP_FIXED of a 64 KiB piece", -1, errno);
                stop = 1;
                return 1;
            }
            set_bits(k->wipe, a, 16, 0);
            set_bits(k->dfork, a, 16, 0);
            bad |= check_outside(c, p, a, 16, k->salt, t->who, "a 64 KiB piece mapped: the rest is kept");
            bad |= fresh(c, p, a, 16, k->salt, &t->r, t->who, "a new 64 KiB piece reads zero");
        }
    }
    record(c, op, t->who, 0, PPC);
    int r = move(t, op, c, p, CH, t->sc, 0, "mremap MAYMOVE|FIXED away");
    if (r < 0) return 1;
    if (r == 0) {
        bad |= check_at(c, t->sc, 0, CH, k->salt, t->who, "moved away");
        if (next(&t->r) & 1) {
            k->salt = new_salt();
            fill(t->sc, 0, CH, k->salt);
        }
        if (move(t, op, c, t->sc, CH, p, 0, "mremap MAYMOVE|FIXED back") < 0) return 1;
        placeholder(t->sc);
    }
    return bad | check(c, 0, CH, k->salt, t->who, "moved back");
}

/* A range spanning chunks c and c+1 (both of them, or CH bytes across their border) moved away
 * and back, with MREMAP_DONTUNMAP half the time. */
static int move_two(struct mm *t, int c) {
    struct chunk *k = &ch[c], *k1 = &ch[c + 1];
    uint8_t *p = R + c * CH;
    size_t o = next(&t->r) & 1 ? 0 : (1 + next(&t->r) % (PPC - 1)) * PAGE, len = o ? CH : 2 * CH;
    int dontunmap = next(&t->r) & 1, bad = 0;
    record(c, OP_MOVE2, t->who, o / PAGE, (CH - o) / PAGE);
    record(c + 1, OP_MOVE2, t->who, 0, (o + len - CH) / PAGE);
    int r = move(t, OP_MOVE2, c, p + o, len, t->sc, dontunmap ? MREMAP_DONTUNMAP : 0, "mremap of two chunks away");
    if (r < 0) return 1;
    if (r == 0) {
        bad |= check_at(c, t->sc - o, o, CH, k->salt, t->who, "first chunk's part, moved");
        bad |= check_at(c + 1, t->sc + (CH - o), 0, o + len - CH, k1->salt, t->who, "second chunk's part, moved") << 1;
        if (dontunmap) {
            bad |= check(c, o, CH, 0, t->who, "DONTUNMAP: the old range reads zero");
            bad |= check(c + 1, 0, o + len - CH, 0, t->who, "DONTUNMAP: the old range reads zero") << 1;
            if (next(&t->r) & 1) fill(p + o, 0, len, new_salt()); /* replaced by the move back */
        }
        if (move(t, OP_MOVE2, c, t->sc, len, p + o, 0, "mremap of two chunks back") < 0) return 1;
        placeholder(t->sc);
    }
    bad |= check(c, 0, CH, k->salt, t->who, "moved back (first chunk)");
    bad |= check(c + 1, 0, CH, k1->salt, t->who, "moved back (second chunk)") << 1;
    return bad;
}

/* MREMAP_DONTUNMAP to the scratch slot (FIXED) or where the kernel chooses; the old range stays,
 * empty, and is sometimes written before the move back replaces it. */
static int dontunmap(struct mm *t, int op, int c) {
    struct chunk *k = &ch[c];
    uint8_t *p = R + c * CH;
    int bad = 0;
    record(c, op, t->who, 0, PPC);
    uint8_t *q;
    if (op == OP_DONTUNMAP) {
        int r = move(t, op, c, p, CH, t->sc, MREMAP_DONTUNMAP, "mremap DONTUNMAP|FIXED away");
        if (r < 0) return 1;
        if (r > 0) return check(c, 0, CH, k->salt, t->who, "refused DONTUNMAP");
        q = t->sc;
    } else {
        /* new_address is read with DONTUNMAP too (as a hint): it must be given, aligned. */
        q = mremap(p, CH, CH, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
        if (q == MAP_FAILED && errno == EFAULT && mapped(p, CH)) { /* the chunk is several VMAs */
            soft[op][3]++;
            return check(c, 0, CH, k->salt, t->who, "refused DONTUNMAP");
        }
        if (q == MAP_FAILED) {
            fail_call(c, t->who, "mremap MAYMOVE|DONTUNMAP", -1, errno);
            dump_maps();
            stop = 1;
            return 1;
        }
    }
    bad |= check_at(c, q, 0, CH, k->salt, t->who, "DONTUNMAP: moved");
    bad |= check(c, 0, CH, 0, t->who, "DONTUNMAP: the old range reads zero");
    if (next(&t->r) & 1) {
        size_t a, n;
        pick(&t->r, &a, &n);
        fill(p, a * PAGE, (a + n) * PAGE, new_salt());
    }
    if (move(t, op, c, q, CH, p, 0, "mremap MAYMOVE|FIXED back after DONTUNMAP") < 0) return 1;
    if (q == t->sc) placeholder(t->sc);
    return bad | check(c, 0, CH, k->salt, t->who, "back after DONTUNMAP");
}

/* Shrunk to its first k pages, then grown in place again (or, where the kernel refuses because
 * the pages are several VMAs, the rest mapped with MAP_FIXED): the rest reads zero. */
static int shrink_grow(struct mm *t, int c) {
    struct chunk *k = &ch[c];
    uint8_t *p = R + c * CH;
    size_t keep = 1 + next(&t->r) % (PPC - 1);
    normalize(c, t->who);
    record(c, OP_SHRINK_GROW, t->who, 0, keep);
    void *q = mremap(p, CH, keep * PAGE, 0);
    if (q != p) {
        fail_call(c, t->who, "mremap shrink", (long)q, errno);
        stop = 1;
        return 1;
    }
    q = mremap(p, keep * PAGE, CH, 0);
    if (q != p) {
        static const int refused[] = {EFAULT, ENOMEM, 0};
        soft_ok(OP_SHRINK_GROW, c, t->who, "mremap grow in place", -1, errno, refused);
        grow_fallback++;
        if (mmap(p + keep * PAGE, CH - keep * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) != p + keep * PAGE) {
            fail_call(c, t->who, "mmap MAP_FIXED after a refused grow", -1, errno);
            stop = 1;
            return 1;
        }
    }
    int bad = check(c, 0, keep * PAGE, k->salt, t->who, "shrunk and grown: the part kept");
    bad |= fresh(c, p, keep, PPC - keep, k->salt, &t->r, t->who, "shrunk and grown: the grown part reads zero");
    return bad | check(c, 0, CH, k->salt, t->who, "grown part written");
}

/* Grown to two chunks with MAYMOVE (where the kernel chooses, or to the scratch slot), the new
 * part checked zero and written, then shrunk back and moved home (in place then moved, or in
 * one call). The caller holds the next chunk too, so that the grow cannot happen in place. */
static int grow_move(struct mm *t, int c) {
    struct chunk *k = &ch[c];
    uint8_t *p = R + c * CH;
    normalize(c, t->who);
    record(c, OP_GROW_MOVE, t->who, 0, PPC);
    int fixed = next(&t->r) & 1, bad = 0;
    uint8_t *q = fixed ? mremap(p, CH, 2 * CH, MREMAP_MAYMOVE | MREMAP_FIXED, t->sc) : mremap(p, CH, 2 * CH, MREMAP_MAYMOVE);
    if (q == MAP_FAILED) {
        static const int refused[] = {EFAULT, 0}; /* the chunk is several VMAs */
        int err = errno;
        soft_ok(OP_GROW_MOVE, c, t->who, "mremap grow MAYMOVE", -1, err, refused);
        if (err == EFAULT && !mapped(p, CH)) {
            fail_call(c, t->who, "mremap grow MAYMOVE failed and left the chunk unmapped", -1, err);
            dump_maps();
            stop = 1;
            return 1;
        }
        return check(c, 0, CH, k->salt, t->who, "refused grow");
    }
    if (q == p || (fixed && q != t->sc)) {
        fail_call(c, t->who, "mremap grow MAYMOVE (in place, or not where asked)", (long)q, 0);
        stop = 1;
        return 1;
    }
    bad |= check_at(c, q, 0, CH, k->salt, t->who, "grown and moved: the old part");
    bad |= fresh(c, q + CH, 0, PPC, new_salt(), &t->r, t->who, "grown and moved: the new part reads zero");
    if (next(&t->r) & 1) {
        void *r = mremap(q, 2 * CH, CH, 0);
        if (r != q) {
            fail_call(c, t->who, "mremap shrink after grow", (long)r, errno);
            stop = 1;
            return 1;
        }
        if (move(t, OP_GROW_MOVE, c, q, CH, p, 0, "mremap MAYMOVE|FIXED home after grow") < 0) return 1;
    } else {
        void *r = mremap(q, 2 * CH, CH, MREMAP_MAYMOVE | MREMAP_FIXED, p);
        if (r != p) {
            fail_call(c, t->who, "mremap shrink and move home in one call", (long)r, errno);
            dump_maps();
            stop = 1;
            return 1;
        }
    }
    if (fixed) placeholder(t->sc);
    return bad | check(c, 0, CH, k->salt, t->who, "home after grow");
}

/* The fork child: checks the chunks as they were at fork time, overwrites them, checks again.
 * Only async-signal-safe calls: the parent has threads. Returns the count of bad pages. */
static int child_check(const int *cs, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int c = cs[i];
        struct chunk *k = &ch[c];
        uint8_t *p = R + c * CH;
        uint32_t t = 0xC0000000u | (uint32_t)c;
        for (size_t pg = 0; pg < PPC; pg++) {
            uint8_t *m = p + pg * PAGE;
            const char *what = NULL;
            size_t at = 0;
            uint64_t got = 0, w = 0;
            if (bit(k->dfork, pg)) {
                unsigned char v;
                if (mincore(m, PAGE, &v) == 0 || errno != ENOMEM) what = "a DONTFORK page is mapped in the child";
            } else {
                uint32_t s = bit(k->wipe, pg) ? 0 : k->salt;
                const uint64_t *q = (const uint64_t *)m;
                for (size_t j = 0; j < WPP && !what; j++)
                    if (q[j] != want(s, pg * WPP + j))
                        what = s ? "the child reads the parent's pattern" : "the child reads zero (fresh or WIPEONFORK)",
                        at = j * 8, got = q[j], w = want(s, pg * WPP + j);
                if (!what) {
                    fill(p, pg * PAGE, (pg + 1) * PAGE, t);
                    for (size_t j = 0; j < WPP && !what; j++)
                        if (q[j] != word(t, pg * WPP + j))
                            what = "the child's own write", at = j * 8, got = q[j], w = word(t, pg * WPP + j);
                }
            }
            if (what) {
                struct line l = {.n = 0};
                put_s(&l, "FAIL: fork child: chunk ");
                put_u(&l, (uint64_t)c);
                put_s(&l, " page ");
                put_u(&l, pg);
                put_s(&l, ": ");
                put_s(&l, what);
                put_s(&l, ": at ");
                put_x(&l, pg * PAGE + at);
                put_s(&l, " got ");
                put_x(&l, got);
                put_s(&l, " want ");
                put_x(&l, w);
                put_hist(&l, c);
                emit(&l);
                if (++bad > 8) return bad;
            }
        }
    }
    return bad;
}

static int do_fork(struct mm *t, int c) {
    int cs[4] = {c}, n = 1;
    for (int i = 0; i < 6 && n < 4; i++) {
        int d = (int)(next(&t->r) % NCH), dup = 0;
        for (int j = 0; j < n; j++) dup |= cs[j] == d;
        if (!dup && trylock(d)) cs[n++] = d;
    }
    for (int i = 0; i < n; i++) record(cs[i], OP_FORK, t->who, 0, PPC);
    pid_t pid = fork();
    if (pid == 0) _exit(child_check(cs, n) ? 1 : 0);
    int bad = 0, st = 0;
    if (pid < 0) {
        fail_call(c, t->who, "fork", -1, errno);
    } else {
        pid_t w;
        while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {}
        if (w != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
            fails++;
            fprintf(stderr, "FAIL: fork child of chunk %d (%d chunks) ended with status %#x\n", c, n, st);
            bad = 1;
        }
    }
    for (int i = 0; i < n; i++) {
        if (check(cs[i], 0, CH, ch[cs[i]].salt, t->who, "parent after the child wrote (COW)")) resync(cs[i]);
        if (i) unlock(cs[i]);
    }
    return bad;
}

static void *mm(void *arg) {
    struct mm t = {.who = (int)(intptr_t)arg};
    tids[atomic_fetch_add(&ntids, 1)] = (pid_t)syscall(SYS_gettid);
    int i = t.who - TOUCHERS;
    t.r = 0x2545F4914F6CDD1Dull * (uint64_t)(i + 1) ^ seed << 32;
    t.sc = (uint8_t *)(BASE + (NCH + 4) * CH + (size_t)i * SLOT);
    while (!stop) {
        int op = 1 + (int)(next(&t.r) % (NOPS - 1)), c = (int)(next(&t.r) % NCH), c1 = -1, bad = 0;
        int two = op == OP_MOVE2 || (op == OP_GROW_MOVE && c + 1 < NCH);
        if (op == OP_MOVE2 && c + 1 == NCH) continue;
        if (!trylock(c)) continue;
        if (two) {
            if (!trylock(c + 1)) {
                unlock(c);
                continue;
            }
            c1 = c + 1;
        }
        count[op]++;
        progress[t.who]++;
        switch (op) {
        case OP_DONTNEED: case OP_FREE: case OP_FREE_PAGEOUT: bad = discard(&t, op, c); break;
        case OP_MPROTECT: bad = protect(&t, c); break;
        case OP_MLOCK: case OP_MLOCK_ONFAULT: bad = lock(&t, op, c); break;
        case OP_MAP_FIXED: case OP_MUNMAP_MAP: bad = remap(&t, op, c); break;
        case OP_MOVE: case OP_PIECES_MOVE: bad = move_away(&t, op, c); break;
        case OP_MOVE2: bad = move_two(&t, c); break;
        case OP_DONTUNMAP: case OP_DONTUNMAP_ANY: bad = dontunmap(&t, op, c); break;
        case OP_SHRINK_GROW: bad = shrink_grow(&t, c); break;
        case OP_GROW_MOVE: bad = grow_move(&t, c); break;
        case OP_FORK: bad = do_fork(&t, c); break;
        default: bad = advise(&t, op, c); break;
        }
        if (!stop) {
            if (bad & 1) resync(c);
            if (bad & 2) resync(c1);
        }
        if (c1 >= 0) unlock(c1);
        unlock(c);
    }
    return NULL;
}

/* ---- signals --------------------------------------------------------------------------------- */

static uint8_t *sigbuf;
static _Atomic int sig_busy;
static size_t sig_at;
static long sig_taken, sig_rounds;
static _Atomic long sig_bad, sig_foreign, sig_skipped;

static void sig_fail(const char *what, size_t off, uint64_t got, uint64_t w) {
    sig_bad++;
    fails++;
    struct line l = {.n = 0};
    put_s(&l, "FAIL: signal handler: ");
    put_s(&l, what);
    put_s(&l, " at ");
    put_x(&l, off);
    put_s(&l, " got ");
    put_x(&l, got);
    put_s(&l, " want ");
    put_x(&l, w);
    emit(&l);
}

static void on_alarm(int sig) {
    (void)sig;
    int e = errno;
    pid_t me = (pid_t)syscall(SYS_gettid);
    int ours = 0;
    for (int i = 0; i < ntids; i++) ours |= tids[i] == me;
    if (!ours) {
        sig_foreign++;
        fails++;
        struct line l = {.n = 0};
        put_s(&l, "FAIL: SIGALRM taken by thread ");
        put_u(&l, (uint64_t)me);
        put_s(&l, ", not one of the program's");
        emit(&l);
    }
    int z = 0;
    if (!atomic_compare_exchange_strong(&sig_busy, &z, 1)) { /* on another thread right now */
        sig_skipped++;
        errno = e;
        return;
    }
    uint64_t *q = (uint64_t *)sigbuf;
    if (sig_at == SIGBUF / PAGE) {
        for (size_t w = 0; w < SIGBUF / 8; w++)
            if (q[w] != word((uint32_t)sig_rounds + 1, w)) {
                sig_fail("a page written by an earlier signal", w * 8, q[w], word((uint32_t)sig_rounds + 1, w));
                break;
            }
        if (madvise(sigbuf, SIGBUF, MADV_DONTNEED)) sig_fail("madvise DONTNEED failed", 0, (uint64_t)errno, 0);
        sig_at = 0;
        sig_rounds++;
    }
    size_t w0 = sig_at * WPP;
    for (size_t w = w0; w < w0 + WPP; w++)
        if (q[w]) {
            sig_fail("a fresh page reads zero", w * 8, q[w], 0);
            break;
        }
    for (size_t w = w0; w < w0 + WPP; w++) q[w] = word((uint32_t)sig_rounds + 1, w);
    for (size_t w = w0; w < w0 + WPP; w++)
        if (q[w] != word((uint32_t)sig_rounds + 1, w)) {
            sig_fail("a page just written", w * 8, q[w], word((uint32_t)sig_rounds + 1, w));
            break;
        }
    sig_at++;
    sig_taken++;
    atomic_store(&sig_busy, 0);
    errno = e;
}

/* A fault nothing should cause (a chunk unmapped under the program): one line, then exit 3. */
static void on_fault(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    struct line l = {.n = 0};
    put_s(&l, sig == SIGSEGV ? "FAIL: SIGSEGV at " : "FAIL: SIGBUS at ");
    put_x(&l, a);
    if (a >= (uintptr_t)R && a < (uintptr_t)R + NCH * CH) {
        int c = (int)((a - (uintptr_t)R) / CH);
        put_s(&l, ", chunk ");
        put_u(&l, (uint64_t)c);
        put_s(&l, " offset ");
        put_x(&l, (a - (uintptr_t)R) % CH);
        put_hist(&l, c);
    }
    emit(&l);
    _exit(3);
}

/* ---- main ------------------------------------------------------------------------------------ */

static void must_map(uintptr_t at, size_t len, int prot) {
    void *p = mmap((void *)at, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != (void *)at) {
        fprintf(stderr, "mmstress: cannot map %#zx bytes at %#lx: %s\n", len, (unsigned long)at, strerror(errno));
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: mmstress SECONDS [SEED]\n");
        return 2;
    }
    double secs = atof(argv[1]);
    if (argc > 2) seed = strtoull(argv[2], NULL, 0) | 1;
    struct utsname u;
    int major = 0, minor = 0;
    if (uname(&u) == 0 && sscanf(u.release, "%d.%d", &major, &minor) == 2)
        strict_moves = major > 6 || (major == 6 && minor >= 17);
    /* guard | NCH chunks | guard ... scratch slots */
    must_map(BASE, CH, PROT_NONE);
    must_map(BASE + CH, NCH * CH, PROT_READ | PROT_WRITE);
    must_map(BASE + (NCH + 1) * CH, CH, PROT_NONE);
    R = (uint8_t *)(BASE + CH);
    for (int i = 0; i < MMERS; i++) must_map(BASE + (NCH + 4) * CH + (size_t)i * SLOT, 2 * CH, PROT_NONE);
    sigbuf = mmap(NULL, SIGBUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sigbuf == MAP_FAILED) {
        perror("mmstress: mmap");
        return 2;
    }
    tids[atomic_fetch_add(&ntids, 1)] = (pid_t)syscall(SYS_gettid);

    struct sigaction sa = {.sa_sigaction = on_fault, .sa_flags = SA_SIGINFO};
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    struct sigaction al = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    sigaction(SIGALRM, &al, NULL);

    pthread_t th[TOUCHERS + MMERS];
    for (int i = 0; i < TOUCHERS + MMERS; i++)
        pthread_create(&th[i], NULL, i < TOUCHERS ? toucher : mm, (void *)(intptr_t)i);
    while (ntids < 1 + TOUCHERS + MMERS) sched_yield();
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, NULL);

    double t0 = now(), last_report = t0, moved[TOUCHERS + MMERS];
    long seen[TOUCHERS + MMERS];
    for (int i = 0; i < TOUCHERS + MMERS; i++) seen[i] = -1, moved[i] = t0;
    while (now() - t0 < secs && !stop) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        long ops = 0;
        for (int i = 0; i < NOPS; i++) ops += count[i];
        for (int i = 0; i < TOUCHERS + MMERS; i++) {
            if (progress[i] != seen[i]) seen[i] = progress[i], moved[i] = now();
            if (now() - moved[i] > 60) {
                fprintf(stderr, "FAIL: thread %s%d did no operation for 60 s (stuck)\n", i < TOUCHERS ? "t" : "m",
                        i < TOUCHERS ? i : i - TOUCHERS);
                fails++;
                stop = 1;
            }
        }
        if (now() - last_report >= 30) {
            last_report = now();
            fprintf(stderr, "mmstress: %.0f s, %ld operations, %ld signals, fails=%ld\n", last_report - t0, ops,
                    sig_taken, (long)fails);
        }
    }
    stop = 1;
    for (int i = 0; i < TOUCHERS + MMERS; i++) pthread_join(th[i], NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    for (int c = 0; c < NCH; c++) check(c, 0, CH, ch[c].salt, TOUCHERS + MMERS, "at the end");

    long total = 0;
    for (int i = 0; i < NOPS; i++) {
        char extra[256] = "";
        size_t n = 0;
        for (int j = 0; j < NSOFT; j++)
            if (soft[i][j]) n += (size_t)snprintf(extra + n, sizeof extra - n, " %s=%ld", soft_name[j], (long)soft[i][j]);
        fprintf(stderr, "op %-24s %9ld%s\n", opname[i], (long)count[i], extra);
        total += count[i];
    }
    fprintf(stderr, "operations=%ld freed_pages_read_zero=%ld grow_in_place_refused=%ld\n", total, (long)freed_zero,
            (long)grow_fallback);
    fprintf(stderr, "signals=%ld rounds=%ld skipped=%ld foreign=%ld bad=%ld\n", sig_taken, sig_rounds,
            (long)sig_skipped, (long)sig_foreign, (long)sig_bad);
    fprintf(stderr, "fails=%ld\n", (long)fails);
    printf("mmstress: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
