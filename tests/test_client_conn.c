/* test_client_conn.c -- libfp4idx-client's transport and error handling
 * against an in-process fake daemon (a thread on a temporary Unix socket)
 * that misbehaves on purpose: byte-at-a-time replies, a close in the middle
 * of a response, silence (timeouts), wrong ids, garbage, oversize
 * announcements, error replies, an early close while the client is still
 * sending. Also: absent daemon, default socket path, argument checks. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fp4idx_client.h"
#include "fp4idx_codec.h"
#include "spin.h"

typedef enum {
  FAKE_SLOW_OK,      /* info reply written one byte at a time */
  FAKE_CLOSE_MID,    /* header + half the body, then close */
  FAKE_SILENT,       /* read the request, never answer */
  FAKE_BAD_ID,       /* answer with another id */
  FAKE_ERROR_THEN_OK,/* ENOSEQ error reply, then a good info reply */
  FAKE_HUGE,         /* announce a 4 GiB - 1 frame */
  FAKE_GARBAGE,      /* a frame that is not msgpack */
  FAKE_CLOSE_AT_ONCE,/* accept and close without reading */
  FAKE_EARLY_E2BIG,  /* read only the header, reply E2BIG (id 0), close */
  FAKE_SCORE_PIECES, /* score replies in 7-byte pieces: canonical, then
                        fields reordered with unknown keys */
  FAKE_SCORE_TRUNC,  /* score reply cut inside the logits payload */
  FAKE_SCORE_BAD_SHAPE, /* logits with one row too many */
  FAKE_SCORE_THEN_INFO  /* a score reply (client buffer too small), then info */
} fake_mode_t;

typedef struct {
  char path[108];
  int lfd;
  fake_mode_t mode;
  pthread_t th;
  volatile int stop;
} fake_t;

static int read_n(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return -1;
    }
    got += (size_t)r;
  }
  return 0;
}

static void write_n(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    c += w;
    n -= (size_t)w;
  }
}

/* Reads one request; returns its decoded id and op (0/NONE on failure). */
static int read_request(int fd, uint64_t *id, fp4idx_op_t *op) {
  unsigned char hdr[4];
  if (read_n(fd, hdr, 4) != 0) return -1;
  size_t n = fp4idx_frame_header_get(hdr);
  unsigned char *b = malloc(n ? n : 1);
  if (read_n(fd, b, n) != 0) {
    free(b);
    return -1;
  }
  fp4idx_request_t req;
  int rc = fp4idx_decode_request(b, n, &req, NULL, 0);
  *id = req.id;
  *op = req.op;
  fp4idx_request_clear(&req);
  free(b);
  return rc;
}

static void info_reply(msgpack_sbuffer *sb, uint64_t id) {
  fp4idx_response_t r = {.id = id, .op = FP4IDX_OP_INFO};
  r.u.info.version = 1;
  strcpy(r.u.info.server, "fake 9.9.9");
  strcpy(r.u.info.backend, "cpu");
  strcpy(r.u.info.device, "fake device");
  r.u.info.page_size = 64;
  r.u.info.pages_total = 10;
  r.u.info.pages_free = 7;
  r.u.info.sequences = 2;
  r.u.info.max_frame = 1u << 20;
  cr_assert_eq(fp4idx_encode_response(sb, &r), 0);
}

/* Score reply rows x width, logits[i] = i / 2; `odd`: status first, then
 * unknown keys (nested), the result's keys reversed, tensor keys shuffled
 * (dtype, shape still before data) -- all valid for a client. */
#define SC_ROWS 2u
#define SC_WIDTH 3000u
static void score_reply(msgpack_sbuffer *sb, uint64_t id, uint32_t rows, int odd) {
  size_t n = (size_t)rows * SC_WIDTH;
  float *v = malloc(n * 4);
  for (size_t i = 0; i < n; i++) v[i] = (float)i / 2;
  msgpack_sbuffer body;
  msgpack_sbuffer_init(&body);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &body, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, odd ? 4 : 3);
  if (odd) {
    msgpack_pack_str(&pk, 6); msgpack_pack_str_body(&pk, "status", 6); msgpack_pack_int(&pk, 0);
    msgpack_pack_str(&pk, 5); msgpack_pack_str_body(&pk, "extra", 5);
    msgpack_pack_array(&pk, 3); msgpack_pack_nil(&pk); msgpack_pack_double(&pk, 1.5);
    msgpack_pack_map(&pk, 1); msgpack_pack_str(&pk, 1); msgpack_pack_str_body(&pk, "k", 1);
    msgpack_pack_bin(&pk, 3); msgpack_pack_bin_body(&pk, "xyz", 3);
    msgpack_pack_str(&pk, 2); msgpack_pack_str_body(&pk, "id", 2); msgpack_pack_uint64(&pk, id);
  } else {
    msgpack_pack_str(&pk, 2); msgpack_pack_str_body(&pk, "id", 2); msgpack_pack_uint64(&pk, id);
    msgpack_pack_str(&pk, 6); msgpack_pack_str_body(&pk, "status", 6); msgpack_pack_int(&pk, 0);
  }
  msgpack_pack_str(&pk, 7); msgpack_pack_str_body(&pk, "results", 7);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 2);
  if (!odd) { msgpack_pack_str(&pk, 3); msgpack_pack_str_body(&pk, "seq", 3); msgpack_pack_uint64(&pk, 5); }
  msgpack_pack_str(&pk, 6); msgpack_pack_str_body(&pk, "logits", 6);
  msgpack_pack_map(&pk, odd ? 4 : 3);
  if (odd) { msgpack_pack_str(&pk, 4); msgpack_pack_str_body(&pk, "note", 4); msgpack_pack_int(&pk, -7); }
  msgpack_pack_str(&pk, 5); msgpack_pack_str_body(&pk, "shape", 5);
  msgpack_pack_array(&pk, 2); msgpack_pack_uint32(&pk, rows); msgpack_pack_uint32(&pk, SC_WIDTH);
  msgpack_pack_str(&pk, 5); msgpack_pack_str_body(&pk, "dtype", 5);
  msgpack_pack_str(&pk, 3); msgpack_pack_str_body(&pk, "f32", 3);
  msgpack_pack_str(&pk, 4); msgpack_pack_str_body(&pk, "data", 4);
  msgpack_pack_bin(&pk, n * 4); msgpack_pack_bin_body(&pk, v, n * 4);
  if (odd) { msgpack_pack_str(&pk, 3); msgpack_pack_str_body(&pk, "seq", 3); msgpack_pack_uint64(&pk, 5); }
  unsigned char hdr[4];
  fp4idx_frame_header_put(hdr, (uint32_t)body.size);
  msgpack_sbuffer_write(sb, (const char *)hdr, 4);
  msgpack_sbuffer_write(sb, body.data, body.size);
  msgpack_sbuffer_destroy(&body);
  free(v);
}

static void write_pieces(int fd, const char *p, size_t n, size_t piece) {
  for (size_t i = 0; i < n; i += piece) {
    write_n(fd, p + i, n - i < piece ? n - i : piece);
    if (i % (piece * 512) == 0) usleep(100);
  }
}

static void *fake_main(void *arg) {
  fake_t *f = arg;
  int fd = accept(f->lfd, NULL, NULL);
  if (fd < 0) return NULL;
  uint64_t id = 0;
  fp4idx_op_t op;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  switch (f->mode) {
    case FAKE_SLOW_OK:
      if (read_request(fd, &id, &op) != 0) break;
      info_reply(&sb, id);
      for (size_t i = 0; i < sb.size; i++) {
        write_n(fd, sb.data + i, 1);
        usleep(200);
      }
      break;
    case FAKE_CLOSE_MID:
      if (read_request(fd, &id, &op) != 0) break;
      info_reply(&sb, id);
      write_n(fd, sb.data, sb.size / 2);
      break;
    case FAKE_SILENT:
      read_request(fd, &id, &op);
      while (!f->stop) usleep(1000);
      break;
    case FAKE_BAD_ID:
      if (read_request(fd, &id, &op) != 0) break;
      info_reply(&sb, id + 1);
      write_n(fd, sb.data, sb.size);
      break;
    case FAKE_ERROR_THEN_OK:
      if (read_request(fd, &id, &op) != 0) break;
      fp4idx_encode_error(&sb, id, FP4IDX_ENOSEQ, "unknown sequence 42");
      write_n(fd, sb.data, sb.size);
      sb.size = 0;
      if (read_request(fd, &id, &op) != 0) break;
      info_reply(&sb, id);
      write_n(fd, sb.data, sb.size);
      break;
    case FAKE_HUGE: {
      if (read_request(fd, &id, &op) != 0) break;
      unsigned char hdr[4] = {0xff, 0xff, 0xff, 0xff};
      write_n(fd, hdr, 4);
      while (!f->stop) usleep(1000);
      break;
    }
    case FAKE_GARBAGE: {
      if (read_request(fd, &id, &op) != 0) break;
      unsigned char frame[7] = {0, 0, 0, 3, 0xc1, 0xc1, 0xc1};
      write_n(fd, frame, sizeof frame);
      break;
    }
    case FAKE_CLOSE_AT_ONCE:
      break;
    case FAKE_EARLY_E2BIG: {
      unsigned char hdr[4];
      if (read_n(fd, hdr, 4) != 0) break;
      fp4idx_encode_error(&sb, 0, FP4IDX_E2BIG,
                          "frame of 9999999 bytes exceeds max-frame 1048576");
      write_n(fd, sb.data, sb.size);
      break;
    }
    case FAKE_SCORE_PIECES:
      for (int odd = 0; odd < 2; odd++) {
        if (read_request(fd, &id, &op) != 0) break;
        sb.size = 0;
        score_reply(&sb, id, SC_ROWS, odd);
        write_pieces(fd, sb.data, sb.size, 7);
      }
      break;
    case FAKE_SCORE_TRUNC:
      if (read_request(fd, &id, &op) != 0) break;
      score_reply(&sb, id, SC_ROWS, 0);
      write_n(fd, sb.data, sb.size - 1000);
      break;
    case FAKE_SCORE_BAD_SHAPE:
      if (read_request(fd, &id, &op) != 0) break;
      score_reply(&sb, id, SC_ROWS + 1, 0);
      write_n(fd, sb.data, sb.size);
      while (!f->stop) usleep(1000);
      break;
    case FAKE_SCORE_THEN_INFO:
      if (read_request(fd, &id, &op) != 0) break;
      score_reply(&sb, id, SC_ROWS, 0);
      write_n(fd, sb.data, sb.size);
      sb.size = 0;
      if (read_request(fd, &id, &op) != 0) break;
      info_reply(&sb, id);
      write_n(fd, sb.data, sb.size);
      break;
  }
  msgpack_sbuffer_destroy(&sb);
  close(fd);
  return NULL;
}

static void fake_start(fake_t *f, fake_mode_t mode) {
  memset(f, 0, sizeof *f);
  f->mode = mode;
  snprintf(f->path, sizeof f->path, "/tmp/fp4idx-fake-%d-%d.sock", getpid(),
           (int)mode);
  unlink(f->path);
  f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  cr_assert(f->lfd >= 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strcpy(a.sun_path, f->path);
  cr_assert_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0, "%s",
               strerror(errno));
  cr_assert_eq(listen(f->lfd, 4), 0);
  cr_assert_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(fake_t *f) {
  f->stop = 1;
  pthread_join(f->th, NULL);
  close(f->lfd);
  unlink(f->path);
}

static fp4idx_client_t *connect_to(fake_t *f) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_assert_eq(fp4idx_client_connect(c, f->path), FP4IDX_OK, "%s",
               fp4idx_client_last_error(c));
  cr_assert(fp4idx_client_connected(c));
  return c;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

Test(conn, reply_in_one_byte_pieces) {
  fake_t f;
  fake_start(&f, FAKE_SLOW_OK);
  fp4idx_client_t *c = connect_to(&f);
  fp4idx_client_info_t in;
  cr_assert_eq(fp4idx_client_info(c, &in), FP4IDX_OK, "%s",
               fp4idx_client_last_error(c));
  cr_expect_str_eq(in.server, "fake 9.9.9");
  cr_expect_str_eq(in.backend, "cpu");
  cr_expect_str_eq(in.device, "fake device");
  cr_expect_eq(in.pages_total, 10);
  cr_expect_eq(in.pages_free, 7);
  cr_expect_eq(in.max_frame, 1u << 20);
  cr_expect_str_eq(fp4idx_client_last_error(c), "");
  cr_expect_eq(fp4idx_client_last_status(c), FP4IDX_OK);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, close_mid_response_is_econn) {
  fake_t f;
  fake_start(&f, FAKE_CLOSE_MID);
  fp4idx_client_t *c = connect_to(&f);
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_ECONN);
  cr_expect(strstr(fp4idx_client_last_error(c), "closed") != NULL, "%s",
            fp4idx_client_last_error(c));
  cr_expect(!fp4idx_client_connected(c));
  /* Every later call: ECONN until a reconnect. */
  cr_expect_eq(fp4idx_client_drop(c, 1), FP4IDX_ECONN);
  cr_expect(strstr(fp4idx_client_last_error(c), "not connected") != NULL);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, close_before_reading_is_econn) {
  fake_t f;
  fake_start(&f, FAKE_CLOSE_AT_ONCE);
  fp4idx_client_t *c = connect_to(&f);
  pthread_join(f.th, NULL); /* the fake has closed its end */
  f.th = pthread_self();
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_ECONN);
  cr_expect(!fp4idx_client_connected(c));
  fp4idx_client_close(c);
  close(f.lfd);
  unlink(f.path);
}

Test(conn, timeout_closes_the_connection) {
  fake_t f;
  fake_start(&f, FAKE_SILENT);
  fp4idx_client_t *c = connect_to(&f);
  cr_assert_eq(fp4idx_client_set_timeout(c, 200), FP4IDX_OK);
  double t0 = now_ms();
  cr_expect_eq(fp4idx_client_drop(c, 5), FP4IDX_ETIMEDOUT);
  double dt = now_ms() - t0;
  cr_expect(dt >= 150 && dt < 3000, "timed out after %.0f ms", dt);
  cr_expect(strstr(fp4idx_client_last_error(c), "timed out") != NULL, "%s",
            fp4idx_client_last_error(c));
  cr_expect(!fp4idx_client_connected(c));
  cr_expect_eq(fp4idx_client_drop(c, 5), FP4IDX_ECONN);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, wrong_id_is_eproto) {
  fake_t f;
  fake_start(&f, FAKE_BAD_ID);
  fp4idx_client_t *c = connect_to(&f);
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_EPROTO);
  cr_expect(strstr(fp4idx_client_last_error(c), "id") != NULL);
  cr_expect(!fp4idx_client_connected(c));
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, garbage_is_eproto) {
  fake_t f;
  fake_start(&f, FAKE_GARBAGE);
  fp4idx_client_t *c = connect_to(&f);
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_EPROTO);
  cr_expect(strstr(fp4idx_client_last_error(c), "malformed") != NULL, "%s",
            fp4idx_client_last_error(c));
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, oversize_announcement_is_e2big) {
  fake_t f;
  fake_start(&f, FAKE_HUGE);
  fp4idx_client_t *c = connect_to(&f);
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_E2BIG);
  cr_expect(!fp4idx_client_connected(c));
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, daemon_error_keeps_the_connection) {
  fake_t f;
  fake_start(&f, FAKE_ERROR_THEN_OK);
  fp4idx_client_t *c = connect_to(&f);
  cr_expect_eq(fp4idx_client_drop(c, 42), FP4IDX_ENOSEQ);
  cr_expect_str_eq(fp4idx_client_last_error(c), "unknown sequence 42");
  cr_expect_eq(fp4idx_client_last_status(c), FP4IDX_ENOSEQ);
  cr_expect(fp4idx_client_connected(c));
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_OK, "%s",
               fp4idx_client_last_error(c));
  cr_expect_str_eq(fp4idx_client_last_error(c), "");
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, early_close_while_sending_reports_the_reply) {
  fake_t f;
  fake_start(&f, FAKE_EARLY_E2BIG);
  fp4idx_client_t *c = connect_to(&f);
  cr_assert_eq(fp4idx_client_set_timeout(c, 5000), FP4IDX_OK);
  size_t n = 40000; /* ~10 MB of bf16 keys: far more than socket buffers */
  uint16_t *keys = calloc(n * 128, 2);
  int st = fp4idx_client_append_bf16(c, 1, keys, n, FP4IDX_ROUNDING_RNE, NULL,
                                     NULL);
  cr_expect_eq(st, FP4IDX_E2BIG, "got %s: %s", fp4idx_status_name(st),
               fp4idx_client_last_error(c));
  cr_expect(strstr(fp4idx_client_last_error(c), "max-frame") != NULL, "%s",
            fp4idx_client_last_error(c));
  cr_expect(!fp4idx_client_connected(c));
  free(keys);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, absent_daemon_is_econn) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_expect_eq(fp4idx_client_connect(c, "/tmp/fp4idx-no-such-dir/x.sock"),
               FP4IDX_ECONN);
  cr_expect(strstr(fp4idx_client_last_error(c), "x.sock") != NULL, "%s",
            fp4idx_client_last_error(c));
  cr_expect(!fp4idx_client_connected(c));
  /* A socket file nobody listens on: refused. */
  char path[64];
  snprintf(path, sizeof path, "/tmp/fp4idx-dead-%d.sock", getpid());
  unlink(path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strcpy(a.sun_path, path);
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  close(fd);
  cr_expect_eq(fp4idx_client_connect(c, path), FP4IDX_ECONN);
  unlink(path);
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_ECONN);
  fp4idx_client_close(c);
}

Test(conn, arguments) {
  cr_expect_eq(fp4idx_client_connect(NULL, "/x"), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_set_timeout(NULL, 1), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_drop(NULL, 1), FP4IDX_EINVAL);
  cr_expect_not_null(fp4idx_client_last_error(NULL));
  fp4idx_client_close(NULL);
  fp4idx_client_free(NULL);

  fp4idx_client_t *c = fp4idx_client_new();
  cr_expect_eq(fp4idx_client_set_timeout(c, -1), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_set_busy_poll(NULL, 1), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_set_busy_poll(c, -2), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_set_busy_poll(c, FP4IDX_CLIENT_BUSY_POLL_AUTO), FP4IDX_OK);
  cr_expect_eq(fp4idx_client_set_busy_poll(c, 1000001), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_set_busy_poll(c, 50), FP4IDX_OK);
  char longp[300];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  cr_expect_eq(fp4idx_client_connect(c, longp), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_connect(c, ""), FP4IDX_EINVAL);
  uint16_t k[128] = {0};
  cr_expect_eq(fp4idx_client_append_bf16(c, 1, k, 0, FP4IDX_ROUNDING_RNE,
                                         NULL, NULL),
               FP4IDX_EINVAL);
  cr_expect(strstr(fp4idx_client_last_error(c), "n is 0") != NULL);
  cr_expect_eq(fp4idx_client_append(c, 1, (fp4idx_client_keys_t)9, k, 1,
                                    FP4IDX_ROUNDING_RNE, NULL, NULL),
               FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_info(c, NULL), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_score(c, 32, 0, NULL, 0, NULL), FP4IDX_EINVAL);
  fp4idx_client_result_t *res = (void *)1;
  fp4idx_client_seq_t s = {.seq = 1, .rows = 1, .q = k, .w = k};
  cr_expect_eq(fp4idx_client_score(c, 0, 0, &s, 1, &res), FP4IDX_EINVAL);
  cr_expect_null(res);
  cr_expect_eq(fp4idx_client_score(c, 129, 0, &s, 1, &res), FP4IDX_EINVAL);
  int32_t pos[1];
  float lg[1];
  cr_expect_eq(fp4idx_client_topk(c, 1, 1, 1, k, k, NULL, 0, pos, lg, NULL),
               FP4IDX_EINVAL);
  /* Valid arguments but no connection. */
  cr_expect_eq(fp4idx_client_drop(c, 1), FP4IDX_ECONN);
  void *keys = (void *)1;
  size_t n = 5;
  cr_expect_eq(fp4idx_client_read(c, 1, 0, UINT64_MAX, 0, &keys, &n),
               FP4IDX_ECONN);
  cr_expect_null(keys);
  cr_expect_eq(n, 0);
  fp4idx_client_close(c);
}

Test(conn, default_socket_path) {
  char buf[256];
  setenv("FP4IDX_SOCKET", "/tmp/override.sock", 1);
  cr_expect_eq(fp4idx_client_default_socket(buf, sizeof buf), FP4IDX_OK);
  cr_expect_str_eq(buf, "/tmp/override.sock");
  unsetenv("FP4IDX_SOCKET");
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  cr_expect_eq(fp4idx_client_default_socket(buf, sizeof buf), FP4IDX_OK);
  if (geteuid() == 0)
    cr_expect_str_eq(buf, "/run/fp4idx/fp4idxd.sock");
  else
    cr_expect_str_eq(buf, "/run/user/4242/fp4idx/fp4idxd.sock");
  cr_expect_eq(fp4idx_client_default_socket(buf, 5), FP4IDX_E2BIG);
  cr_expect_eq(fp4idx_client_default_socket(NULL, 5), FP4IDX_EINVAL);
  /* NULL path connects to the default: FP4IDX_SOCKET pointing at a fake. */
  fake_t f;
  fake_start(&f, FAKE_SLOW_OK);
  setenv("FP4IDX_SOCKET", f.path, 1);
  fp4idx_client_t *c = fp4idx_client_new();
  cr_expect_eq(fp4idx_client_connect(c, NULL), FP4IDX_OK, "%s",
               fp4idx_client_last_error(c));
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_OK);
  unsetenv("FP4IDX_SOCKET");
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, version_string) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", FP4IDX_CLIENT_VERSION_MAJOR,
           FP4IDX_CLIENT_VERSION_MINOR, FP4IDX_CLIENT_VERSION_PATCH);
  cr_expect_str_eq(fp4idx_client_version(), want);
}

/* ---- EINTR: signals without SA_RESTART keep interrupting poll/recv ---------- */

static volatile sig_atomic_t hits_;
static void on_usr1(int sig) {
  (void)sig;
  hits_++;
}

typedef struct {
  pthread_t target;
  volatile int stop;
} pester_t;

static void *pester(void *arg) {
  pester_t *p = arg;
  while (!p->stop) {
    pthread_kill(p->target, SIGUSR1);
    usleep(100);
  }
  return NULL;
}

static void pester_start(pester_t *p, pthread_t *th) {
  struct sigaction sa = {.sa_handler = on_usr1}; /* no SA_RESTART */
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
  hits_ = 0;
  p->target = pthread_self();
  p->stop = 0;
  cr_assert_eq(pthread_create(th, NULL, pester, p), 0);
}

static void pester_stop(pester_t *p, pthread_t th) {
  p->stop = 1;
  pthread_join(th, NULL);
  signal(SIGUSR1, SIG_IGN);
}

Test(conn, eintr_during_a_slow_reply) {
  fake_t f;
  fake_start(&f, FAKE_SLOW_OK);
  fp4idx_client_t *c = connect_to(&f);
  pester_t p;
  pthread_t th;
  pester_start(&p, &th);
  fp4idx_client_info_t in;
  int st = fp4idx_client_info(c, &in);
  pester_stop(&p, th);
  cr_expect_eq(st, FP4IDX_OK, "%s", fp4idx_client_last_error(c));
  cr_expect_str_eq(in.server, "fake 9.9.9");
  cr_expect(hits_ > 10, "only %d signals arrived", (int)hits_);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, eintr_does_not_extend_the_timeout) {
  fake_t f;
  fake_start(&f, FAKE_SILENT);
  fp4idx_client_t *c = connect_to(&f);
  fp4idx_client_set_timeout(c, 250);
  pester_t p;
  pthread_t th;
  pester_start(&p, &th);
  double t0 = now_ms();
  int st = fp4idx_client_drop(c, 1);
  double dt = now_ms() - t0;
  pester_stop(&p, th);
  cr_expect_eq(st, FP4IDX_ETIMEDOUT, "%s", fp4idx_status_name(st));
  cr_expect(dt >= 200 && dt < 3000, "timed out after %.0f ms", dt);
  cr_expect(hits_ > 10, "only %d signals arrived", (int)hits_);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, default_socket_without_runtime_dir) {
  char buf[256];
  unsetenv("FP4IDX_SOCKET");
  unsetenv("XDG_RUNTIME_DIR");
  cr_expect_eq(fp4idx_client_default_socket(buf, sizeof buf), FP4IDX_OK);
  cr_expect_str_eq(buf, "/run/fp4idx/fp4idxd.sock");
  setenv("FP4IDX_SOCKET", "", 1); /* empty: ignored */
  cr_expect_eq(fp4idx_client_default_socket(buf, sizeof buf), FP4IDX_OK);
  cr_expect_str_eq(buf, "/run/fp4idx/fp4idxd.sock");
}

/* ---- score responses received straight into the caller's buffer -------- */

static uint16_t sc_q[SC_ROWS * 4 * 128], sc_w[SC_ROWS * 4];

Test(conn, score_into_in_pieces_and_any_key_order) {
  fake_t f;
  fake_start(&f, FAKE_SCORE_PIECES);
  fp4idx_client_t *c = connect_to(&f);
  size_t n = (size_t)SC_ROWS * SC_WIDTH;
  float *out = malloc(n * 4);
  for (int odd = 0; odd < 2; odd++) {
    memset(out, 0xff, n * 4);
    uint32_t width = 0;
    cr_assert_eq(fp4idx_client_score_into(c, 5, 4, SC_ROWS, sc_q, sc_w, NULL, out, n, &width),
                 FP4IDX_OK, "reply %d: %s", odd, fp4idx_client_last_error(c));
    cr_expect_eq(width, SC_WIDTH);
    for (size_t i = 0; i < n; i++)
      if (out[i] != (float)i / 2) cr_assert_fail("reply %d: logits[%zu] = %g", odd, i, out[i]);
  }
  cr_expect(fp4idx_client_connected(c));
  free(out);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, score_into_cut_mid_payload_is_econn) {
  fake_t f;
  fake_start(&f, FAKE_SCORE_TRUNC);
  fp4idx_client_t *c = connect_to(&f);
  size_t n = (size_t)SC_ROWS * SC_WIDTH;
  float *out = malloc(n * 4);
  uint32_t width = 0;
  cr_expect_eq(fp4idx_client_score_into(c, 5, 4, SC_ROWS, sc_q, sc_w, NULL, out, n, &width),
               FP4IDX_ECONN, "%s", fp4idx_client_last_error(c));
  cr_expect(!fp4idx_client_connected(c));
  free(out);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, score_into_wrong_rows_is_eproto_and_touches_nothing) {
  fake_t f;
  fake_start(&f, FAKE_SCORE_BAD_SHAPE);
  fp4idx_client_t *c = connect_to(&f);
  size_t n = (size_t)(SC_ROWS + 1) * SC_WIDTH;
  float *out = malloc(n * 4);
  memset(out, 0, n * 4);
  uint32_t width = 0;
  cr_expect_eq(fp4idx_client_score_into(c, 5, 4, SC_ROWS, sc_q, sc_w, NULL, out, n, &width),
               FP4IDX_EPROTO, "%s", fp4idx_client_last_error(c));
  cr_expect(!fp4idx_client_connected(c));
  for (size_t i = 0; i < n; i++)
    if (out[i] != 0) cr_assert_fail("logits[%zu] written on a rejected shape", i);
  free(out);
  fp4idx_client_close(c);
  fake_stop(&f);
}

Test(conn, score_into_small_buffer_is_e2big_and_keeps_the_stream) {
  fake_t f;
  fake_start(&f, FAKE_SCORE_THEN_INFO);
  fp4idx_client_t *c = connect_to(&f);
  float out[16];
  memset(out, 0, sizeof out);
  uint32_t width = 0;
  cr_expect_eq(fp4idx_client_score_into(c, 5, 4, SC_ROWS, sc_q, sc_w, NULL, out, 16, &width),
               FP4IDX_E2BIG, "%s", fp4idx_client_last_error(c));
  cr_expect_eq(width, SC_WIDTH, "width is still reported");
  for (int i = 0; i < 16; i++) cr_expect_eq(out[i], 0.0f);
  cr_assert(fp4idx_client_connected(c));
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_OK, "next reply in step: %s",
               fp4idx_client_last_error(c));
  cr_expect_str_eq(in.server, "fake 9.9.9");
  fp4idx_client_close(c);
  fake_stop(&f);
}

/* The automatic busy poll's window (spin.h): a fixed setting is the window
 * itself; automatic follows the recent waits within [50, 500] us and falls
 * back to the least where waits are long (clients queued behind others). */
Test(conn, spin_window_follows_recent_waits) {
  const int A = FP4IDX_CLIENT_BUSY_POLL_AUTO, lo = FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US,
            hi = FP4IDX__CLIENT_SPIN_AUTO_MAX_US;
  cr_expect_eq(fp4idx__client_spin_window(0, 90), 0, "0: sleep at once");
  cr_expect_eq(fp4idx__client_spin_window(1000, 5000), 1000, "a fixed window ignores the waits");
  cr_expect_eq(fp4idx__client_spin_window(A, 0), lo, "nothing learned: the least window");
  cr_expect_eq(fp4idx__client_spin_window(A, 10), lo, "short waits: the least window");
  cr_expect_eq(fp4idx__client_spin_window(A, 90), 90 + 45 + 20, "1.5 x the wait + 20 us");
  cr_expect_eq(fp4idx__client_spin_window(A, 400), hi, "capped");
  cr_expect_eq(fp4idx__client_spin_window(A, hi), hi);
  cr_expect_eq(fp4idx__client_spin_window(A, hi + 1), lo, "long waits: the least window");
  cr_expect_eq(fp4idx__client_spin_window(A, 100000), lo);

  /* learning: the longest wait holds, shrinking by an eighth a call */
  int64_t r = 0;
  r = fp4idx__client_spin_learn(r, 96);
  cr_expect_eq(r, 96);
  r = fp4idx__client_spin_learn(r, 8); /* an info between two scores */
  cr_expect_eq(r, 84, "96 less an eighth, not the info's 8");
  cr_expect_geq(fp4idx__client_spin_window(A, r), 96, "the next score still within the window");
  r = fp4idx__client_spin_learn(r, 200);
  cr_expect_eq(r, 200, "a longer wait takes over at once");
  for (int i = 0; i < 40; i++) r = fp4idx__client_spin_learn(r, 10);
  cr_expect_lt(r, 20, "a run of short waits brings it down: %lld", (long long)r);
  cr_expect_geq(r, 10);
  cr_expect_eq(fp4idx__client_spin_learn(-5, -7), 0, "never below zero");
}
