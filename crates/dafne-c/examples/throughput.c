/*
 * Throughput of libdafne's three ways to move data, beside each other:
 *
 *   throughput CLUSTER_DIR [MIB [CHUNK_KIB [JSON_PATH]]]
 *
 * writes MIB MiB (default 256) to /throughput.bin in CHUNK_KIB pieces
 * (default 4096) and reads it back, once per way:
 *   plain  dafne_pwrite / dafne_pread from malloc'd memory
 *   mem    dafne_pwrite_mem / dafne_pread_mem from dafne_mem_alloc memory
 *   posted dafne_post_write / dafne_post_read, 4 pieces in flight, wait-any
 * and prints a table (MiB/s, and the bytes this client copied), and the
 * same as JSON to JSON_PATH when given. Built by docs/C-API.md's command;
 * crates/dafne/tests/capi.rs compiles it and runs it small (no timing is
 * asserted anywhere).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dafne.h"

#define DEPTH 4

static void die(const char *what, long long rc) {
  fprintf(stderr, "throughput: %s: %s\n", what, rc < 0 ? strerror((int)-rc) : "failed");
  exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t copied(dafne_client *c) {
  dafne_stats s;
  int rc = dafne_get_stats(c, &s);
  if (rc < 0)
    die("dafne_get_stats", rc);
  return s.client_bytes_copied;
}

struct row {
  const char *way, *op;
  double mib_s;
  uint64_t copied;
};

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CLUSTER_DIR [MIB [CHUNK_KIB [JSON_PATH]]]\n", argv[0]);
    return 2;
  }
  size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 256;
  size_t chunk = (argc > 3 ? strtoull(argv[3], NULL, 10) : 4096) * 1024;
  size_t total = mib << 20;
  if (chunk == 0 || total == 0 || total % chunk != 0) {
    fprintf(stderr, "throughput: MIB MiB must be a whole number of CHUNK_KIB KiB pieces\n");
    return 2;
  }
  size_t n = total / chunk;
  dafne_client *c;
  long long rc = dafne_open_client(argv[1], NULL, &c);
  if (rc < 0)
    die("dafne_open_client", rc);
  uint8_t *plain = malloc(chunk * DEPTH);
  dafne_mem *m;
  dafne_cq *q;
  if (!plain || (rc = dafne_mem_alloc(c, chunk * DEPTH, &m)) < 0 || (rc = dafne_cq_create(&q)) < 0)
    die("allocating", rc);
  memset(plain, 0x5a, chunk * DEPTH);
  memset(dafne_mem_addr(m), 0xa5, chunk * DEPTH);
  int fd = dafne_open(c, "/throughput.bin", O_CREAT | O_RDWR | O_TRUNC, 0644);
  if (fd < 0)
    die("dafne_open", fd);

  struct row rows[6];
  int nrows = 0;
  const char *ways[] = {"plain", "mem", "posted"};
  for (int w = 0; w < 3; w++) {
    for (int write = 1; write >= 0; write--) {
      uint64_t before = copied(c);
      double t0 = now();
      if (w == 2) {
        size_t next = 0, done = 0;
        while (done < n) {
          while (next < n && next - done < DEPTH) {
            size_t slot = (next % DEPTH) * chunk;
            rc = write ? dafne_post_write(c, fd, q, m, slot, chunk, (uint64_t)next * chunk)
                       : dafne_post_read(c, fd, q, m, slot, chunk, (uint64_t)next * chunk);
            if (rc < 0)
              die("posting", rc);
            next++;
          }
          dafne_completion cpl;
          if ((rc = dafne_cq_wait_any(q, 60000, &cpl)) < 0)
            die("dafne_cq_wait_any", rc);
          if (cpl.result != (int64_t)chunk)
            die("a posted transfer", cpl.result);
          done++;
        }
      } else {
        for (size_t i = 0; i < n; i++) {
          uint64_t off = (uint64_t)i * chunk;
          if (w == 0)
            rc = write ? dafne_pwrite(c, fd, plain, chunk, off) : dafne_pread(c, fd, plain, chunk, off);
          else
            rc = write ? dafne_pwrite_mem(c, fd, m, 0, chunk, off) : dafne_pread_mem(c, fd, m, 0, chunk, off);
          if (rc != (long long)chunk)
            die(write ? "writing" : "reading", rc);
        }
      }
      if (write && (rc = dafne_fsync(c, fd)) < 0)
        die("dafne_fsync", rc);
      double s = now() - t0;
      rows[nrows++] = (struct row){ways[w], write ? "write+fsync" : "read", (double)mib / s, copied(c) - before};
    }
  }
  dafne_close(c, fd);
  dafne_unlink(c, "/throughput.bin");

  printf("%zu MiB in %zu KiB pieces\n%-7s %-12s %10s %16s\n", mib, chunk / 1024, "way", "op", "MiB/s",
         "client copied");
  for (int i = 0; i < nrows; i++)
    printf("%-7s %-12s %10.0f %16llu\n", rows[i].way, rows[i].op, rows[i].mib_s,
           (unsigned long long)rows[i].copied);
  if (argc > 4) {
    FILE *j = fopen(argv[4], "w");
    if (!j)
      die(argv[4], -errno);
    fprintf(j, "{\"mib\": %zu, \"chunk_kib\": %zu, \"rows\": [", mib, chunk / 1024);
    for (int i = 0; i < nrows; i++)
      fprintf(j, "%s{\"way\": \"%s\", \"op\": \"%s\", \"mib_s\": %.1f, \"client_bytes_copied\": %llu}",
              i ? ", " : "", rows[i].way, rows[i].op, rows[i].mib_s, (unsigned long long)rows[i].copied);
    fprintf(j, "]}\n");
    fclose(j);
  }
  dafne_cq_destroy(q);
  dafne_mem_free(m);
  free(plain);
  return dafne_close_client(c) < 0;
}
