/*
 * zerofault.h: the C API of libzerofault.so (the same library is the LD_PRELOAD shim).
 *
 * Link with -lzerofault, or load the library with LD_PRELOAD / `zerofault run` and declare
 * these yourself. Every function is safe to call whether or not the engine runs: without
 * userfaultfd (or with ZEROFAULT_DISABLE=1) memory is plain kernel memory and the counters
 * stay zero.
 */
#ifndef ZEROFAULT_H
#define ZEROFAULT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Maps len bytes (rounded up to 4 KiB pages) of anonymous private read-write memory whose
 * first touch the engine serves. Reads zero. NULL on failure. */
void *zerofault_map(size_t len);

/* Unmaps memory from zerofault_map (same pointer and length). 0, or -1 with errno set. */
int zerofault_unmap(void *addr, size_t len);

/* Discards [addr, addr + len) like madvise(MADV_DONTNEED): it reads zero afterwards. The pages
 * the engine installed there are not freed but kept in its pool, zeroed in the background and
 * handed to the next fault anywhere in the process (faster than fresh memory). addr is page
 * aligned; len is rounded up to pages. 0, or -1 with errno set (EINVAL, or madvise's own). */
int zerofault_recycle(void *addr, size_t len);

/* 1 when the engine serves faults in this process, 0 when the program runs on plain memory
 * (no userfaultfd, disabled, or the engine failed open). */
int zerofault_active(void);

/* Writes the engine's counters as one JSON object ({"fault_events":..,"pages_moved":..,..})
 * into buf, NUL-terminated and truncated to cap bytes. Returns the JSON's full length without
 * the NUL, like snprintf: call with cap 0 to size the buffer. The counters cover this process
 * and the children it forked. */
size_t zerofault_stats_json(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* ZEROFAULT_H */
