/* libzerofault.so: the front of the LD_PRELOAD shim.
 *
 * Loaded into every process started under the shim, most of which never make a large request
 * (a build runs a thousand of them: make, sh, cc, git). Loading the whole shim (the Rust engine
 * and its std, about 400 KiB of code and a thousand relocations) costs such a process a good
 * part of a `/bin/true` (docs/DESIGN.md, "The shim's front"). This file is all that is loaded up front: the
 * interposed symbols, each passing its call on to the next definition (glibc, or an allocator
 * preloaded after us), until the first large request. That request dlopen()s the shim proper
 * (libzerofault_shim.so, beside this file) and every call goes to it from then on.
 *
 * The shim is loaded at start instead (in this constructor, where loading is safe) when the
 * process's malloc or mmap is not ours (an allocator preloaded before us, or linked into the
 * program: loading from inside its mmap would have the dynamic loader allocate through it while
 * it holds its own lock), and when a ZEROFAULT_ knob is set (a refused value is reported at
 * start).
 *
 * The rules of the shim hold here too: nothing on a hook path calls the program's allocator
 * for our own needs. While the shim is being loaded, and while a hook of the shim works on a
 * program thread, the thread's `in_hook` flag is set; an allocation made then (by the dynamic
 * loader, or by glibc inside a hook) comes from a small allocator of our own over raw mmap,
 * and free / realloc / malloc_usable_size recognise its blocks by address, whoever calls them
 * later. Nested mmap-family calls pass straight through.
 *
 * Keep it small and cheap to load: no relocation it does not need, nothing run at load but
 * an environment scan and two symbol lookups. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* malloc and mmap under names of our own (see their definitions). */
__attribute__((visibility("hidden"))) void *front_malloc(size_t n);
__attribute__((visibility("hidden"))) void *front_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

/* Requests at least this large load the shim: the default of ZEROFAULT_PRELOAD_THRESHOLD
 * (any knob set loads it at start, so the default is the only value that matters here). */
#define ZF_FRONT_THRESHOLD ((size_t)2 << 20)
/* The shim proper, in the directory this file was loaded from. */
#define ZF_SHIM_NAME "libzerofault_shim.so"

/* Shared with the shim (state.rs `Flags`, `FrontApi`). */
struct zf_flags {
    int in_hook;
    int resolving;
};
struct zf_front_api {
    uint32_t version;
    uint32_t size;
    struct zf_flags *(*flags)(void);
    void *(*next)(const char *name);
    int lock_future;
};
#define ZF_FRONT_VERSION 1

static __thread struct zf_flags tls __attribute__((tls_model("initial-exec")));

enum { IDLE, LOADING, READY, OFF };
static int state; /* atomic */
/* The process that may load the shim: the one that loaded this file, or a fork child (whose
 * fork handler says so; the pid is read when needed, not on every fork of a shell). A vfork
 * child runs no fork handler: its pid is not the owner's, and it never loads the shim (its
 * memory is its parent's). */
static int owner;
static int owner_forked; /* atomic */
static int lock_future;
static char shim_path[PATH_MAX];

static inline int load_state(void) { return __atomic_load_n(&state, __ATOMIC_ACQUIRE); }

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

__attribute__((unused)) static long next_syscall(long n, long a, long b, long c, long d, long e, long f);

/* A system call; -1 and errno on failure (as glibc's syscall(2), which this file defines for
 * the program: see "The program's rights" below). */
static long raw(long n, long a, long b, long c, long d, long e, long f) {
#if defined(__x86_64__)
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    if ((unsigned long)r > -4096UL) {
        errno = (int)-r;
        return -1;
    }
    return r;
#else
    return next_syscall(n, a, b, c, d, e, f);
#endif
}

static void say(const char *a, const char *b, const char *c) {
    const char *parts[] = {a, b, c, "\n"};
    for (int i = 0; i < 4; i++)
        if (parts[i]) {
            ssize_t r = write(2, parts[i], strlen(parts[i]));
            (void)r;
        }
}

/* ---------------------------------------------------------------------------------------- */
/* Every signal blocked while held (a handler that allocates must not find our lock taken by
 * the thread it interrupted). */

static void block_all(uint64_t *old) {
    uint64_t all = ~(uint64_t)0;
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, (long)old, 8, 0, 0);
}
static void unblock(const uint64_t *old) { raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)old, 0, 8, 0, 0); }

/* ---------------------------------------------------------------------------------------- */
/* Our own small allocator: power-of-two classes from 32 bytes to 64 KiB, carved from one
 * reservation made on first use. Only the dynamic loader and glibc inside a hook use it: a few
 * KiB per process. */

#define PRIV_LEN ((size_t)8 << 20)
#define PRIV_STEP ((size_t)64 << 10)
#define PRIV_CLASSES 12 /* 32 .. 64 KiB */
#define PRIV_HDR 16

struct priv_hdr {
    size_t total; /* bytes of the block, a class size or a page multiple */
    size_t back;  /* from the block's start to the pointer handed out */
};

static uintptr_t priv_base; /* atomic: 0 until reserved */
static size_t priv_mapped, priv_used;
static void *priv_free_list[PRIV_CLASSES];
static void *priv_big; /* freed blocks above 64 KiB: first fit, each starts with (total, next) */
static int priv_lock;

static inline int priv_owns(const void *p) {
    uintptr_t b = __atomic_load_n(&priv_base, __ATOMIC_ACQUIRE);
    return b && (uintptr_t)p - b < PRIV_LEN;
}

static void priv_take(uint64_t *mask) {
    block_all(mask);
    while (__atomic_exchange_n(&priv_lock, 1, __ATOMIC_ACQUIRE))
        cpu_relax();
}
static void priv_give(const uint64_t *mask) {
    __atomic_store_n(&priv_lock, 0, __ATOMIC_RELEASE);
    unblock(mask);
}

/* `n` bytes of fresh (zero) memory from the reservation, under the lock. */
static void *priv_carve(size_t n) {
    if (!priv_base) {
        long p = raw(SYS_mmap, 0, PRIV_LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == -1)
            return NULL;
        /* Ours, not the program's: left out of core dumps (gcore would write all 8 MiB). */
        raw(SYS_madvise, p, PRIV_LEN, MADV_DONTDUMP, 0, 0, 0);
        __atomic_store_n(&priv_base, (uintptr_t)p, __ATOMIC_RELEASE);
    }
    if (n > PRIV_LEN - priv_used)
        return NULL;
    while (priv_used + n > priv_mapped) {
        if (raw(SYS_mprotect, (long)(priv_base + priv_mapped), PRIV_STEP, PROT_READ | PROT_WRITE, 0, 0, 0) != 0)
            return NULL;
        priv_mapped += PRIV_STEP;
    }
    void *p = (void *)(priv_base + priv_used);
    priv_used += n;
    return p;
}

static int priv_class(size_t total) {
    int c = 0;
    while (((size_t)32 << c) < total)
        c++;
    return c;
}

/* A block of at least `n` bytes aligned to `align` (a power of two). */
static void *priv_alloc(size_t n, size_t align, int zero) {
    if (align < 16)
        align = 16;
    if (n > PRIV_LEN || align > PRIV_LEN / 2)
        return NULL;
    size_t need = n + PRIV_HDR + (align > 16 ? align : 0);
    void *block = NULL;
    size_t total;
    int fresh = 0;
    uint64_t mask;
    priv_take(&mask);
    if (need <= ((size_t)32 << (PRIV_CLASSES - 1))) {
        int c = priv_class(need);
        total = (size_t)32 << c;
        if ((block = priv_free_list[c]))
            priv_free_list[c] = *(void **)block;
        else
            block = priv_carve(total), fresh = 1;
    } else {
        total = (need + 4095) & ~(size_t)4095;
        void **link = &priv_big;
        for (void *b = priv_big; b; link = (void **)((char *)b + 8), b = *link)
            if (*(size_t *)b >= total) {
                total = *(size_t *)b;
                *link = *(void **)((char *)b + 8);
                block = b;
                break;
            }
        if (!block)
            block = priv_carve(total), fresh = 1;
    }
    priv_give(&mask);
    if (!block)
        return NULL;
    uintptr_t p = ((uintptr_t)block + PRIV_HDR + align - 1) & ~(uintptr_t)(align - 1);
    struct priv_hdr *h = (struct priv_hdr *)(p - PRIV_HDR);
    if (zero && !fresh)
        memset(block, 0, total);
    h->total = total;
    h->back = p - (uintptr_t)block;
    return (void *)p;
}

static size_t priv_usable(const void *p) {
    const struct priv_hdr *h = (const struct priv_hdr *)((uintptr_t)p - PRIV_HDR);
    return h->total - h->back;
}

static void priv_free(void *p) {
    struct priv_hdr *h = (struct priv_hdr *)((uintptr_t)p - PRIV_HDR);
    size_t total = h->total;
    void *block = (char *)p - h->back;
    uint64_t mask;
    priv_take(&mask);
    if (total <= ((size_t)32 << (PRIV_CLASSES - 1))) {
        int c = priv_class(total);
        *(void **)block = priv_free_list[c];
        priv_free_list[c] = block;
    } else {
        *(size_t *)block = total;
        *(void **)((char *)block + 8) = priv_big;
        priv_big = block;
    }
    priv_give(&mask);
}

static void *priv_realloc(void *p, size_t n) {
    if (!p)
        return priv_alloc(n, 16, 0);
    size_t have = priv_usable(p);
    if (n <= have)
        return p;
    void *q = priv_alloc(n, 16, 0);
    if (q) {
        memcpy(q, p, have);
        priv_free(p);
    }
    return q;
}

/* ---------------------------------------------------------------------------------------- */
/* The next definition of each symbol (dlsym(RTLD_NEXT), on first use). */

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void *(*reallocarray_fn)(void *, size_t, size_t);
typedef void (*free_fn)(void *);
typedef int (*posix_memalign_fn)(void **, size_t, size_t);
typedef void *(*memalign_fn)(size_t, size_t);
typedef size_t (*usable_fn)(void *);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);
typedef int (*madvise_fn)(void *, size_t, int);
typedef int (*mlockall_fn)(int);
typedef int (*munlockall_fn)(void);

/* The symbols up to S_SHIM_COUNT are the shim's too (it defines each); the rest only pass
 * their calls on, around what the shim does (see "The program's rights"). */
enum {
    S_MALLOC, S_CALLOC, S_REALLOC, S_REALLOCARRAY, S_FREE, S_POSIX_MEMALIGN, S_ALIGNED_ALLOC,
    S_MEMALIGN, S_VALLOC, S_PVALLOC, S_USABLE, S_MMAP, S_MMAP64, S_MREMAP, S_MADVISE,
    S_MLOCKALL, S_MUNLOCKALL, S_MAP, S_UNMAP, S_ACTIVE, S_STATS, S_RECYCLE, S_MUNMAP,
    S_HOLD, S_RELEASE, S_RESTART, S_FOREIGN, S_PREFAULT, S_THP_DISABLED, S_CPUS, S_CLONE_PREPARE,
    S_GIVE_BACK, S_SHIM_COUNT,
    S_SETUID = S_SHIM_COUNT, S_SETGID, S_SETEUID, S_SETEGID, S_SETREUID, S_SETREGID, S_SETRESUID,
    S_SETRESGID, S_SETGROUPS, S_CAPSET, S_PRCTL, S_UNSHARE, S_SETNS, S_SYSCALL, S_IOCTL,
    S_SCHED_SETAFFINITY, S_PTHREAD_SETAFFINITY, S_SCHED_SETSCHEDULER, S_PTHREAD_SETSCHEDPARAM,
    S_PTHREAD_SETSCHEDPRIO, S_PTHREAD_CREATE, S_CLONE, S_MPROTECT, S_COUNT
};
static const char *const names[S_COUNT] = {
    "malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc", "malloc_usable_size", "mmap", "mmap64", "mremap", "madvise",
    "mlockall", "munlockall", "zerofault_map", "zerofault_unmap", "zerofault_active",
    "zerofault_stats_json", "zerofault_recycle", "munmap",
    "zerofault_hold_threads", "zerofault_release_threads", "zerofault_restart_threads",
    "zerofault_foreign_register",
    "zerofault_prefault", "zerofault_thp_disabled", "zerofault_cpus_changed", "zerofault_clone_prepare",
    "zerofault_give_back",
    "setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid", "setresuid", "setresgid",
    "setgroups", "capset", "prctl", "unshare", "setns", "syscall", "ioctl",
    "sched_setaffinity", "pthread_setaffinity_np", "sched_setscheduler", "pthread_setschedparam",
    "pthread_setschedprio", "pthread_create", "clone", "mprotect",
};
static void *nexts[S_COUNT]; /* atomic */
static void *shim[S_SHIM_COUNT]; /* the shim's definitions, set before state is READY */

/* Set while this thread is inside one of our own dlsym calls (volatile: the compiler would
 * otherwise drop the store, seeing no reader between it and the call, which calls us back). */
static __thread volatile int resolving __attribute__((tls_model("initial-exec")));

static int sanitized(void);

/* What free() is while this thread is inside one of our own lookups and free's next definition
 * is not known yet: a block freed then is left allocated. Only dlsym itself frees there (the dynamic loader's previous
 * error message and its holder, blocks of the program's allocator when a sanitizer's runtime
 * made a lookup fail before ours), and freeing it would need the lookup in progress: dlsym
 * -> free -> dlsym -> free ... without end. A few dozen bytes, once per process. */
static void leave_allocated(void *p) { (void)p; }

static void *next_sym(int s) {
    void *f = __atomic_load_n(&nexts[s], __ATOMIC_ACQUIRE);
    if (f)
        return f;
    if (resolving && s == S_FREE)
        return (void *)leave_allocated;
    sanitized();
    resolving++;
    tls.in_hook++;
    f = dlsym(RTLD_NEXT, names[s]);
    tls.in_hook--;
    resolving--;
    __atomic_store_n(&nexts[s], f, __ATOMIC_RELEASE);
    return f;
}
#define NEXT(s, type) ((type)next_sym(S_##s))
#define SHIM(s, type) ((type)shim[S_##s])

/* ---------------------------------------------------------------------------------------- */
/* Loading the shim */

static struct zf_flags *front_flags(void) { return &tls; }

/* The next definition after the front of one of the symbols above (the shim, last in the search
 * order, would find the wrong one with its own RTLD_NEXT); NULL for any other name. */
static void *front_next(const char *name) {
    for (int s = 0; s < S_COUNT; s++)
        if (!strcmp(names[s], name))
            return next_sym(s);
    return NULL;
}

static void find_shim(void);

/* ---------------------------------------------------------------------------------------- */
/* A sanitizer's runtime (ASan, TSan, MSan, HWASan, LSan, MemProf) replaces malloc and the
 * mmap family and owns the process's memory layout (its shadow); ASan refuses to run at all
 * behind a preloaded library unless told not to check. Its process runs without the shim, for
 * good: every call passes straight on to the next definition, the runtime's. Looked for once,
 * at the process's first lookup of a next definition (before anything else here runs in it:
 * the runtime's own start calls us before our constructor), without allocating and without
 * calling any function a runtime may intercept: the dynamic loader's list of loaded objects
 * (a runtime in its own library), and, when the program defines malloc itself, the program's
 * dynamic names (a runtime linked in statically, which names its hooks `__sanitizer_...`).
 * UBSan alone replaces nothing: its processes keep the shim. */

static const char *const runtimes[] = {"asan", "tsan", "msan", "hwasan", "lsan", "memprof"};

/* Whether `s` starts with `prefix` (no libc call: this runs inside a runtime's start). */
static int starts(const char *s, const char *prefix) {
    while (*prefix)
        if (*s++ != *prefix++)
            return 0;
    return 1;
}

/* Whether a loaded object's file name is a sanitizer's runtime: lib<name>.so... (GCC) or
 * libclang_rt.<name>... (Clang). */
static int runtime_name(const char *path) {
    const char *base = path;
    for (const char *p = path; *p; p++)
        if (*p == '/')
            base = p + 1;
    const char *rest = starts(base, "libclang_rt.") ? base + 12 : starts(base, "lib") ? base + 3 : NULL;
    if (!rest)
        return 0;
    for (size_t i = 0; i < sizeof runtimes / sizeof runtimes[0]; i++) {
        const char *r = runtimes[i], *t = rest;
        while (*r && *t == *r)
            r++, t++;
        if (!*r && (*t == '.' || *t == '-' || *t == '_'))
            return 1;
    }
    return 0;
}

/* Whether the program's dynamic string table holds a name of a sanitizer's runtime. */
static int program_names_runtime(const struct link_map *main) {
    const char *tab = NULL;
    size_t len = 0;
    for (const ElfW(Dyn) *d = main->l_ld; d && d->d_tag != DT_NULL; d++)
        if (d->d_tag == DT_STRTAB)
            tab = (const char *)d->d_un.d_ptr;
        else if (d->d_tag == DT_STRSZ)
            len = d->d_un.d_val;
    /* The dynamic loader relocates the entry in place unless the section is read-only. */
    if (tab && (uintptr_t)tab < main->l_addr)
        tab += main->l_addr;
    for (const char *p = tab, *end = tab ? tab + len : NULL; p && p < end; p++) {
        if ((p == tab || p[-1] == 0) && starts(p, "__sanitizer_"))
            return 1;
    }
    return 0;
}

extern char **environ;

/* Whether ZEROFAULT_VERBOSE is on (the values the knob takes as on, in any case). */
static int verbose_asked(void) {
    static const char *const on[] = {"1", "true", "yes", "on"};
    for (char **e = environ; e && *e; e++) {
        if (!starts(*e, "ZEROFAULT_VERBOSE="))
            continue;
        const char *v = *e + 18;
        for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) {
            const char *o = on[i], *t = v;
            while (*o && (*t | 0x20) == *o)
                o++, t++;
            if (!*o && !*t)
                return 1;
        }
    }
    return 0;
}

static const char sanitized_line[] =
    "zerofault: a sanitizer's runtime is in this process (it replaces malloc and mmap); running without the engine";

static int malloc_foreign; /* atomic: 0 not looked up yet, 1 ours, 2 another's */

/* Whether the process's malloc is not ours (an allocator linked into the program, or
 * preloaded before us). */
static int foreign_malloc(void) {
    int v = __atomic_load_n(&malloc_foreign, __ATOMIC_ACQUIRE);
    if (!v) {
        v = dlsym(RTLD_DEFAULT, "malloc") != (void *)front_malloc ? 2 : 1;
        __atomic_store_n(&malloc_foreign, v, __ATOMIC_RELEASE);
    }
    return v == 2;
}

static int sanitizer; /* atomic: 0 not looked for yet, 1 none, 2 found */

/* Whether a sanitizer's runtime is in the process (looked for once): the shim is never
 * loaded then. */
static int sanitized(void) {
    int v = __atomic_load_n(&sanitizer, __ATOMIC_ACQUIRE);
    if (v)
        return v == 2;
    int found = 0;
    const struct link_map *main = _r_debug.r_map;
    for (const struct link_map *l = main; l && !found; l = l->l_next)
        found = l->l_name && runtime_name(l->l_name);
    if (!found && main) {
        resolving++;
        tls.in_hook++;
        found = foreign_malloc() && program_names_runtime(main);
        tls.in_hook--;
        resolving--;
    }
    if (found) {
        int idle = IDLE;
        __atomic_compare_exchange_n(&state, &idle, OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    __atomic_store_n(&sanitizer, found ? 2 : 1, __ATOMIC_RELEASE);
    return found;
}

/* ASan's defaults when the program sets none of its own (the program's definition comes first):
 * its check that its runtime is the first library loaded (refusing to run otherwise) fails
 * behind any preloaded library, this front included, which passes every call on to the runtime
 * in such a process. ASAN_OPTIONS still sets the check as it likes. */
EXPORT const char *__asan_default_options(void) { return "verify_asan_link_order=0"; }

/* Loads the shim if nobody did: 1 when it is loaded. */
static int load(void) {
    int s = load_state();
    if (s != IDLE)
        return s == READY;
    if (sanitized())
        return 0;
    if (__atomic_exchange_n(&owner_forked, 0, __ATOMIC_ACQ_REL))
        owner = getpid();
    if (getpid() != owner)
        return 0; /* a vfork child: the memory is its parent's */
    if (!__atomic_compare_exchange_n(&state, &s, LOADING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return s == READY;
    uint64_t mask;
    block_all(&mask);
    int saved = errno;
    tls.in_hook++;
    if (!shim_path[0])
        find_shim();
    int ok = 0;
    void *h = dlopen(shim_path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *why = dlerror();
        say("zerofault: cannot load the shim (", why ? why : shim_path, "); running without the engine");
    } else {
        ok = 1;
        for (int i = 0; i < S_SHIM_COUNT; i++)
            if (!(shim[i] = dlsym(h, names[i])))
                ok = 0;
        int (*init)(const struct zf_front_api *) = (int (*)(const struct zf_front_api *))dlsym(h, "zerofault_shim_init");
        struct zf_front_api api = {ZF_FRONT_VERSION, sizeof api, front_flags, front_next, lock_future};
        if (!ok || !init || init(&api) != 0) {
            ok = 0;
            say("zerofault: ", shim_path, " is not the shim this front was built with; running without the engine");
        }
    }
    tls.in_hook--;
    errno = saved;
    /* Before the signals come back: a handler that makes a large request in between would
     * otherwise wait for this very thread (see wait_loaded). */
    __atomic_store_n(&state, ok ? READY : OFF, __ATOMIC_RELEASE);
    unblock(&mask);
    return ok;
}

/* How long a large request made while another thread loads the shim waits for the load (well
 * under a millisecond here) before it goes to the next allocator, as every such request did
 * before: several threads making their first large request at once got one served and the
 * others not (1 run in 3-6). Bounded, because the request may come with a lock the loading
 * thread needs (the dynamic loader's, from a constructor that allocates). */
#define LOAD_WAIT_NS 50000000L

/* Set once a wait ran out: the load is stuck (on a lock the waiter's thread holds, say), and
 * later requests pass through at once instead of waiting the bound again each time. */
static int load_wait_gave_up; /* atomic */

static int wait_loaded(void) {
    if (__atomic_load_n(&load_wait_gave_up, __ATOMIC_RELAXED))
        return 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int s = load_state();
        if (s != LOADING)
            return s == READY;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) > LOAD_WAIT_NS) {
            __atomic_store_n(&load_wait_gave_up, 1, __ATOMIC_RELAXED);
            return 0;
        }
        sched_yield();
    }
}

/* The shim, loaded now if this request is large (or waited for, if another thread is loading
 * it). */
static inline int shim_for(size_t n) {
    int s = load_state();
    if (s == READY)
        return 1;
    if (n < ZF_FRONT_THRESHOLD)
        return 0;
    if (s == IDLE)
        return load();
    return s == LOADING && wait_loaded();
}

static void fork_prepare(void) {
    while (__atomic_exchange_n(&priv_lock, 1, __ATOMIC_ACQUIRE))
        cpu_relax();
}
static void fork_parent(void) { __atomic_store_n(&priv_lock, 0, __ATOMIC_RELEASE); }
static void fork_child(void) {
    __atomic_store_n(&priv_lock, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&owner_forked, 1, __ATOMIC_RELEASE);
    /* A load in progress in another thread of the parent never ends here: that thread is not
     * in the child. Running without the shim, the child's large requests pass through at once
     * instead of waiting for it (and the C API's shim_now does not spin for ever). */
    int loading = LOADING;
    __atomic_compare_exchange_n(&state, &loading, OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

/* Where the shim is: this file's directory. Found with dladdr when the shim is loaded; a path
 * that is relative then would be taken from wherever the program has gone since, so when
 * this file may have been found by a relative one it is made absolute in the constructor
 * instead (dladdr costs a few microseconds there: not paid by every process). */
static void find_shim(void) {
    Dl_info info;
    const char *me = dladdr((void *)find_shim, &info) && info.dli_fname ? info.dli_fname : "";
    const char *slash = strrchr(me, '/');
    size_t at = 0;
    if (me[0] != '/' && getcwd(shim_path, sizeof shim_path - 1))
        at = strlen(shim_path), shim_path[at++] = '/';
    size_t dir = slash ? (size_t)(slash - me) + 1 : 0;
    if (at + dir + sizeof ZF_SHIM_NAME <= sizeof shim_path) {
        memcpy(shim_path + at, me, dir);
        memcpy(shim_path + at + dir, ZF_SHIM_NAME, sizeof ZF_SHIM_NAME);
    }
}

/* Whether a ':'- or ' '-separated path list holds an entry that is not absolute. */
static int relative_entry(const char *list) {
    for (const char *p = list; *p;) {
        while (*p == ':' || *p == ' ')
            p++;
        if (*p && *p != '/')
            return 1;
        while (*p && *p != ':' && *p != ' ')
            p++;
    }
    return 0;
}

__attribute__((constructor)) static void front_init(void) {
    owner = getpid();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (sanitized()) {
        /* Said here: the environment may not be set up yet at the first lookup. */
        if (verbose_asked())
            say(sanitized_line, NULL, NULL);
        return;
    }
    int eager = foreign_malloc() || dlsym(RTLD_DEFAULT, "mmap") != (void *)front_mmap;
    int relative = 0;
    for (char **e = environ; e && *e; e++) {
        const char *v = *e;
        if (v[0] == 'Z' && !strncmp(v, "ZEROFAULT_", 10) && strncmp(v, "ZEROFAULT_REQUIRE_UFFD=", 23))
            eager = 1;
        else if (v[0] == 'L' && (!strncmp(v, "LD_PRELOAD=", 11) || !strncmp(v, "LD_LIBRARY_PATH=", 16)))
            relative |= relative_entry(strchr(v, '=') + 1);
    }
    if (relative || eager)
        find_shim();
    if (eager)
        load();
}

/* ---------------------------------------------------------------------------------------- */
/* The malloc family */

/* malloc and mmap are defined under a name of our own too, which no other library can take:
 * the constructor compares it with what the process's malloc and mmap are (the address of
 * `malloc` itself, taken here, would be the process's, whoever defines it). */
EXPORT void *malloc(size_t n) __attribute__((alias("front_malloc")));
EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("front_mmap")));

/* The kernel refused memory (errno ENOMEM): where the process is at vm.max_map_count, the
 * loaded shim gives the engine's own mappings back, once, and says the call is worth
 * repeating. The C library's heap and thread stacks are mapped by calls no hook sees, so the
 * refusal is seen here, in what the program called. */
static int gave_back(int refused) {
    return refused && errno == ENOMEM && !tls.in_hook && load_state() == READY &&
           ((int (*)(void))shim[S_GIVE_BACK])();
}

/* gave_back for a call that returns its error code and leaves errno alone (posix_memalign's
 * ENOMEM, pthread_create's EAGAIN): errno is ENOMEM for the question, and put back after. */
static int gave_back_for_code(void) {
    int e = errno;
    errno = ENOMEM;
    int gave = gave_back(1);
    errno = e;
    return gave;
}

/* `call` (a pointer-returning allocation), repeated once where gave_back says so: only when
 * the call itself set ENOMEM (errno is cleared first, and put back when the call left it
 * alone), never on an errno an earlier failure left, nor on a NULL that is no failure
 * (realloc(p, 0) frees p: repeating it would free p twice). */
#define AGAIN_IF_REFUSED(call)                                                                     \
    do {                                                                                           \
        int saved_ = errno;                                                                        \
        errno = 0;                                                                                 \
        void *got_ = (call);                                                                       \
        if (gave_back(!got_)) {                                                                    \
            errno = 0;                                                                             \
            got_ = (call);                                                                         \
        }                                                                                          \
        if (errno == 0)                                                                            \
            errno = saved_;                                                                        \
        return got_;                                                                               \
    } while (0)

void *front_malloc(size_t n) {
    if (tls.in_hook)
        return priv_alloc(n, 16, 0);
    if (shim_for(n))
        AGAIN_IF_REFUSED(SHIM(MALLOC, malloc_fn)(n));
    AGAIN_IF_REFUSED(NEXT(MALLOC, malloc_fn)(n));
}

EXPORT void *calloc(size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (tls.in_hook)
        return priv_alloc(total, 16, 1);
    if (shim_for(total))
        AGAIN_IF_REFUSED(SHIM(CALLOC, calloc_fn)(n, size));
    AGAIN_IF_REFUSED(NEXT(CALLOC, calloc_fn)(n, size));
}

EXPORT void free(void *p) {
    if (!p)
        return;
    if (priv_owns(p)) {
        priv_free(p);
        return;
    }
    if (!tls.in_hook && load_state() == READY) {
        SHIM(FREE, free_fn)(p);
        return;
    }
    NEXT(FREE, free_fn)(p);
}

EXPORT void *realloc(void *p, size_t n) {
    if (priv_owns(p))
        return priv_realloc(p, n);
    if (tls.in_hook)
        return p ? NEXT(REALLOC, realloc_fn)(p, n) : priv_alloc(n, 16, 0);
    if (shim_for(n))
        AGAIN_IF_REFUSED(SHIM(REALLOC, realloc_fn)(p, n));
    if (n == 0)
        return NEXT(REALLOC, realloc_fn)(p, n); /* a free when p is a block: never repeated */
    AGAIN_IF_REFUSED(NEXT(REALLOC, realloc_fn)(p, n));
}

EXPORT void *reallocarray(void *p, size_t n, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (priv_owns(p) || tls.in_hook)
        return realloc(p, total);
    if (shim_for(total))
        AGAIN_IF_REFUSED(SHIM(REALLOCARRAY, reallocarray_fn)(p, n, size));
    if (total == 0)
        return NEXT(REALLOCARRAY, reallocarray_fn)(p, n, size); /* as realloc(p, 0) */
    AGAIN_IF_REFUSED(NEXT(REALLOCARRAY, reallocarray_fn)(p, n, size));
}

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    if (tls.in_hook) {
        if (align < sizeof(void *) || (align & (align - 1)))
            return EINVAL;
        void *p = priv_alloc(n, align, 0);
        if (!p)
            return ENOMEM;
        *out = p;
        return 0;
    }
    posix_memalign_fn f = shim_for(n) ? SHIM(POSIX_MEMALIGN, posix_memalign_fn) : NEXT(POSIX_MEMALIGN, posix_memalign_fn);
    int r = f(out, align, n);
    if (r == ENOMEM && gave_back_for_code())
        r = f(out, align, n);
    return r;
}

static void *aligned_call(int s, size_t align, size_t n) {
    if (tls.in_hook) {
        if (align & (align - 1)) {
            errno = EINVAL;
            return NULL;
        }
        return priv_alloc(n, align, 0);
    }
    if (shim_for(n))
        AGAIN_IF_REFUSED(((memalign_fn)shim[s])(align, n));
    AGAIN_IF_REFUSED(((memalign_fn)next_sym(s))(align, n));
}

EXPORT void *aligned_alloc(size_t align, size_t n) { return aligned_call(S_ALIGNED_ALLOC, align, n); }
EXPORT void *memalign(size_t align, size_t n) { return aligned_call(S_MEMALIGN, align, n); }

EXPORT void *valloc(size_t n) {
    if (tls.in_hook)
        return priv_alloc(n, 4096, 0);
    if (shim_for(n))
        return SHIM(VALLOC, malloc_fn)(n);
    return NEXT(VALLOC, malloc_fn)(n);
}

EXPORT void *pvalloc(size_t n) {
    if (tls.in_hook)
        return priv_alloc((n + 4095) & ~(size_t)4095, 4096, 0);
    if (shim_for(n))
        return SHIM(PVALLOC, malloc_fn)(n);
    return NEXT(PVALLOC, malloc_fn)(n);
}

EXPORT size_t malloc_usable_size(void *p) {
    if (!p)
        return 0;
    if (priv_owns(p))
        return priv_usable(p);
    if (!tls.in_hook && load_state() == READY)
        return SHIM(USABLE, usable_fn)(p);
    return NEXT(USABLE, usable_fn)(p);
}

/* ---------------------------------------------------------------------------------------- */
/* The program's memory calls */

static inline int anon_private(int flags) {
    return (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE;
}

void *front_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (!tls.in_hook && (load_state() == READY || (anon_private(flags) && shim_for(len))))
        return SHIM(MMAP, mmap_fn)(addr, len, prot, flags, fd, off);
    return NEXT(MMAP, mmap_fn)(addr, len, prot, flags, fd, off);
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (!tls.in_hook && (load_state() == READY || (anon_private(flags) && shim_for(len))))
        return SHIM(MMAP64, mmap_fn)(addr, len, prot, flags, fd, off);
    return NEXT(MMAP64, mmap_fn)(addr, len, prot, flags, fd, off);
}

/* Memory the shim does not serve yet stays unserved when moved or grown: only a loaded shim
 * sees mremap. */
/* munmap: the shim recycles the served pages first (where the call cannot fail); before the
 * shim is loaded, and inside it, the system call itself. */
EXPORT int munmap(void *addr, size_t len) {
    if (!tls.in_hook && load_state() == READY)
        return ((int (*)(void *, size_t))shim[S_MUNMAP])(addr, len);
    if (sanitized())
        return NEXT(MUNMAP, int (*)(void *, size_t))(addr, len); /* the runtime's: it clears its shadow */
    return (int)raw(SYS_munmap, (long)addr, (long)len, 0, 0, 0, 0);
}

EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    void *new_addr = va_arg(ap, void *);
    va_end(ap);
    if (!tls.in_hook && load_state() == READY)
        return ((void *(*)(void *, size_t, size_t, int, void *))shim[S_MREMAP])(old, old_len, new_len, flags, new_addr);
    return NEXT(MREMAP, mremap_fn)(old, old_len, new_len, flags, new_addr);
}

EXPORT int madvise(void *addr, size_t len, int advice) {
    if (!tls.in_hook && load_state() == READY)
        return SHIM(MADVISE, madvise_fn)(addr, len, advice);
    return NEXT(MADVISE, madvise_fn)(addr, len, advice);
}

/* MCL_FUTURE before the shim is loaded is remembered: the shim locks its new memory then. */
EXPORT int mlockall(int flags) {
    if (!tls.in_hook && load_state() == READY)
        return SHIM(MLOCKALL, mlockall_fn)(flags);
    int r = NEXT(MLOCKALL, mlockall_fn)(flags);
    if (r == 0 && !tls.in_hook)
        __atomic_store_n(&lock_future, (flags & MCL_FUTURE) != 0, __ATOMIC_RELAXED);
    return r;
}

EXPORT int munlockall(void) {
    if (!tls.in_hook && load_state() == READY)
        return SHIM(MUNLOCKALL, munlockall_fn)();
    int r = NEXT(MUNLOCKALL, munlockall_fn)();
    if (r == 0 && !tls.in_hook)
        __atomic_store_n(&lock_future, 0, __ATOMIC_RELAXED);
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* The C API (include/zerofault.h): asking for the engine loads the shim. */

static int shim_now(void) {
    while (load_state() == LOADING)
        sched_yield();
    return load();
}

EXPORT void *zerofault_map(size_t len) {
    if (shim_now())
        return ((void *(*)(size_t))shim[S_MAP])(len);
    if (!len)
        return NULL;
    void *p = (void *)raw(SYS_mmap, 0, (long)len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

EXPORT int zerofault_unmap(void *p, size_t len) {
    return (int)raw(SYS_munmap, (long)p, (long)((len + 4095) & ~(size_t)4095), 0, 0, 0, 0);
}

EXPORT int zerofault_recycle(void *p, size_t len) {
    if (load_state() == READY)
        return ((int (*)(void *, size_t))shim[S_RECYCLE])(p, len);
    /* No engine: what recycling is without one. */
    return NEXT(MADVISE, madvise_fn)(p, (len + 4095) & ~(size_t)4095, MADV_DONTNEED);
}

EXPORT int zerofault_active(void) {
    return load_state() == READY ? ((int (*)(void))shim[S_ACTIVE])() : 0;
}

EXPORT size_t zerofault_stats_json(char *buf, size_t cap) {
    if (shim_now())
        return ((size_t(*)(char *, size_t))shim[S_STATS])(buf, cap);
    static const char none[] = "{}";
    size_t len = sizeof none - 1;
    if (buf && cap) {
        size_t n = len < cap - 1 ? len : cap - 1;
        memcpy(buf, none, n);
        buf[n] = 0;
    }
    return len;
}

/* ---------------------------------------------------------------------------------------- */
/* The program's rights (the shim's rights.rs says why each of these is here)
 *
 * - Credentials, capabilities, NO_NEW_PRIVS and user namespaces: the engine's threads are
 *   stopped around the call and started again from the calling thread, which hands them its
 *   new state (they are raw clones: glibc's set*id broadcast never reaches them); around
 *   glibc's set*id calls, which wait for every program thread, they are restarted after.
 * - A seccomp filter: the engine stops for good before it (before the shim is loaded: the
 *   shim never is).
 * - UFFDIO_REGISTER refused with EBUSY (memory the engine serves): tried once more after the
 *   shim handed that memory back to the kernel.
 * - A futex operation that failed with EFAULT on memory the engine serves (the kernel faults
 *   the word in with no way to wait for a userfaultfd): tried once more after the shim had the
 *   engine serve the words.
 * Every other call passes straight on, at the cost of a comparison. The program's raw
 * `syscall` instructions are not seen (README, limits). */

/* What the engine does around a call: follows it (its threads stopped and started again), or
 * stops for good before it, for a seccomp filter, a real-time policy, or a restriction of the
 * calling thread's it cannot follow (the shim's rights.rs words its line after the reason). */
enum { FOLLOW = 0, FOR_GOOD = 1, FOR_GOOD_REALTIME = 2 };

/* 1 when the threads were stopped and must be started again after the call. */
static int hold(int how) {
    if (tls.in_hook)
        return 0;
    if (load_state() == READY)
        return ((int (*)(int))shim[S_HOLD])(how);
    if (how >= FOR_GOOD && getpid() == owner) {
        /* Before the shim is loaded: it never is (a filter may refuse what loading it calls,
         * or what the engine's threads call, and kill the process for it). Not from a vfork
         * child, whose memory, and so this state, is its parent's. */
        int idle = IDLE;
        __atomic_compare_exchange_n(&state, &idle, OFF, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    return 0;
}

static void release_threads(int held) {
    if (held) {
        int saved = errno;
        ((void (*)(void))shim[S_RELEASE])();
        errno = saved;
    }
}

#define AROUND(how, call)                                                                          \
    do {                                                                                           \
        int held_ = hold(how);                                                                     \
        long r_ = (long)(call);                                                                    \
        release_threads(held_);                                                                    \
        return r_;                                                                                 \
    } while (0)

/* glibc's set*id calls signal every other thread of the program and wait for each: one
 * waiting for the engine (in a MADV_DONTNEED of served memory) must find it running. So the
 * engine's threads are restarted after the call instead (rights.rs). */
static int restart_after(int r) {
    if (r == 0 && !tls.in_hook && load_state() == READY) {
        int saved = errno;
        ((void (*)(void))shim[S_RESTART])();
        errno = saved;
    }
    return r;
}

EXPORT int setuid(uid_t u) { return restart_after(NEXT(SETUID, int (*)(uid_t))(u)); }
EXPORT int setgid(gid_t g) { return restart_after(NEXT(SETGID, int (*)(gid_t))(g)); }
EXPORT int seteuid(uid_t u) { return restart_after(NEXT(SETEUID, int (*)(uid_t))(u)); }
EXPORT int setegid(gid_t g) { return restart_after(NEXT(SETEGID, int (*)(gid_t))(g)); }
EXPORT int setreuid(uid_t r, uid_t e) { return restart_after(NEXT(SETREUID, int (*)(uid_t, uid_t))(r, e)); }
EXPORT int setregid(gid_t r, gid_t e) { return restart_after(NEXT(SETREGID, int (*)(gid_t, gid_t))(r, e)); }
EXPORT int setresuid(uid_t r, uid_t e, uid_t s) {
    return restart_after(NEXT(SETRESUID, int (*)(uid_t, uid_t, uid_t))(r, e, s));
}
EXPORT int setresgid(gid_t r, gid_t e, gid_t s) {
    return restart_after(NEXT(SETRESGID, int (*)(gid_t, gid_t, gid_t))(r, e, s));
}
EXPORT int setgroups(size_t n, const gid_t *list) {
    return restart_after(NEXT(SETGROUPS, int (*)(size_t, const gid_t *))(n, list));
}
EXPORT int capset(void *hdr, void *data) { AROUND(FOLLOW, NEXT(CAPSET, int (*)(void *, void *))(hdr, data)); }
EXPORT int unshare(int flags) { AROUND(FOLLOW, NEXT(UNSHARE, int (*)(int))(flags)); }
EXPORT int setns(int fd, int type) { AROUND(FOLLOW, NEXT(SETNS, int (*)(int, int))(fd, type)); }

/* After prctl(PR_SET_THP_DISABLE, on) returned `r`: the engine follows it (no huge page of
 * its own where the kernel makes none). */
static void thp_disabled(long r, unsigned long on) {
    if (r == 0 && !tls.in_hook && load_state() == READY) {
        int saved = errno;
        ((void (*)(int))shim[S_THP_DISABLED])(on != 0);
        errno = saved;
    }
}

/* What a prctl option asks of the engine's threads: -1 nothing. */
static int prctl_how(long option) {
    switch (option) {
    case PR_SET_SECCOMP:
        return FOR_GOOD;
    case PR_SET_NO_NEW_PRIVS:
    case PR_CAPBSET_DROP:
    case PR_SET_SECUREBITS:
    case PR_CAP_AMBIENT:
        return FOLLOW;
    default:
        return -1;
    }
}

EXPORT int prctl(int option, ...) {
    va_list ap;
    va_start(ap, option);
    unsigned long a = va_arg(ap, unsigned long), b = va_arg(ap, unsigned long);
    unsigned long c = va_arg(ap, unsigned long), d = va_arg(ap, unsigned long);
    va_end(ap);
    int (*next)(int, ...) = NEXT(PRCTL, int (*)(int, ...));
    int how = prctl_how(option);
    if (how < 0) {
        int r = next(option, a, b, c, d);
        if (option == PR_SET_THP_DISABLE)
            thp_disabled(r, a);
        return r;
    }
    AROUND(how, next(option, a, b, c, d));
}

__attribute__((unused)) static long next_syscall(long n, long a, long b, long c, long d, long e, long f) {
    return NEXT(SYSCALL, long (*)(long, ...))(n, a, b, c, d, e, f);
}

/* ---------------------------------------------------------------------------------------- */
/* CPU placement and priority (rights.rs, "CPUs and priority")
 *
 * - A change of the CPUs a program thread may use: the engine's threads are given the main
 *   thread's (the process's) CPUs after it.
 * - A real-time policy (SCHED_FIFO, SCHED_RR, SCHED_DEADLINE) for any program thread: the
 *   engine stops for good before the call. A real-time thread's fault would wait for a
 *   SCHED_OTHER handler, behind every real-time thread of the CPU: the kernel serves it at once. */

#ifndef SCHED_DEADLINE
#define SCHED_DEADLINE 6
#endif

static int realtime_policy(long policy) {
    policy &= ~(long)SCHED_RESET_ON_FORK;
    return policy == SCHED_FIFO || policy == SCHED_RR || policy == SCHED_DEADLINE;
}

/* The policy a `struct sched_attr` at `at` asks for (a u32 size, then a u32 policy), read
 * without faulting (the kernel says EFAULT of a bad pointer, the program must see that, not a
 * crash); -1 if unreadable. */
static long attr_policy(long at) {
    uint32_t head[2];
    struct iovec here = {head, sizeof head}, there = {(void *)at, sizeof head};
    if (raw(SYS_process_vm_readv, raw(SYS_getpid, 0, 0, 0, 0, 0, 0), (long)&here, 1, (long)&there, 1, 0) != sizeof head)
        return -1;
    return head[1];
}

/* After a call that changed a program thread's CPUs and returned `r`. */
static long cpus_changed(long r) {
    if (r == 0 && !tls.in_hook && load_state() == READY) {
        int saved = errno;
        ((void (*)(void))shim[S_CPUS])();
        errno = saved;
    }
    return r;
}

EXPORT int sched_setaffinity(pid_t pid, size_t size, const cpu_set_t *set) {
    return (int)cpus_changed(NEXT(SCHED_SETAFFINITY, int (*)(pid_t, size_t, const cpu_set_t *))(pid, size, set));
}

EXPORT int pthread_setaffinity_np(pthread_t t, size_t size, const cpu_set_t *set) {
    int r = NEXT(PTHREAD_SETAFFINITY, int (*)(pthread_t, size_t, const cpu_set_t *))(t, size, set);
    cpus_changed(r == 0 ? 0 : -1);
    return r;
}

EXPORT int sched_setscheduler(pid_t pid, int policy, const struct sched_param *p) {
    int (*next)(pid_t, int, const struct sched_param *) = NEXT(SCHED_SETSCHEDULER, int (*)(pid_t, int, const struct sched_param *));
    if (realtime_policy(policy))
        AROUND(FOR_GOOD_REALTIME, next(pid, policy, p));
    return next(pid, policy, p);
}

/* glibc's wrapper (2.41), the system call itself: defined here for every glibc. */
struct sched_attr;
EXPORT int sched_setattr(pid_t pid, struct sched_attr *attr, unsigned int flags) {
    if (!tls.in_hook && realtime_policy(attr_policy((long)attr)))
        AROUND(FOR_GOOD_REALTIME, raw(SYS_sched_setattr, pid, (long)attr, flags, 0, 0, 0));
    return (int)raw(SYS_sched_setattr, pid, (long)attr, flags, 0, 0, 0);
}

EXPORT int pthread_setschedparam(pthread_t t, int policy, const struct sched_param *p) {
    int (*next)(pthread_t, int, const struct sched_param *) = NEXT(PTHREAD_SETSCHEDPARAM, int (*)(pthread_t, int, const struct sched_param *));
    if (realtime_policy(policy))
        AROUND(FOR_GOOD_REALTIME, next(t, policy, p));
    return next(t, policy, p);
}

/* Only a real-time thread has a priority to change: one made real-time where the engine could
 * not see it (chrt from outside) stops it now. */
EXPORT int pthread_setschedprio(pthread_t t, int prio) {
    int (*next)(pthread_t, int) = NEXT(PTHREAD_SETSCHEDPRIO, int (*)(pthread_t, int));
    int policy;
    struct sched_param sp;
    if (pthread_getschedparam(t, &policy, &sp) == 0 && realtime_policy(policy))
        AROUND(FOR_GOOD_REALTIME, next(t, prio));
    return next(t, prio);
}

/* A thread created real-time (an explicit policy in its attributes). One that inherits its
 * creator's policy is real-time only if its creator is, which the engine saw. */
EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    int (*next)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *) =
        NEXT(PTHREAD_CREATE, int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *));
    int inherit, policy;
    if (attr && pthread_attr_getinheritsched(attr, &inherit) == 0 && inherit == PTHREAD_EXPLICIT_SCHED &&
        pthread_attr_getschedpolicy(attr, &policy) == 0 && realtime_policy(policy))
        AROUND(FOR_GOOD_REALTIME, next(t, attr, fn, arg));
    int r = next(t, attr, fn, arg);
    /* No stack to be mapped, or a thread limit: the shim tells them apart. */
    if (r == EAGAIN && gave_back_for_code())
        r = next(t, attr, fn, arg);
    return r;
}

/* mprotect: a split refused at vm.max_map_count (ENOMEM) is repeated once the engine gave its
 * own mappings back. */
EXPORT int mprotect(void *addr, size_t len, int prot) {
    int r = NEXT(MPROTECT, int (*)(void *, size_t, int))(addr, len, prot);
    if (r != 0 && gave_back(1))
        r = NEXT(MPROTECT, int (*)(void *, size_t, int))(addr, len, prot);
    return r;
}

/* Whether futex operation `op` uses its fifth argument as a second word. */
static int futex_second_word(long op) {
    switch (op & FUTEX_CMD_MASK) {
    case FUTEX_WAKE_OP:
    case FUTEX_REQUEUE:
    case FUTEX_CMP_REQUEUE:
    case FUTEX_CMP_REQUEUE_PI:
    case FUTEX_WAIT_REQUEUE_PI:
        return 1;
    default:
        return 0;
    }
}

static long futex_call(long a, long b, long c, long d, long e, long f) {
    long r = raw(SYS_futex, a, b, c, d, e, f);
    if (r == -1 && errno == EFAULT && !tls.in_hook && load_state() == READY) {
        void *second = futex_second_word(b) ? (void *)e : NULL;
        if (((int (*)(void *, void *))shim[S_PREFAULT])((void *)a, second))
            r = raw(SYS_futex, a, b, c, d, e, f);
        else
            errno = EFAULT;
    }
    return r;
}

static long ioctl_call(int fd, unsigned long req, void *arg) {
    long r = raw(SYS_ioctl, fd, (long)req, (long)arg, 0, 0, 0);
    if (r == -1 && errno == EBUSY && req == UFFDIO_REGISTER && !tls.in_hook && load_state() == READY) {
        if (((int (*)(int, void *))shim[S_FOREIGN])(fd, arg))
            r = raw(SYS_ioctl, fd, (long)req, (long)arg, 0, 0, 0);
        else
            errno = EBUSY;
    }
    return r;
}

EXPORT int ioctl(int fd, unsigned long req, ...) {
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (sanitized())
        return NEXT(IOCTL, int (*)(int, unsigned long, void *))(fd, req, arg); /* the runtime marks what it wrote */
    if (req != UFFDIO_REGISTER)
        return (int)raw(SYS_ioctl, fd, (long)req, (long)arg, 0, 0, 0);
    return (int)ioctl_call(fd, req, arg);
}

EXPORT long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (tls.in_hook)
        return raw(n, a, b, c, d, e, f);
    switch (n) {
    case SYS_futex:
        return futex_call(a, b, c, d, e, f);
    case SYS_ioctl:
        return (unsigned long)b == UFFDIO_REGISTER ? ioctl_call((int)a, (unsigned long)b, (void *)c)
                                                   : raw(n, a, b, c, d, e, f);
    case SYS_seccomp:
        if (a == SECCOMP_SET_MODE_STRICT || a == SECCOMP_SET_MODE_FILTER)
            AROUND(FOR_GOOD, raw(n, a, b, c, d, e, f));
        break;
    case SYS_prctl: {
        int how = prctl_how(a);
        if (how >= 0)
            AROUND(how, raw(n, a, b, c, d, e, f));
        if (a == PR_SET_THP_DISABLE) {
            long r = raw(n, a, b, c, d, e, f);
            thp_disabled(r, (unsigned long)b);
            return r;
        }
        break;
    }
    case SYS_sched_setscheduler:
        if (realtime_policy(b))
            AROUND(FOR_GOOD_REALTIME, raw(n, a, b, c, d, e, f));
        break;
    case SYS_sched_setattr:
        if (realtime_policy(attr_policy(b)))
            AROUND(FOR_GOOD_REALTIME, raw(n, a, b, c, d, e, f));
        break;
    case SYS_sched_setaffinity:
        return cpus_changed(raw(n, a, b, c, d, e, f));
    case SYS_landlock_restrict_self:
    case SYS_setuid:
    case SYS_setgid:
    case SYS_setreuid:
    case SYS_setregid:
    case SYS_setresuid:
    case SYS_setresgid:
    case SYS_setgroups:
    case SYS_capset:
    case SYS_unshare:
    case SYS_setns:
        AROUND(FOLLOW, raw(n, a, b, c, d, e, f));
    }
    return raw(n, a, b, c, d, e, f);
}

/* ---------------------------------------------------------------------------------------- */
/* clone(2): a process that shares the memory (exit.rs, zerofault_clone_prepare, says why)
 *
 * clone(CLONE_VM) without CLONE_THREAD makes a process that shares the address space and may
 * outlive this one. Without CLONE_FILES its copy of the descriptor table holds the engine's
 * userfaultfd, which would keep every range registered after this process died (even by
 * SIGKILL) and leave the child's faults waiting for ever: the child closes its copy before the
 * program's function runs. With CLONE_FILES the engine stops for good before the clone.
 * Threads (CLONE_THREAD), fork-like clones (no CLONE_VM), pthread_create, vfork and
 * posix_spawn (glibc's own clone, which this symbol never sees) pass straight on. */

struct zf_clone_fd {
    int fd;
    uint64_t dev, ino;
};
struct clone_start {
    int (*fn)(void *);
    void *arg;
    struct zf_clone_fd uffd;
};

/* A system call that leaves errno alone: the child runs on its parent thread's TLS. */
static long raw_quiet(long n, long a, long b) {
#if defined(__x86_64__)
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b) : "rcx", "r11", "memory");
    return r;
#else
    (void)n, (void)a, (void)b;
    return -ENOSYS;
#endif
}

/* The child's first code: its copy of the engine's descriptor closed (if the number still
 * names that file), then the program's function. */
static int clone_child(void *p) {
    struct clone_start c = *(struct clone_start *)p;
    struct stat st;
    if (raw_quiet(SYS_fstat, c.uffd.fd, (long)&st) == 0 && (uint64_t)st.st_dev == c.uffd.dev &&
        (uint64_t)st.st_ino == c.uffd.ino)
        raw_quiet(SYS_close, c.uffd.fd, 0);
    return c.fn(c.arg);
}

EXPORT int clone(int (*fn)(void *), void *stack, int flags, void *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    void *ptid = va_arg(ap, void *), *newtls = va_arg(ap, void *), *ctid = va_arg(ap, void *);
    va_end(ap);
    int (*next)(int (*)(void *), void *, int, void *, ...) = NEXT(CLONE, int (*)(int (*)(void *), void *, int, void *, ...));
    if ((flags & (CLONE_VM | CLONE_THREAD)) != CLONE_VM || tls.in_hook || !fn || !stack)
        return next(fn, stack, flags, arg, ptid, newtls, ctid);
    if (load_state() != READY) {
        /* No engine yet. One started later would put its descriptor in a table the child
         * shares: with CLONE_FILES it never starts. */
        if (flags & CLONE_FILES)
            hold(FOR_GOOD);
        return next(fn, stack, flags, arg, ptid, newtls, ctid);
    }
    struct zf_clone_fd u;
    int saved = errno;
    int close_in_child = ((int (*)(int, struct zf_clone_fd *))shim[S_CLONE_PREPARE])((flags & CLONE_FILES) != 0, &u);
    errno = saved;
    if (!close_in_child)
        return next(fn, stack, flags, arg, ptid, newtls, ctid);
    /* The record on the child's own stack, right below where its frames begin: nothing else
     * uses that memory, and it needs no allocation. */
    uintptr_t top = ((uintptr_t)stack - sizeof(struct clone_start)) & ~(uintptr_t)63;
    struct clone_start *c = (struct clone_start *)top;
    c->fn = fn;
    c->arg = arg;
    c->uffd = u;
    return next(clone_child, (void *)top, flags, c, ptid, newtls, ctid);
}
