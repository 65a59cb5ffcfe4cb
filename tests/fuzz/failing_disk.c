/* LD_PRELOAD shim for the hardening test: a disk that dies. Once ROUNDOFF_FAIL_AFTER
   bytes have been written to files under the folder ROUNDOFF_FAIL_DIR, every further
   write there fails with errno ROUNDOFF_FAIL_ERRNO (EIO if unset), as on a failing drive;
   other files are written as usual. HDF5's sec2 driver writes with pwrite. */
#undef _FILE_OFFSET_BITS /* pwrite and pwrite64 are both replaced, each under its own name */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static _Atomic long long bytes_written;

static int under_failing_folder(int fd) {
  const char* folder = getenv("ROUNDOFF_FAIL_DIR");
  if (!folder || !*folder) return 0;
  char link[64], target[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  const size_t length = strlen(folder);
  return strncmp(target, folder, length) == 0 && target[length] == '/';
}

/* Whether this write of `count` bytes to fd fails; sets errno if so. */
static int fails(int fd, size_t count) {
  if (!under_failing_folder(fd)) return 0;
  const char* after = getenv("ROUNDOFF_FAIL_AFTER");
  const long long budget = after ? atoll(after) : 0;
  if (atomic_fetch_add(&bytes_written, (long long)count) + (long long)count <= budget) return 0;
  const char* error = getenv("ROUNDOFF_FAIL_ERRNO");
  errno = error ? atoi(error) : EIO;
  return 1;
}

ssize_t pwrite(int fd, const void* buffer, size_t count, off_t offset) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (!real) real = (ssize_t (*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  return fails(fd, count) ? -1 : real(fd, buffer, count, offset);
}

ssize_t pwrite64(int fd, const void* buffer, size_t count, off64_t offset) {
  static ssize_t (*real)(int, const void*, size_t, off64_t);
  if (!real) real = (ssize_t (*)(int, const void*, size_t, off64_t))dlsym(RTLD_NEXT, "pwrite64");
  return fails(fd, count) ? -1 : real(fd, buffer, count, offset);
}

ssize_t write(int fd, const void* buffer, size_t count) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = (ssize_t (*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  return fails(fd, count) ? -1 : real(fd, buffer, count);
}
