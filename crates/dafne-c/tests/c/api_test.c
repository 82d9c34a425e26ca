/*
 * The C ABI against a running cluster: `api_test CLUSTER_DIR`.
 *
 * Built and run by crates/dafne/tests/capi.rs (which starts the cluster
 * with 4 io servers and 64 KiB stripes). Every check compares bytes, sizes
 * and errnos exactly; the first failure prints its line and exits 1.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dafne.h"

static int checks;

/* Files of /dev/shm of 1 GiB or more (where UCX allocates on one host). */
static int huge_shm_files(void) {
  DIR *d = opendir("/dev/shm");
  if (!d)
    return 0;
  int n = 0;
  struct dirent *e;
  char path[512];
  struct stat st;
  while ((e = readdir(d))) {
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_size >= (off_t)1 << 30)
      n++;
  }
  closedir(d);
  return n;
}

#define CHECK(cond)                                                            \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      fprintf(stderr, "api_test.c:%d: check failed: %s\n", __LINE__, #cond);   \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* A call's result must be `want`; prints both when not. */
#define EQ(expr, want)                                                         \
  do {                                                                         \
    long long got_ = (long long)(expr);                                        \
    long long want_ = (long long)(want);                                       \
    checks++;                                                                  \
    if (got_ != want_) {                                                       \
      fprintf(stderr, "api_test.c:%d: %s = %lld, expected %lld\n", __LINE__,   \
              #expr, got_, want_);                                             \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Bytes that differ at every offset, reproducible from `seed`. */
static void pattern(uint8_t *p, size_t len, uint64_t seed) {
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (size_t i = 0; i < len; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    p[i] = (uint8_t)(x >> 33);
  }
}

/* The first offset where a and b differ, or -1. */
static long long differ(const uint8_t *a, const uint8_t *b, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (a[i] != b[i])
      return (long long)i;
  return -1;
}

static dafne_stats stats(dafne_client *c) {
  dafne_stats s;
  EQ(dafne_get_stats(c, &s), 0);
  EQ(s.io_servers_answering, s.io_servers);
  return s;
}

/* Whether the directory `dir` lists `name` with type `kind`. */
static int listed(dafne_client *c, const char *dir, const char *name,
                  uint8_t kind) {
  dafne_dirent ents[2];
  uint64_t cookie = 0;
  int n, found = 0;
  /* Two at a time, so that the listing takes several pages. */
  while ((n = dafne_readdir(c, dir, &cookie, ents, 2)) > 0)
    for (int i = 0; i < n; i++)
      if (strcmp(ents[i].name, name) == 0 && ents[i].kind == kind)
        found++;
  EQ(n, 0);
  return found;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CLUSTER_DIR\n", argv[0]);
    return 2;
  }
  dafne_client *c = NULL;
  EQ(dafne_open_client("/nonexistent/dafne", NULL, &c), -ENOENT);
  CHECK(c == NULL);
  EQ(dafne_open_client(argv[1], NULL, &c), 0);
  CHECK(c != NULL);
  EQ(DAFNE_ABI_VERSION, 1);

  /* The namespace. */
  EQ(dafne_mkdir(c, "/capi", 0755), 0);
  EQ(dafne_mkdir(c, "/capi", 0755), -EEXIST);
  EQ(dafne_mkdir(c, "/nodir/sub", 0755), -ENOENT);
  dafne_attr st;
  EQ(dafne_stat(c, "/capi", &st), 0);
  EQ(st.mode & S_IFMT, S_IFDIR);
  EQ(st.mode & 07777, 0755);

  /* A pattern over many stripes (64 KiB units, 4 servers), from plain
   * memory, read back byte by byte. */
  const size_t len = 3 * 1024 * 1024 + 12345;
  uint8_t *src = malloc(len), *back = malloc(len);
  CHECK(src && back);
  pattern(src, len, 1);
  int fd = dafne_open(c, "/capi/data", O_CREAT | O_EXCL | O_RDWR, 0640);
  CHECK(fd >= 0);
  EQ(dafne_open(c, "/capi/data", O_CREAT | O_EXCL | O_RDWR, 0640), -EEXIST);
  EQ(dafne_pwrite(c, fd, src, len, 0), len);
  EQ(dafne_fstat(c, fd, &st), 0);
  EQ(st.size, len); /* this descriptor sees its own writes */
  memset(back, 0, len);
  EQ(dafne_pread(c, fd, back, len, 0), len);
  EQ(differ(src, back, len), -1);
  /* A short read at the end, nothing past it. */
  EQ(dafne_pread(c, fd, back, 1000, len - 10), 10);
  EQ(differ(src + len - 10, back, 10), -1);
  EQ(dafne_pread(c, fd, back, 1000, len + 5), 0);
  /* Small pieces at unaligned offsets across a stripe boundary. */
  memset(back, 0, 4096);
  EQ(dafne_pread(c, fd, back, 3000, 65536 - 1500), 3000);
  EQ(differ(src + 65536 - 1500, back, 3000), -1);
  EQ(dafne_fsync(c, fd), 0);
  EQ(dafne_stat(c, "/capi/data", &st), 0);
  EQ(st.size, len);
  EQ(st.mode & S_IFMT, S_IFREG);
  EQ(st.mode & 07777, 0640);
  EQ(dafne_close(c, fd), 0);
  EQ(dafne_close(c, fd), -EBADF);

  /* Another client sees the data (from the servers, not this client). */
  dafne_client *c2 = NULL;
  EQ(dafne_open_client(argv[1], NULL, &c2), 0);
  int fd2 = dafne_open(c2, "/capi/data", O_RDONLY, 0);
  CHECK(fd2 >= 0);
  memset(back, 0, len);
  EQ(dafne_pread(c2, fd2, back, len, 0), len);
  EQ(differ(src, back, len), -1);
  EQ(dafne_pwrite(c2, fd2, src, 10, 0), -EBADF); /* read-only */
  EQ(dafne_ftruncate(c2, fd2, 0), -EBADF);
  EQ(dafne_close(c2, fd2), 0);
  EQ(dafne_close_client(c2), 0);

  /* O_TRUNC empties the file; a write-only descriptor cannot read. */
  fd = dafne_open(c, "/capi/data", O_WRONLY | O_TRUNC, 0);
  CHECK(fd >= 0);
  EQ(dafne_pread(c, fd, back, 10, 0), -EBADF);
  EQ(dafne_fstat(c, fd, &st), 0);
  EQ(st.size, 0);
  EQ(dafne_pwrite(c, fd, src, len, 0), len);
  EQ(dafne_close(c, fd), 0); /* publishes the size */
  EQ(dafne_stat(c, "/capi/data", &st), 0);
  EQ(st.size, len);

  /* Zero-copy: memory from dafne_mem_alloc, which the io servers put and
   * get directly; neither this client nor the servers copy a byte. */
  const size_t zlen = 4 * 1024 * 1024 + 4096;
  dafne_mem *wm = NULL, *rm = NULL;
  EQ(dafne_mem_alloc(c, zlen, &wm), 0);
  EQ(dafne_mem_alloc(c, zlen, &rm), 0);
  EQ(dafne_mem_len(wm), zlen);
  uint8_t *w = dafne_mem_addr(wm), *r = dafne_mem_addr(rm);
  CHECK(w && r);
  pattern(w, zlen, 2);
  memset(r, 0, zlen);
  fd = dafne_open(c, "/capi/zc", O_CREAT | O_RDWR, 0644);
  CHECK(fd >= 0);
  dafne_stats before = stats(c);
  EQ(dafne_pwrite_mem(c, fd, wm, 0, zlen, 0), zlen);
  EQ(dafne_pread_mem(c, fd, rm, 0, zlen, 0), zlen);
  /* Into the middle of the memory, from the middle of the file. */
  EQ(dafne_pread_mem(c, fd, rm, 100, 5000, 70000), 5000);
  dafne_stats after = stats(c);
  EQ(after.client_bytes_copied - before.client_bytes_copied, 0);
  EQ(after.server_bytes_copied - before.server_bytes_copied, 0);
  EQ(differ(w + 70000, r + 100, 5000), -1);
  EQ(differ(w + 5100, r + 5100, zlen - 5100), -1);
  EQ(differ(w, r, 100), -1);
  /* The counter does move: a small write from plain memory is copied. */
  EQ(dafne_pwrite(c, fd, src, 1000, zlen), 1000);
  dafne_stats copied = stats(c);
  EQ(copied.client_bytes_copied - after.client_bytes_copied, 1000);
  EQ(dafne_pread_mem(c, fd, rm, zlen - 10, 11, 0), -EINVAL); /* past it */
  EQ(dafne_close(c, fd), 0);
  EQ(dafne_stat(c, "/capi/zc", &st), 0);
  EQ(st.size, zlen + 1000);

  /* Asynchronous I/O: 8 writes and 8 reads of 512 KiB posted at once on a
   * completion queue, taken with wait-any and wait-one. */
  dafne_cq *q = NULL;
  EQ(dafne_cq_create(&q), 0);
  dafne_completion done;
  EQ(dafne_cq_poll(q, &done), -EAGAIN);
  EQ(dafne_cq_wait_any(q, 10, &done), -ENOENT); /* nothing outstanding */
  const size_t piece = 512 * 1024;
  const int pieces = 8;
  fd = dafne_open(c, "/capi/async", O_CREAT | O_RDWR, 0644);
  CHECK(fd >= 0);
  int64_t tickets[8];
  for (int i = 0; i < pieces; i++) {
    tickets[i] = dafne_post_write(c, fd, q, wm, i * piece, piece,
                                  (uint64_t)(pieces - 1 - i) * piece);
    CHECK(tickets[i] > 0);
    for (int j = 0; j < i; j++)
      CHECK(tickets[j] != tickets[i]);
  }
  int seen[8] = {0};
  for (int n = 0; n < pieces; n++) {
    EQ(dafne_cq_wait_any(q, 30000, &done), 0);
    EQ(done.result, piece);
    int which = -1;
    for (int i = 0; i < pieces; i++)
      if ((int64_t)done.ticket == tickets[i])
        which = i;
    CHECK(which >= 0 && !seen[which]);
    seen[which] = 1;
  }
  EQ(dafne_cq_outstanding(q), 0);
  EQ(dafne_fstat(c, fd, &st), 0);
  EQ(st.size, pieces * piece);
  memset(r, 0, zlen);
  for (int i = 0; i < pieces; i++) {
    tickets[i] = dafne_post_read(c, fd, q, rm, i * piece, piece,
                                 (uint64_t)i * piece);
    CHECK(tickets[i] > 0);
  }
  /* One ticket first: the others stay queued for wait-any. */
  EQ(dafne_cq_wait(q, tickets[5], 30000, &done), 0);
  EQ(done.ticket, tickets[5]);
  EQ(done.result, piece);
  for (int n = 0; n < pieces - 1; n++) {
    EQ(dafne_cq_wait_any(q, 30000, &done), 0);
    CHECK((int64_t)done.ticket != tickets[5]);
    EQ(done.result, piece);
  }
  EQ(dafne_cq_poll(q, &done), -EAGAIN);
  /* The file holds the pieces in reverse order. */
  for (int i = 0; i < pieces; i++)
    EQ(differ(w + (pieces - 1 - i) * piece, r + i * piece, piece), -1);
  /* A read past the end completes with 0 bytes; a bad descriptor is
   * refused when posting. */
  int64_t t = dafne_post_read(c, fd, q, rm, 0, piece, 100 * piece);
  CHECK(t > 0);
  EQ(dafne_cq_wait(q, t, 30000, &done), 0);
  EQ(done.result, 0);
  EQ(dafne_post_read(c, 999, q, rm, 0, piece, 0), -EBADF);
  EQ(dafne_post_write(c, fd, q, rm, zlen, 1, 0), -EINVAL);

  /* The application's own memory, registered, posted the same way. */
  uint8_t *mine = malloc(piece), *mine_back = malloc(piece);
  CHECK(mine && mine_back);
  pattern(mine, piece, 3);
  memset(mine_back, 0, piece);
  dafne_mem *um = NULL, *um_back = NULL;
  EQ(dafne_mem_register(c, mine, piece, &um), 0);
  EQ(dafne_mem_register(c, mine_back, piece, &um_back), 0);
  CHECK(dafne_mem_addr(um) == mine);
  t = dafne_post_write(c, fd, q, um, 0, piece, 2 * piece);
  CHECK(t > 0);
  EQ(dafne_cq_wait(q, t, 30000, &done), 0);
  EQ(done.result, piece);
  t = dafne_post_read(c, fd, q, um_back, 0, piece, 2 * piece);
  CHECK(t > 0);
  EQ(dafne_cq_wait(q, t, 30000, &done), 0);
  EQ(done.result, piece);
  EQ(differ(mine, mine_back, piece), -1);
  memset(mine_back, 0, piece);
  EQ(dafne_pread_mem(c, fd, um_back, 0, piece, 2 * piece), piece);
  EQ(differ(mine, mine_back, piece), -1);
  EQ(dafne_mem_free(um), 0);
  EQ(dafne_mem_free(um_back), 0);
  EQ(dafne_fsync(c, fd), 0);
  EQ(dafne_close(c, fd), 0);

  /* Close with a posted write still running waits for it: the size it
   * publishes includes the write, whose completion stays on the queue. */
  fd = dafne_open(c, "/capi/closing", O_CREAT | O_RDWR, 0644);
  CHECK(fd >= 0);
  EQ(dafne_pwrite(c, fd, src, 2, 0), 2);
  for (int i = 0; i < pieces; i++) {
    tickets[i] = dafne_post_write(c, fd, q, wm, i * piece, piece,
                                  (uint64_t)i * piece);
    CHECK(tickets[i] > 0);
  }
  EQ(dafne_close(c, fd), 0);
  EQ(dafne_stat(c, "/capi/closing", &st), 0);
  EQ(st.size, pieces * piece);
  for (int i = 0; i < pieces; i++) {
    EQ(dafne_cq_wait(q, tickets[i], 30000, &done), 0);
    EQ(done.result, piece);
  }
  EQ(dafne_cq_outstanding(q), 0);
  EQ(dafne_unlink(c, "/capi/closing"), 0);
  EQ(dafne_cq_destroy(q), 0);

  /* readdir lists every file, over several pages. */
  EQ(listed(c, "/capi", "data", DT_REG), 1);
  EQ(listed(c, "/capi", "zc", DT_REG), 1);
  EQ(listed(c, "/capi", "async", DT_REG), 1);
  EQ(listed(c, "/", "capi", DT_DIR), 1);
  EQ(listed(c, "/capi", "nothing", DT_REG), 0);
  EQ(listed(c, "/capi", ".", DT_DIR) + listed(c, "/capi", "..", DT_DIR), 0);

  /* rename, then unlink: the old name and then the new one are gone. */
  EQ(dafne_rename(c, "/capi/data", "/capi/renamed"), 0);
  EQ(dafne_stat(c, "/capi/data", &st), -ENOENT);
  EQ(dafne_stat(c, "/capi/renamed", &st), 0);
  EQ(st.size, len);
  EQ(listed(c, "/capi", "data", DT_REG), 0);
  EQ(listed(c, "/capi", "renamed", DT_REG), 1);
  EQ(dafne_unlink(c, "/capi/renamed"), 0);
  EQ(dafne_stat(c, "/capi/renamed", &st), -ENOENT);
  EQ(dafne_open(c, "/capi/renamed", O_RDONLY, 0), -ENOENT);
  EQ(dafne_unlink(c, "/capi/renamed"), -ENOENT);

  /* Errors as errno. */
  dafne_dirent ent;
  uint64_t cookie = 0;
  EQ(dafne_open(c, "/capi", O_RDONLY, 0), -EISDIR);
  EQ(dafne_open(c, "/capi/zc", O_WRONLY | O_APPEND, 0), -EINVAL);
  EQ(dafne_open(c, "/capi/zc/x", O_RDONLY, 0), -ENOTDIR);
  EQ(dafne_readdir(c, "/capi/zc", &cookie, &ent, 1), -ENOTDIR);
  EQ(dafne_readdir(c, "/capi", &cookie, &ent, 0), -EINVAL);
  EQ(dafne_rmdir(c, "/capi"), -ENOTEMPTY);
  EQ(dafne_unlink(c, "/capi"), -EISDIR);
  EQ(dafne_pread(c, 999, back, 10, 0), -EBADF);
  EQ(dafne_pread(c, -1, back, 10, 0), -EBADF);
  EQ(dafne_fsync(c, 42), -EBADF);
  EQ(dafne_pread(NULL, 0, back, 10, 0), -EINVAL);
  EQ(dafne_stat(c, NULL, &st), -EINVAL);
  EQ(dafne_stat(c, "/capi", NULL), -EINVAL);
  EQ(dafne_mem_alloc(c, 0, &wm), -EINVAL);
  /* A length past half of the available memory is refused before any
   * allocation: nothing new appears in /dev/shm. */
  int huge_before = huge_shm_files();
  dafne_mem *huge = NULL;
  EQ(dafne_mem_alloc(c, SIZE_MAX, &huge), -ENOMEM);
  EQ(dafne_mem_alloc(c, (size_t)1 << 62, &huge), -ENOMEM);
  CHECK(huge == NULL);
  EQ(huge_shm_files(), huge_before);
  EQ(dafne_open(c, "", O_RDONLY, 0), -ENOENT);
  EQ(dafne_pread_mem(c, 0, NULL, 0, 1, 0), -EINVAL);
  /* Readable memory that holds no handle is refused by the missing tag. */
  _Alignas(16) uint8_t junk[1024];
  memset(junk, 0x5a, sizeof junk);
  EQ(dafne_cq_poll((dafne_cq *)junk, &done), -EBADF);
  EQ(dafne_get_stats((dafne_client *)junk, &before), -EBADF);
  EQ(dafne_mem_free((dafne_mem *)junk), -EBADF);
  EQ(dafne_pread(c, 0, back, 10, 0), -EBADF); /* no descriptor 0 open */

  /* Clean up. */
  EQ(dafne_unlink(c, "/capi/zc"), 0);
  EQ(dafne_unlink(c, "/capi/async"), 0);
  EQ(dafne_rmdir(c, "/capi"), 0);
  EQ(dafne_stat(c, "/capi", &st), -ENOENT);
  EQ(dafne_mem_free(wm), 0);
  EQ(dafne_mem_free(rm), 0);
  EQ(dafne_close_client(c), 0);
  free(src);
  free(back);
  free(mine);
  free(mine_back);
  printf("api_test: %d checks passed\n", checks);
  return 0;
}
