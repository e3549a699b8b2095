/* test_client_regions.c -- host regions (PROTOCOL.md "Regions") against the
 * real fp4idxd on the CPU backend: results through a region equal the
 * socket path byte for byte (append, full logits, top-k, inputs read from a
 * region), the malformed-region matrix (each violation a clear error that
 * changes nothing), and the security cases: a region is invisible to other
 * connections, a client that lies about the size, sends an unsealed or
 * unsealable fd, closes its fd, unmaps its side or tries to shrink the memfd
 * cannot make the daemon leave the region or crash, and a closed connection
 * releases its regions (the daemon's own mappings disappear). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_check.h"
#include "daemon_harness.h"
#include "fp4idx_client.h"
#include "test_util.h"

static fp4idx_test_daemon_t daemon_;

static void start(void) {
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, NULL), 0, "fp4idxd did not start");
}

static void stop(void) {
  if (daemon_.pid) fp4idx_test_daemon_stop(&daemon_);
}

TestSuite(regions, .init = start, .fini = stop);

static fp4idx_client_t *open_client(void) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_assert_eq(fp4idx_client_set_timeout(c, 60000), FP4IDX_OK);
  cr_assert_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_OK, "%s",
               fp4idx_client_last_error(c));
  return c;
}

/* n random bf16 keys of small dyadic values (exact through the quantizer). */
static uint16_t *make_keys(size_t n, uint64_t seed) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  uint16_t *k = malloc(n * 128 * sizeof *k);
  cr_assert_not_null(k);
  for (size_t i = 0; i < n * 128; i++)
    k[i] = fp4idx_test_f64_to_bf16((double)fp4idx_test_rng_range(&rng, -12, 12) / 4.0);
  return k;
}

static uint16_t *make_bf16(size_t n, uint64_t seed, int lo, int hi) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  uint16_t *v = malloc(n * sizeof *v);
  cr_assert_not_null(v);
  for (size_t i = 0; i < n; i++)
    v[i] = fp4idx_test_f64_to_bf16((double)fp4idx_test_rng_range(&rng, lo, hi) / 8.0);
  return v;
}

/* ---- results through a region == the socket path, byte for byte --------- */

/* The top-k results at mem's offsets (positions po, logits vo, counts co)
 * equal pos, val [rows,k] and cnt [rows] byte for byte. */
static void assert_topk_at(const uint8_t *mem, size_t po, size_t vo, size_t co,
                           const int32_t *pos, const float *val, const int32_t *cnt,
                           size_t rows, size_t k) {
  cr_assert_eq(memcmp(mem + po, pos, rows * k * 4), 0, "positions in the region differ");
  cr_assert_eq(memcmp(mem + vo, val, rows * k * 4), 0, "logits in the region differ");
  cr_assert_eq(memcmp(mem + co, cnt, rows * 4), 0, "counts in the region differ");
}

Test(regions, append_score_topk_equal_the_socket_path) {
  enum { N = 3000, R = 4, H = 8, K = 64 };
  fp4idx_client_t *c = open_client();
  uint16_t *keys = make_keys(N, 1);
  uint16_t *q = make_bf16((size_t)R * H * 128, 2, -8, 8);
  uint16_t *w = make_bf16((size_t)R * H, 3, 0, 8);
  int32_t lens[R] = {N, N - 1, 17, N / 2};
  uint32_t W = N;
  size_t kbytes = (size_t)N * 128 * 2, lbytes = (size_t)R * W * 4;
  size_t size = kbytes + lbytes + (size_t)R * K * 8 + R * 4;
  uint64_t region = 0;
  void *base = NULL;
  CHECK(c, fp4idx_client_region_create(c, size, &region, &base));
  cr_assert_gt(region, 0);
  uint8_t *mem = base;
  memcpy(mem, keys, kbytes);

  uint64_t first = 9, length = 0;
  CHECK(c, fp4idx_client_append_region(c, 1, FP4IDX_KEYS_BF16, region, 0, N,
                                       FP4IDX_ROUNDING_RNE, &first, &length));
  cr_assert_eq(first, 0);
  cr_assert_eq(length, N);
  CHECK(c, fp4idx_client_append_bf16(c, 2, keys, N, FP4IDX_ROUNDING_RNE, NULL, NULL));
  void *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  CHECK(c, fp4idx_client_read(c, 1, 0, UINT64_MAX, 0, &a, &na));
  CHECK(c, fp4idx_client_read(c, 2, 0, UINT64_MAX, 0, &b, &nb));
  cr_assert_eq(na, N);
  cr_assert_eq(nb, N);
  cr_assert_eq(memcmp(a, b, (size_t)N * 68), 0, "region append stored other bytes");
  fp4idx_client_free(a);
  fp4idx_client_free(b);

  /* full logits */
  float *ref = malloc(lbytes);
  uint32_t width = 0;
  CHECK(c, fp4idx_client_score_into(c, 1, H, R, q, w, lens, ref, (size_t)R * W, &width));
  cr_assert_eq(width, W);
  memset(mem + kbytes, 0xAB, lbytes);
  CHECK(c, fp4idx_client_score_region(c, 1, H, R, q, w, lens, W, region, kbytes));
  cr_assert_eq(memcmp(mem + kbytes, ref, lbytes), 0, "logits in the region differ");

  /* top-k */
  int32_t pos[R * K], cnt[R];
  float val[R * K];
  CHECK(c, fp4idx_client_topk(c, 1, H, R, q, w, lens, K, pos, val, cnt));
  size_t po = kbytes + lbytes, vo = po + sizeof pos, co = vo + sizeof val;
  CHECK(c, fp4idx_client_topk_region(c, 1, H, R, q, w, lens, K, region, po, vo, co));
  assert_topk_at(mem, po, vo, co, pos, val, cnt, R, K);

  CHECK(c, fp4idx_client_region_destroy(c, region, base, size));
  free(ref);
  free(keys);
  free(q);
  free(w);
  fp4idx_client_close(c);
}

/* fp4idx_client_score_regions: q, w, lens and every output in a region
 * (nothing but the header on the socket) give the socket path's bytes; a
 * refused call leaves the outputs as they were. */
Test(regions, every_tensor_in_regions_equals_the_socket_path) {
  enum { N = 2000, R = 4, H = 16, K = 100 };
  fp4idx_client_t *c = open_client();
  uint16_t *keys = make_keys(N, 11);
  uint16_t *q = make_bf16((size_t)R * H * 128, 12, -8, 8);
  uint16_t *w = make_bf16((size_t)R * H, 13, 0, 8);
  int32_t lens[R] = {N, 5, N - 3, N / 3};
  CHECK(c, fp4idx_client_append_bf16(c, 7, keys, N, FP4IDX_ROUNDING_RNE, NULL, NULL));
  const size_t qb = (size_t)R * H * 256, wb = (size_t)R * H * 2, lb = (size_t)R * N * 4;
  const size_t oq = 0, ow = qb, ol = ow + wb, olog = ol + 64, opos = olog + lb,
               oval = opos + (size_t)R * K * 4, ocnt = oval + (size_t)R * K * 4,
               size = ocnt + R * 4;
  uint64_t region = 0;
  void *base = NULL;
  CHECK(c, fp4idx_client_region_create(c, size, &region, &base));
  uint8_t *mem = base;
  memcpy(mem + oq, q, qb);
  memcpy(mem + ow, w, wb);
  memcpy(mem + ol, lens, sizeof lens);

  float *ref = malloc(lb);
  uint32_t width = 0;
  CHECK(c, fp4idx_client_score_into(c, 7, H, R, q, w, lens, ref, (size_t)R * N, &width));
  cr_assert_eq(width, N);
  fp4idx_client_region_score_t call = {
      .seq = 7, .heads = H, .rows = R, .width = N,
      .q = {region, oq}, .w = {region, ow}, .lens = {region, ol},
      .logits = {region, olog}};
  memset(mem + olog, 0xAB, lb);
  CHECK(c, fp4idx_client_score_regions(c, &call));
  cr_assert_eq(memcmp(mem + olog, ref, lb), 0, "logits from region inputs differ");

  int32_t pos[R * K], cnt[R];
  float val[R * K];
  CHECK(c, fp4idx_client_topk(c, 7, H, R, q, w, lens, K, pos, val, cnt));
  call.topk = K;
  call.width = 0;
  call.logits = (fp4idx_client_ref_t){region, oval};
  call.positions = (fp4idx_client_ref_t){region, opos};
  call.counts = (fp4idx_client_ref_t){region, ocnt};
  memset(mem + opos, 0xCD, size - opos);
  CHECK(c, fp4idx_client_score_regions(c, &call));
  assert_topk_at(mem, opos, oval, ocnt, pos, val, cnt, R, K);

  /* refused: the outputs keep their bytes */
  uint8_t *keep = malloc(size - opos);
  memset(mem + opos, 0x5A, size - opos);
  memcpy(keep, mem + opos, size - opos);
  const uint16_t nan_bf16 = 0x7FC0;
  memcpy(mem + ow + 6, &nan_bf16, 2);
  cr_assert_eq(fp4idx_client_score_regions(c, &call), FP4IDX_ENONFINITE, "%s",
               fp4idx_client_last_error(c));
  memcpy(mem + ow, w, wb);
  const int32_t too_long = N + 1;
  memcpy(mem + ol + 8, &too_long, 4);
  cr_assert_eq(fp4idx_client_score_regions(c, &call), FP4IDX_ERANGE, "%s",
               fp4idx_client_last_error(c));
  memcpy(mem + ol, lens, sizeof lens);
  call.q.region = region + 100;
  cr_assert_eq(fp4idx_client_score_regions(c, &call), FP4IDX_ENOREGION);
  call.q.region = region;
  call.w.offset = 1; /* misaligned bf16 */
  cr_assert_eq(fp4idx_client_score_regions(c, &call), FP4IDX_EREGION);
  call.w.offset = ow;
  cr_assert_eq(memcmp(mem + opos, keep, size - opos), 0, "a refused call wrote outputs");

  /* arguments: checked before anything is sent, the connection kept */
  cr_assert_eq(fp4idx_client_score_regions(c, NULL), FP4IDX_EINVAL);
  call.counts.region = 0;
  cr_assert_eq(fp4idx_client_score_regions(c, &call), FP4IDX_EINVAL);
  call.counts.region = region;
  call.lens.region = 0; /* no lens: every row sees the N keys */
  CHECK(c, fp4idx_client_score_regions(c, &call));
  CHECK(c, fp4idx_client_topk(c, 7, H, R, q, w, NULL, K, pos, val, cnt));
  assert_topk_at(mem, opos, oval, ocnt, pos, val, cnt, R, K);

  CHECK(c, fp4idx_client_region_destroy(c, region, base, size));
  free(keep);
  free(ref);
  free(keys);
  free(q);
  free(w);
  fp4idx_client_close(c);
}

/* ---- raw connections: the codec, with the fd passed by hand ------------- */

/* A memfd of `size` bytes, sealed with `seals` (0: none). */
static int make_memfd(size_t size, int seals) {
  int fd = memfd_create("fp4idx-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)size), 0);
  if (seals) cr_assert_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
  return fd;
}

/* Encodes req and sends it in one sendmsg with `fd` (-1: none) as
 * SCM_RIGHTS. */
static void send_with_fd(int sock, const fp4idx_request_t *req, int fd) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_request(&sb, req), 0);
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = sb.data, .iov_len = sb.size};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  cr_assert_eq(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t)sb.size);
  msgpack_sbuffer_destroy(&sb);
}

/* Sends a register request (id `id`) for a host region of `size` bytes
 * with `fd` (-1: none) in the same sendmsg. */
static void raw_send_register(int sock, uint64_t id, int fd, uint64_t size) {
  fp4idx_request_t req = {.id = id, .op = FP4IDX_OP_REGISTER};
  req.u.register_ = (fp4idx_register_req_t){.kind = FP4IDX_REGION_HOST, .size = size};
  send_with_fd(sock, &req, fd);
}

/* Receives a register reply: its status, *id the region. */
static int raw_recv_register(int sock, uint64_t *id) {
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(sock, FP4IDX_OP_REGISTER, &resp, &body), 0);
  int st = resp.status;
  if (st == 0 && id) *id = resp.u.register_.region;
  if (st != 0) cr_log_info("register: %s", resp.error);
  fp4idx_response_clear(&resp);
  free(body);
  return st;
}

static int raw_register(int sock, int fd, uint64_t size, uint64_t *id) {
  raw_send_register(sock, 77, fd, size);
  return raw_recv_register(sock, id);
}

static int raw_call(int sock, const fp4idx_request_t *req, fp4idx_response_t *resp,
                    unsigned char **body) {
  int rc = fp4idx_test_call(sock, req, resp, body);
  cr_assert_eq(rc, 0, "transport: %d", rc);
  if (resp->status) cr_log_info("%s: %s", fp4idx_op_name(req->op), resp->error);
  return resp->status;
}

/* The status of a request, its response thrown away. */
static int raw_status(int sock, const fp4idx_request_t *req) {
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  int st = raw_call(sock, req, &resp, &body);
  fp4idx_response_clear(&resp);
  free(body);
  return st;
}

/* One score entry, q and w inline, over sequence seq. */
typedef struct {
  fp4idx_score_seq_t s;
  fp4idx_request_t req;
} score_t;

static void score_init(score_t *x, uint64_t seq, uint32_t rows, uint32_t heads,
                       const uint16_t *q, const uint16_t *w, uint32_t topk) {
  memset(x, 0, sizeof *x);
  uint64_t qs[3] = {rows, heads, 128}, ws[2] = {rows, heads};
  x->s.seq = seq;
  x->s.rows = rows;
  cr_assert_eq(fp4idx_tensor_init(&x->s.q, FP4IDX_WIRE_BF16, 3, qs, q), 0);
  cr_assert_eq(fp4idx_tensor_init(&x->s.w, FP4IDX_WIRE_BF16, 2, ws, w), 0);
  x->req = (fp4idx_request_t){.id = 5, .op = FP4IDX_OP_SCORE};
  x->req.u.score.heads = heads;
  x->req.u.score.topk = topk;
  x->req.u.score.seqs = &x->s;
  x->req.u.score.nseqs = 1;
}

static void ref2(fp4idx_tensor_t *t, fp4idx_wire_dtype_t dt, uint64_t a, uint64_t b,
                 uint64_t region, uint64_t off) {
  uint64_t s[2] = {a, b};
  cr_assert_eq(fp4idx_tensor_ref(t, dt, b ? 2 : 1, s, region, off), 0);
}

static int append_ref(int sock, uint64_t seq, uint64_t n, uint64_t region, uint64_t off) {
  fp4idx_request_t req = {.id = 3, .op = FP4IDX_OP_APPEND};
  req.u.append.seq = seq;
  ref2(&req.u.append.keys, FP4IDX_WIRE_BF16, n, 128, region, off);
  return raw_status(sock, &req);
}

/* Lines of the daemon's /proc maps naming our memfds: its own mappings. */
static int daemon_mappings(void) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)daemon_.pid);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "memfd:fp4idx-test")) n++;
  fclose(f);
  return n;
}

/* fds the daemon holds open on our memfds (it keeps none: mappings only). */
static int daemon_memfds(void) {
  char dir[64], path[320], target[256];
  snprintf(dir, sizeof dir, "/proc/%d/fd", (int)daemon_.pid);
  int n = 0;
  for (int fd = 0; fd < 1024; fd++) {
    snprintf(path, sizeof path, "%s/%d", dir, fd);
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = 0;
    if (strstr(target, "memfd:fp4idx-test")) n++;
  }
  return n;
}

Test(regions, inputs_from_a_region_equal_the_socket_path) {
  enum { N = 500, R = 2, H = 4 };
  int sock = fp4idx_test_connect(daemon_.sock);
  cr_assert_geq(sock, 0);
  uint16_t *keys = make_keys(N, 7);
  uint16_t *q = make_bf16(R * H * 128, 8, -8, 8), *w = make_bf16(R * H, 9, 0, 8);
  cr_assert_eq(fp4idx_test_append(sock, 3, FP4IDX_WIRE_BF16, N, keys, NULL, NULL), 0);
  size_t size = 1 << 20;
  int mfd = make_memfd(size, F_SEAL_SHRINK);
  uint8_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  cr_assert_neq(mem, MAP_FAILED);
  uint64_t id = 0;
  cr_assert_eq(raw_register(sock, mfd, size, &id), 0);
  close(mfd);
  int32_t lens[R] = {N, 100};
  memcpy(mem, q, sizeof(uint16_t) * R * H * 128);
  memcpy(mem + 8192, w, sizeof(uint16_t) * R * H);
  memcpy(mem + 12288, lens, sizeof lens);

  float *ref = NULL;
  uint64_t width = 0;
  cr_assert_eq(fp4idx_test_score(sock, 3, H, R, q, w, lens, &ref, &width), 0);
  score_t x;
  score_init(&x, 3, R, H, q, w, 0);
  uint64_t qs[3] = {R, H, 128};
  cr_assert_eq(fp4idx_tensor_ref(&x.s.q, FP4IDX_WIRE_BF16, 3, qs, id, 0), 0);
  ref2(&x.s.w, FP4IDX_WIRE_BF16, R, H, id, 8192);
  ref2(&x.s.lens, FP4IDX_WIRE_I32, R, 0, id, 12288);
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(raw_call(sock, &x.req, &resp, &body), 0);
  const fp4idx_tensor_t *l = &resp.u.score.results[0].logits;
  cr_assert_eq(l->region, 0, "inline logits expected without out");
  cr_assert_eq(l->nbytes, (size_t)R * width * 4);
  cr_assert_eq(memcmp(l->data, ref, l->nbytes), 0, "inputs from a region scored differently");
  fp4idx_response_clear(&resp);
  free(body);

  /* and the reply of a region output names the region */
  ref2(&x.s.out_logits, FP4IDX_WIRE_F32, R, width, id, 16384);
  cr_assert_eq(raw_call(sock, &x.req, &resp, &body), 0);
  cr_assert_eq(resp.u.score.results[0].logits.region, id);
  cr_assert_eq(resp.u.score.results[0].logits.offset, 16384);
  cr_assert_eq(memcmp(mem + 16384, ref, (size_t)R * width * 4), 0);
  fp4idx_response_clear(&resp);
  free(body);
  munmap(mem, size);
  free(ref);
  free(keys);
  free(q);
  free(w);
  close(sock);
}

/* ---- the malformed-region matrix ------------------------------------------ */

Test(regions, register_refusals) {
  int sock = fp4idx_test_connect(daemon_.sock);
  cr_assert_geq(sock, 0);
  uint64_t id = 0;
  /* no fd */
  cr_assert_eq(raw_register(sock, -1, 4096, &id), FP4IDX_EREGION);
  /* unsealed memfd: could shrink under the mapping */
  int fd = make_memfd(4096, 0);
  cr_assert_eq(raw_register(sock, fd, 4096, &id), FP4IDX_EREGION);
  close(fd);
  /* a file that cannot be sealed (tmpfs file, like a POSIX shm object) */
  char path[] = "/tmp/fp4idx-region-XXXXXX";
  fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  cr_assert_eq(ftruncate(fd, 4096), 0);
  cr_assert_eq(raw_register(sock, fd, 4096, &id), FP4IDX_EREGION);
  close(fd);
  /* a socket is no memfd */
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  cr_assert_eq(raw_register(sock, sv[0], 4096, &id), FP4IDX_EREGION);
  close(sv[0]);
  close(sv[1]);
  /* a size larger than the memfd (the client lies) */
  fd = make_memfd(4096, F_SEAL_SHRINK);
  cr_assert_eq(raw_register(sock, fd, 8192, &id), FP4IDX_EREGION);
  /* sealed against writes: the daemon cannot map it read-write */
  int wfd = make_memfd(4096, F_SEAL_SHRINK | F_SEAL_WRITE);
  cr_assert_eq(raw_register(sock, wfd, 4096, &id), FP4IDX_EREGION);
  close(wfd);
  /* the same memfd with an honest size works */
  cr_assert_eq(raw_register(sock, fd, 4096, &id), 0);
  close(fd);
  /* kind cuda on the CPU backend; a host register naming a handle */
  unsigned char handle[64] = {0};
  fp4idx_request_t req = {.id = 1, .op = FP4IDX_OP_REGISTER};
  req.u.register_ = (fp4idx_register_req_t){.kind = FP4IDX_REGION_CUDA, .size = 4096,
                                            .handle = handle, .handle_len = 64, .device = 0};
  cr_assert_eq(raw_status(sock, &req), FP4IDX_EREGION);
  /* unregister twice, then an id never given */
  fp4idx_request_t un = {.id = 2, .op = FP4IDX_OP_UNREGISTER};
  un.u.unregister.region = id;
  cr_assert_eq(raw_status(sock, &un), 0);
  cr_assert_eq(raw_status(sock, &un), FP4IDX_ENOREGION);
  un.u.unregister.region = 999;
  cr_assert_eq(raw_status(sock, &un), FP4IDX_ENOREGION);
  /* the connection is still fine, and no refused fd stayed open */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(sock, &info), 0);
  cr_assert_eq(daemon_memfds(), 0);
  close(sock);
}

Test(regions, caps_per_connection) {
  int sock = fp4idx_test_connect(daemon_.sock);
  cr_assert_geq(sock, 0);
  uint64_t id = 0;
  for (int i = 0; i < 16; i++) {
    int fd = make_memfd(4096, F_SEAL_SHRINK);
    cr_assert_eq(raw_register(sock, fd, 4096, &id), 0, "region %d", i);
    close(fd);
  }
  int fd = make_memfd(4096, F_SEAL_SHRINK);
  cr_assert_eq(raw_register(sock, fd, 4096, &id), FP4IDX_E2BIG);
  close(fd);
  /* a fresh connection has its own budget */
  int other = fp4idx_test_connect(daemon_.sock);
  fd = make_memfd(4096, F_SEAL_SHRINK);
  cr_assert_eq(raw_register(other, fd, 4096, &id), 0);
  cr_assert_eq(id, 1, "ids are per connection");
  close(fd);
  close(other);
  close(sock);
}

Test(regions, reference_refusals_change_nothing) {
  enum { R = 2, H = 4, N = 64 };
  int sock = fp4idx_test_connect(daemon_.sock);
  cr_assert_geq(sock, 0);
  uint16_t *keys = make_keys(N, 11);
  uint16_t *q = make_bf16(R * H * 128, 12, -8, 8), *w = make_bf16(R * H, 13, 0, 8);
  cr_assert_eq(fp4idx_test_append(sock, 5, FP4IDX_WIRE_BF16, N, keys, NULL, NULL), 0);
  size_t size = 65536;
  int mfd = make_memfd(size, F_SEAL_SHRINK);
  uint8_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  cr_assert_neq(mem, MAP_FAILED);
  memcpy(mem, keys, (size_t)N * 256);
  uint64_t id = 0;
  cr_assert_eq(raw_register(sock, mfd, size, &id), 0);
  close(mfd);

  /* append: unknown region, misaligned, past the end, offset overflow */
  cr_assert_eq(append_ref(sock, 50, N, id + 1, 0), FP4IDX_ENOREGION);
  cr_assert_eq(append_ref(sock, 50, N, id, 1), FP4IDX_EREGION);
  cr_assert_eq(append_ref(sock, 50, 257, id, 0), FP4IDX_EREGION);
  cr_assert_eq(append_ref(sock, 50, N, id, size - 2), FP4IDX_EREGION);
  cr_assert_eq(append_ref(sock, 50, 1, id, UINT64_MAX - 1), FP4IDX_EREGION);
  /* nothing was created by any of them */
  cr_assert_eq(fp4idx_test_drop(sock, 50), FP4IDX_ENOSEQ);
  /* the same keys at a right place do append, and equal the socket's */
  cr_assert_eq(append_ref(sock, 50, N, id, 0), 0);
  uint8_t a[N * 68], b[N * 68];
  uint64_t got = 0;
  cr_assert_eq(fp4idx_test_read(sock, 50, 0, N, a, &got), 0);
  cr_assert_eq(fp4idx_test_read(sock, 5, 0, N, b, &got), 0);
  cr_assert_eq(memcmp(a, b, sizeof a), 0);

  score_t x;
  /* out must be a reference, not inline data */
  score_init(&x, 5, R, H, q, w, 0);
  float junk[R * N];
  uint64_t js[2] = {R, N};
  cr_assert_eq(fp4idx_tensor_init(&x.s.out_logits, FP4IDX_WIRE_F32, 2, js, junk), 0);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_neq(fp4idx_encode_request(&sb, &x.req), 0, "the encoder refuses inline outputs");
  msgpack_sbuffer_destroy(&sb);
  /* out of the wrong shape (W is N), dtype, misaligned, past the end */
  memset(mem + 32768, 0x5A, 16384);
  ref2(&x.s.out_logits, FP4IDX_WIRE_F32, R, N - 1, id, 32768);
  cr_assert_eq(raw_status(sock, &x.req), FP4IDX_ESHAPE);
  ref2(&x.s.out_logits, FP4IDX_WIRE_I32, R, N, id, 32768);
  cr_assert_eq(raw_status(sock, &x.req), FP4IDX_ESHAPE);
  ref2(&x.s.out_logits, FP4IDX_WIRE_F32, R, N, id, 32770);
  cr_assert_eq(raw_status(sock, &x.req), FP4IDX_EREGION);
  ref2(&x.s.out_logits, FP4IDX_WIRE_F32, R, N, id, size - 16);
  cr_assert_eq(raw_status(sock, &x.req), FP4IDX_EREGION);
  /* an output over an input of the same request */
  uint64_t qs[3] = {R, H, 128};
  cr_assert_eq(fp4idx_tensor_ref(&x.s.q, FP4IDX_WIRE_BF16, 3, qs, id, 32768), 0);
  ref2(&x.s.out_logits, FP4IDX_WIRE_F32, R, N, id, 32768 + 256);
  cr_assert_eq(raw_status(sock, &x.req), FP4IDX_EREGION);
  /* nothing was written by any refusal */
  for (size_t i = 32768; i < 32768 + 16384; i++)
    cr_assert_eq(mem[i], 0x5A, "byte %zu of the region changed", i);
  /* top-k outputs on top of each other; one missing is refused by the encoder */
  score_init(&x, 5, R, H, q, w, 8);
  ref2(&x.s.out_positions, FP4IDX_WIRE_I32, R, 8, id, 49152);
  ref2(&x.s.out_logits, FP4IDX_WIRE_F32, R, 8, id, 49152 + 32);
  ref2(&x.s.out_counts, FP4IDX_WIRE_I32, R, 0, id, 49152 + 256);
  cr_assert_eq(raw_status(sock, &x.req), FP4IDX_EREGION);
  ref2(&x.s.out_logits, FP4IDX_WIRE_F32, R, 8, id, 49152 + 64);
  cr_assert_eq(raw_status(sock, &x.req), 0);
  memset(&x.s.out_counts, 0, sizeof x.s.out_counts);
  msgpack_sbuffer_init(&sb);
  cr_assert_neq(fp4idx_encode_request(&sb, &x.req), 0);
  msgpack_sbuffer_destroy(&sb);
  /* the connection is still fine */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(sock, &info), 0);
  munmap(mem, size);
  free(keys);
  free(q);
  free(w);
  close(sock);
}

/* ---- security -------------------------------------------------------------- */

Test(regions, invisible_to_other_connections) {
  int a = fp4idx_test_connect(daemon_.sock), b = fp4idx_test_connect(daemon_.sock);
  uint16_t *keys = make_keys(4, 21);
  int fd = make_memfd(4096, F_SEAL_SHRINK);
  cr_assert_eq(pwrite(fd, keys, 4 * 256, 0), 4 * 256);
  uint64_t id = 0;
  cr_assert_eq(raw_register(a, fd, 4096, &id), 0);
  close(fd);
  cr_assert_eq(append_ref(b, 60, 4, id, 0), FP4IDX_ENOREGION);
  fp4idx_request_t un = {.id = 2, .op = FP4IDX_OP_UNREGISTER};
  un.u.unregister.region = id;
  cr_assert_eq(raw_status(b, &un), FP4IDX_ENOREGION, "b cannot release a's region");
  cr_assert_eq(append_ref(a, 60, 4, id, 0), 0);
  free(keys);
  close(a);
  close(b);
}

Test(regions, closed_fd_unmapped_side_and_shrink_are_harmless) {
  enum { N = 256 };
  int sock = fp4idx_test_connect(daemon_.sock);
  uint16_t *keys = make_keys(N, 31);
  size_t size = (size_t)N * 256;
  int fd = make_memfd(size, F_SEAL_SHRINK);
  uint8_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert_neq(mem, MAP_FAILED);
  memcpy(mem, keys, size);
  uint64_t id = 0;
  cr_assert_eq(raw_register(sock, fd, size, &id), 0);
  /* the client unmaps its side and closes the fd: the daemon's mapping holds */
  munmap(mem, size);
  /* shrinking is refused by the seal, so the daemon can never SIGBUS */
  cr_assert_neq(ftruncate(fd, 0), 0);
  close(fd);
  cr_assert_eq(append_ref(sock, 70, N, id, 0), 0);
  uint8_t a[N * 68], b[N * 68];
  uint64_t got = 0;
  cr_assert_eq(fp4idx_test_append(sock, 71, FP4IDX_WIRE_BF16, N, keys, NULL, NULL), 0);
  cr_assert_eq(fp4idx_test_read(sock, 70, 0, N, a, &got), 0);
  cr_assert_eq(fp4idx_test_read(sock, 71, 0, N, b, &got), 0);
  cr_assert_eq(memcmp(a, b, sizeof a), 0, "the daemon's own mapping kept the keys");
  free(keys);
  close(sock);
  cr_assert(fp4idx_test_daemon_alive(&daemon_));
}

Test(regions, closing_the_connection_releases_its_regions) {
  int before = daemon_mappings();
  int sock = fp4idx_test_connect(daemon_.sock);
  uint64_t id = 0;
  for (int i = 0; i < 3; i++) {
    int fd = make_memfd(8192, F_SEAL_SHRINK);
    cr_assert_eq(raw_register(sock, fd, 8192, &id), 0);
    close(fd);
  }
  cr_assert_eq(daemon_mappings(), before + 3);
  /* each register is logged with the peer's SO_PEERCRED */
  char want[64];
  snprintf(want, sizeof want, "(pid %d uid %d gid %d): registered host region 3", (int)getpid(),
           (int)getuid(), (int)getgid());
  size_t n = 0;
  char *log = fp4idx_test_load_file(daemon_.log, &n);
  cr_assert_not_null(log);
  log = realloc(log, n + 1);
  log[n] = 0;
  cr_assert(strstr(log, want) != NULL, "the log lacks \"%s\"", want);
  free(log);
  close(sock);
  /* the release job runs on the worker after the close is seen */
  int now = -1;
  for (int i = 0; i < 200 && (now = daemon_mappings()) != before; i++) usleep(10000);
  cr_assert_eq(now, before, "the daemon still maps the regions of a closed connection");
}

Test(regions, an_fd_with_another_request_is_closed_and_ignored) {
  int sock = fp4idx_test_connect(daemon_.sock);
  int before = daemon_mappings();
  int fd = make_memfd(4096, F_SEAL_SHRINK);
  /* an info frame carrying an fd, then a register without one */
  fp4idx_request_t req = {.id = 1, .op = FP4IDX_OP_INFO};
  send_with_fd(sock, &req, fd);
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(sock, FP4IDX_OP_INFO, &resp, &body), 0);
  cr_assert_eq(resp.status, 0);
  fp4idx_response_clear(&resp);
  free(body);
  uint64_t id = 0;
  cr_assert_eq(raw_register(sock, -1, 4096, &id), FP4IDX_EREGION,
               "the info frame's fd must not serve a later register");
  cr_assert_eq(daemon_mappings(), before);
  cr_assert_eq(daemon_memfds(), 0, "the daemon kept the fd of the info frame open");
  close(fd);
  close(sock);
}

/* Pipelined registers (each its own sendmsg, no reply read in between) get
 * their own fds: the sizes tell them apart. */
Test(regions, pipelined_registers_each_get_their_fd) {
  int sock = fp4idx_test_connect(daemon_.sock);
  int fds[3] = {make_memfd(4096, F_SEAL_SHRINK), -1, make_memfd(3 * 4096, F_SEAL_SHRINK)};
  raw_send_register(sock, 1, fds[0], 4096);
  raw_send_register(sock, 2, -1, 4096);        /* no fd: refused */
  raw_send_register(sock, 3, fds[2], 3 * 4096); /* would fail with fds[0] (too short) */
  uint64_t id[3] = {0, 0, 0};
  cr_assert_eq(raw_recv_register(sock, &id[0]), 0);
  cr_assert_eq(raw_recv_register(sock, &id[1]), FP4IDX_EREGION);
  cr_assert_eq(raw_recv_register(sock, &id[2]), 0);
  cr_assert_eq(id[0], 1);
  cr_assert_eq(id[2], 2);
  /* region 2 is the 12 KiB one: a reference at 8 KiB fits only there */
  uint16_t *keys = make_keys(16, 41);
  cr_assert_eq(pwrite(fds[2], keys, 16 * 256, 8192), 16 * 256);
  cr_assert_eq(append_ref(sock, 80, 16, id[2], 8192), 0);
  cr_assert_eq(append_ref(sock, 81, 16, id[0], 8192), FP4IDX_EREGION);
  close(fds[0]);
  close(fds[2]);
  free(keys);
  close(sock);
}

/* A client that rewrites its lens while the daemon validates and uses them
 * (a time-of-check/time-of-use attack on the bounds): every reply is OK or
 * ERANGE, and the daemon survives. With lens read in place instead of
 * copied, this fails (the backend's own check answers EINVAL) in about half
 * of the runs under ASan, where the daemon is slower and the window wider. */
typedef struct {
  volatile int32_t *lens;
  atomic_int stop;
} flipper_t;

static void *flip_lens(void *arg) {
  flipper_t *f = arg;
  for (unsigned i = 0; !atomic_load(&f->stop); i++) {
    f->lens[0] = (i & 1) ? INT32_MAX : 64;
    f->lens[1] = (i & 1) ? 64 : INT32_MAX;
  }
  return NULL;
}

Test(regions, lens_rewritten_during_a_score_cannot_escape) {
  enum { R = 2, H = 4, N = 64 };
  int sock = fp4idx_test_connect(daemon_.sock);
  uint16_t *keys = make_keys(N, 51);
  uint16_t *q = make_bf16(R * H * 128, 52, -8, 8), *w = make_bf16(R * H, 53, 0, 8);
  cr_assert_eq(fp4idx_test_append(sock, 90, FP4IDX_WIRE_BF16, N, keys, NULL, NULL), 0);
  size_t size = 4096;
  int mfd = make_memfd(size, F_SEAL_SHRINK);
  uint8_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  cr_assert_neq(mem, MAP_FAILED);
  uint64_t id = 0;
  cr_assert_eq(raw_register(sock, mfd, size, &id), 0);
  close(mfd);
  flipper_t f = {.lens = (volatile int32_t *)mem};
  atomic_init(&f.stop, 0);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, flip_lens, &f), 0);
  score_t x;
  score_init(&x, 90, R, H, q, w, 0);
  ref2(&x.s.lens, FP4IDX_WIRE_I32, R, 0, id, 0);
  int ok = 0, range = 0;
  for (int i = 0; i < 300; i++) {
    int st = raw_status(sock, &x.req);
    cr_assert(st == 0 || st == FP4IDX_ERANGE, "status %d", st);
    ok += st == 0;
    range += st == FP4IDX_ERANGE;
  }
  atomic_store(&f.stop, 1);
  pthread_join(th, NULL);
  cr_log_info("lens flipped under 300 scores: %d OK, %d ERANGE", ok, range);
  cr_assert(fp4idx_test_daemon_alive(&daemon_));
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(sock, &info), 0);
  munmap(mem, size);
  free(keys);
  free(q);
  free(w);
  close(sock);
}

/* ---- a long full-logits reply (written in parts on a device backend) ---- */

/* Full logits of more than FP4IDX_SCORE_STREAM_MIN bytes through the socket
 * equal the same score into a host region (on the CUDA backend the socket
 * reply is written while its logits still come back from the device, in
 * parts; the region takes one copy), also back to back; and a client that
 * leaves in the middle of such a reply harms no one: the daemon answers the
 * next request, and the same score again gives the same bytes. */
Test(regions, a_long_logits_reply_equals_the_region_path) {
  enum { N = 70000, R = 4, H = 8 };
  fp4idx_client_t *c = open_client();
  const size_t kbytes = (size_t)N * 128 * 2, lbytes = (size_t)R * N * 4;
  cr_assert_gt(lbytes, (size_t)1 << 20);
  uint64_t region = 0;
  void *base = NULL;
  CHECK(c, fp4idx_client_region_create(c, kbytes > lbytes ? kbytes : lbytes, &region, &base));
  uint16_t *keys = make_keys(N, 41);
  memcpy(base, keys, kbytes);
  free(keys);
  CHECK(c, fp4idx_client_append_region(c, 7, FP4IDX_KEYS_BF16, region, 0, N,
                                       FP4IDX_ROUNDING_RNE, NULL, NULL));
  uint16_t *q = make_bf16((size_t)R * H * 128, 42, -8, 8);
  uint16_t *w = make_bf16((size_t)R * H, 43, 0, 8);
  int32_t lens[R] = {N, N - 5, 1000, N / 3};
  float *got = malloc(lbytes);
  cr_assert_not_null(got);
  for (int rep = 0; rep < 3; rep++) {
    memset(got, 0xCD, lbytes);
    uint32_t width = 0;
    CHECK(c, fp4idx_client_score_into(c, 7, H, R, q, w, lens, got, (size_t)R * N, &width));
    cr_assert_eq(width, (uint32_t)N);
    memset(base, 0xAB, lbytes);
    CHECK(c, fp4idx_client_score_region(c, 7, H, R, q, w, lens, N, region, 0));
    cr_assert_eq(memcmp(base, got, lbytes), 0, "round %d: socket logits differ from the region's",
                 rep);
  }
  /* a raw client asks for the same logits and leaves after 1,000 bytes */
  int fd = fp4idx_test_connect(daemon_.sock);
  cr_assert_geq(fd, 0);
  fp4idx_request_t req;
  fp4idx_score_seq_t s;
  cr_assert_eq(fp4idx_test_score_request(&req, &s, 77, 7, H, 0, R, q, w, lens), 0);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
  cr_assert_eq(fp4idx_test_send_all(fd, sb.data, sb.size), 0);
  msgpack_sbuffer_destroy(&sb);
  char some[1000];
  size_t have = 0;
  while (have < sizeof some) {
    ssize_t r = read(fd, some + have, sizeof some - have);
    cr_assert_gt(r, 0, "the reply stopped after %zu bytes", have);
    have += (size_t)r;
  }
  close(fd);
  /* everyone else goes on */
  fp4idx_client_t *c2 = open_client();
  fp4idx_client_info_t info;
  CHECK(c2, fp4idx_client_info(c2, &info));
  uint32_t width = 0;
  memset(got, 0xCD, lbytes);
  CHECK(c2, fp4idx_client_score_into(c2, 7, H, R, q, w, lens, got, (size_t)R * N, &width));
  cr_assert_eq(memcmp(base, got, lbytes), 0, "after a client left mid-reply: logits differ");
  fp4idx_client_close(c2);
  CHECK(c, fp4idx_client_region_destroy(c, region, base, kbytes > lbytes ? kbytes : lbytes));
  free(got);
  free(q);
  free(w);
  fp4idx_client_close(c);
}
