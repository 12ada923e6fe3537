#ifndef CLINUXEVENTS_SHIM_H
#define CLINUXEVENTS_SHIM_H
// What FileDownload needs of Linux that Glibc declares only under _GNU_SOURCE.
#include <sys/syscall.h>
#include <unistd.h>
#include <stdint.h>
#include <fcntl.h>

/// Starts write-back of a file range without waiting (sync_file_range with
/// SYNC_FILE_RANGE_WRITE, which Glibc declares only under _GNU_SOURCE).
static inline int heraldlab_start_writeback(int fd, int64_t offset, int64_t length) {
    return (int)syscall(SYS_sync_file_range, fd, offset, length, 2 /* SYNC_FILE_RANGE_WRITE */);
}
/// O_DIRECT (Glibc names it only under _GNU_SOURCE; its value differs between architectures).
static inline int heraldlab_o_direct(void) {
    return __O_DIRECT;
}
#endif
