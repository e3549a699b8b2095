/* server.h -- the Unix socket: listening, connections, framing, ordering.
 *
 * The request path on the connection's I/O loop, in a straight line:
 *   fp4idx__server_read_cb -> fp4idx__server_parse (the codec's incremental
 *   frame reader, state on the connection; "need more bytes" is a normal
 *   return; bodies are read straight into their buffer) -> the body decoded
 *   once (req->dreq) -> fp4idx__worker_submit (batch.h on the worker
 *   thread, over what is queued back to back: neighbouring scores share a
 *   launch; hello/info/stats from an otherwise idle connection are answered
 *   right here instead) -> fp4idx__server_req_done(req) ->
 *   fp4idx__server_flush (writes every finished response at the head of the
 *   connection's list, the frame bytes and the result tensors in one
 *   writev, so responses leave in request order).
 *
 * File descriptors: connections are libuv pipes in ipc mode, so the
 * SCM_RIGHTS fds of a "register" request are received with its bytes
 * (recvmsg inside libuv) and taken with uv_accept; each is handed to the
 * request of the frame it came with (the command layer closes it).
 *
 * Caps: a frame longer than max_frame gets an E2BIG reply and the connection
 * closes after it; a connection with FP4IDX_SERVER_MAX_PENDING requests
 * received and not answered, or holding its per-connection cap of buffered
 * bytes, is not read from until it drains (a slow reader only slows itself).
 * A parsed request goes to the worker only while its connection has fewer
 * than FP4IDX_SERVER_MAX_INFLIGHT on it (one: the worker is one thread, so
 * pipelining gains only the hand-off; and a client that does not read then
 * has at most one reply coming that it will not read).
 * Above all connections sits the global buffer budget (budget.c).
 *
 * I/O loops (ioloop.c, --io-threads N): connections are spread over N
 * event loops, loop 0 the daemon's main loop and loops 1..N-1 each on its
 * own thread. The listener accepts on loop 0 and hands each connection to
 * the next loop in turn (its fd, through that loop's queue and wake-up);
 * from then on everything of the connection -- reads, framing, decoding,
 * dispatch, replies, the direct write's arming, close -- happens on its
 * loop, and the worker sends each finished request back to that loop
 * (job.home). What all loops share is atomic or behind a lock: the buffer
 * budget's counters and its pressure (budget.c; a loop that changes them
 * walks its own connections and posts the others a message), the
 * connection count, stats and stages (their own locks). Loop 0 alone owns
 * the listeners, signals, stop and close_all, which reach the other loops
 * as messages (FP4IDX_IO_*).
 */
#ifndef FP4IDX_DAEMON_SERVER_H
#define FP4IDX_DAEMON_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "busypoll.h"
#include "commands.h"
#include "fp4idx_codec.h"
#include "regions.h"
#include "stages.h"
#include "worker.h"

#define FP4IDX_SERVER_MAX_LISTENERS 4
#define FP4IDX_SERVER_MAX_CONNS 1024
#define FP4IDX_SERVER_MAX_PENDING 32
#define FP4IDX_SERVER_MAX_INFLIGHT 1
#define FP4IDX_SERVER_MAX_OUT_BYTES ((size_t)64 << 20)
#define FP4IDX_SERVER_SCRATCH 65536
/* A whole frame of at least this many body bytes that ends a read into the
 * scratch buffer becomes its request's body in place: the request takes the
 * buffer (shrunk to the frame's end) and the connection a fresh one, so the
 * frame is not copied (a 64-key score's 33 kB frame, say). Smaller frames
 * are copied: cheaper than a new buffer. */
#define FP4IDX_SERVER_ADOPT_MIN 16384
/* What one request costs beside its body and its reply: its own struct and
 * the allocator's header. Counted against the buffer budget while it lives,
 * so that many small pipelined requests cannot hold more than the budget
 * says (32 of them on each of 1000 connections are 12 MB). */
#define FP4IDX_SERVER_REQ_BYTES (sizeof(fp4idx_req_t) + 16)
#define FP4IDX_SERVER_MAX_FDS 4 /* fds received and not yet given to a frame */
/* fds kept free below RLIMIT_NOFILE besides the connections (listener.c) */
#define FP4IDX_LISTENER_RESERVE_FDS 32
#define FP4IDX_SERVER_SOCKET_MODE 0660
#define FP4IDX_SERVER_MAX_IO 64  /* most I/O loops (--io-threads) */

typedef struct fp4idx_server_s fp4idx_server_t;
typedef struct fp4idx_conn_s fp4idx_conn_t;

/* Messages to an I/O loop (fp4idx__server_io_post): what it does, for its
 * own connections, when it wakes. */
enum {
  FP4IDX_IO_RESUME = 1u << 0,    /* the budget's pressure lifted: resume every connection */
  FP4IDX_IO_RETRY = 1u << 1,     /* bytes were released: waiting replies try again */
  FP4IDX_IO_GRANT = 1u << 2,     /* the frame grant is free: partial frames may take it */
  FP4IDX_IO_STREAMS = 1u << 3,   /* parts of replies written in parts came back */
  FP4IDX_IO_STOP = 1u << 4,      /* stop reading; close each connection once drained */
  FP4IDX_IO_CLOSE_ALL = 1u << 5, /* close every connection now (dropping replies) */
  FP4IDX_IO_CHECK = 1u << 6,     /* (loop 0) a connection of a stopping loop closed */
  FP4IDX_IO_QUIT = 1u << 7       /* close the loop's handles: its thread ends */
};

/* One event loop serving a share of the connections (see above). */
typedef struct fp4idx_ioloop_s {
  fp4idx_server_t *srv;
  int index;                   /* 0: the daemon's main loop */
  uv_loop_t *loop;             /* &own, or the main loop for loop 0 */
  uv_loop_t own;
  pthread_t thread;
  int thread_on;               /* the thread runs (loops 1..) */
  int loop_ok, wake_ok;        /* own initialised; wake initialised (not yet closed) */
  uv_async_t wake;             /* messages, handed connections, finished requests */
  fp4idx_jobq_t done;          /* its connections' requests back from the worker */
  pthread_mutex_t mu;          /* guards flags and fds */
  unsigned flags;              /* FP4IDX_IO_* posted and not yet handled */
  int *fds;                    /* connections handed over, not yet opened */
  size_t nfds, capfds;
  fp4idx_conn_t *conns;        /* its connections (its thread only) */
  int stopping;                /* its thread only */
  uint64_t streaming;          /* replies being written in parts (atomic: loop 0 reads) */
  fp4idx_busypoll_t busypoll;  /* its thread only */
  uv_timer_t reaper;           /* closes its connections past the timeout (budget.c) */
  int reaper_on;
} fp4idx_ioloop_t;

/* One request frame and, once done, its response frame. */
typedef struct fp4idx_req_s {
  fp4idx_job_t job;         /* job.data = this request */
  fp4idx_conn_t *conn;
  uint8_t *body;            /* the frame body (msgpack map), in body_mem */
  size_t body_len;
  void *body_mem;           /* the allocation body points into, owned (free()) */
  size_t body_held;         /* its bytes, as the budget counts them */
  int fd;                   /* fd that came with the frame (SCM_RIGHTS), or -1 */
  fp4idx_request_t dreq;    /* the body decoded, once, on the loop (views into body) */
  fp4idx_cmd_call_t call;   /* what the command layer works on: call.req = &dreq */
  char *dmsg;               /* why the decode failed, or NULL (owned) */
  uint8_t *resp;            /* the response frame, 4-byte length first ... */
  size_t resp_len;
  fp4idx_payload_t *payloads; /* ... with these spliced in (writev), owned */
  size_t npayloads;
  size_t wire_len;          /* resp_len + payload bytes */
  void *out;                /* memory the payloads point into, freed by out_free */
  void (*out_free)(void *arg, void *p);
  void *out_free_arg;
  uint64_t reserved;        /* admitted reply bytes reserved (budget.c) */
  uint64_t defer_bytes;     /* its reply's bound, when it was not admitted */
  uint64_t admitting;       /* dispatched again after a wait: counted in srv->admitting */
  int deferred;             /* not admitted: goes back to its connection */
  size_t direct_sent;       /* wire bytes the worker sent itself (direct_write.h) */
  int direct_failed;        /* its send failed: the peer is gone */
  double direct_us;         /* the send's time */
  int dispatched;           /* handed to srv->submit */
  int done;                 /* resp is set */
  int close_after;          /* close the connection once resp is written */
  int write_started;
  /* a reply written while its payload still comes back from the device
   * (score.h, FP4IDX_SCORE_STREAM_MIN): in parts, each as far as the bytes
   * are there */
  int streaming;            /* 1 from its first part until it is all written */
  size_t sent;              /* wire bytes handed to uv_write so far */
  int parts;                /* part writes in flight */
  int part_status;          /* the first failed part's status, or 0 */
  double t_first_us;        /* first byte of the frame (fp4idx__stats_now_us clock) */
  double t0_us;             /* whole frame received */
  double t_done_us;         /* response built (worker thread) */
  double t_write_us;        /* response handed to uv_write */
  uv_write_t wr;
  struct fp4idx_req_s *next;
} fp4idx_req_t;

struct fp4idx_conn_s {
  uv_pipe_t pipe;
  fp4idx_server_t *srv;
  fp4idx_ioloop_t *io;         /* the loop that owns it */
  fp4idx_conn_t *prev, *next;  /* its loop's list */
  uint64_t id;                 /* for logs */
  fp4idx_frame_reader_t fr;     /* framing state (the codec's reader) */
  int in_frame;                /* bytes of a frame not yet dispatched were read */
  double t_frame_us;           /* when the first of them arrived */
  uint8_t *scratch;            /* [FP4IDX_SERVER_SCRATCH] */
  size_t in_off, in_len;       /* unparsed bytes left in scratch (paused at a cap) */
  /* Stream positions, for matching received fds to frames: rx_pos bytes
   * read so far, scratch_pos the position of scratch[0]. An fd belongs to
   * the frame holding the last byte of the read that brought it (the kernel
   * ends a read after the segment carrying fds, and that segment starts the
   * sendmsg of the frame). */
  uint64_t rx_pos, scratch_pos;
  int fds[FP4IDX_SERVER_MAX_FDS];
  uint64_t fd_pos[FP4IDX_SERVER_MAX_FDS];
  int nfds;
  fp4idx_regions_t *regions;   /* worker thread only; freed by a worker job */
  /* requests in arrival order; head is the next response to write */
  fp4idx_req_t *head, *tail;
  fp4idx_req_t *undispatched;  /* first request not yet submitted, or NULL */
  size_t pending;              /* requests in the list */
  size_t inflight;             /* submitted, not done */
  int bulk;                    /* the worker lane of the requests in flight */
  size_t out_bytes;            /* response bytes handed to uv_write, unsent */
  /* buffered bytes counted against the budget (budget.c) */
  size_t held_in;              /* partial frame + bodies not yet run */
  size_t held_out;             /* replies done and not yet written out */
  size_t fr_held;              /* the partial frame's share of held_in */
  uint64_t defer_bytes;        /* its next request's reply waits for this much */
  double progress_us;          /* last write completed (or first reply queued) */
  int reading;                 /* uv_read_start active */
  int eof;                     /* peer finished sending (or bad frame) */
  int closing;                 /* uv_close called */
  int closed;                  /* close_cb ran: only in-worker requests remain */
  int dead;                    /* write failed: drop responses */
  int direct;                  /* direct_write.h state (atomic: loop and worker) */
  int direct_fd;               /* the pipe's fd while armed */
};

struct fp4idx_server_s {
  uv_loop_t *loop;             /* the main loop (loop 0's) */
  uint64_t max_frame;
  uv_pipe_t listeners[FP4IDX_SERVER_MAX_LISTENERS];
  int n_listeners;
  int listeners_open;          /* not yet closed */
  char path[108];              /* socket file we bound (unlinked at stop) */
  fp4idx_ioloop_t *io;         /* [n_io], fp4idx__server_io_init */
  int n_io;
  unsigned next_io;            /* the loop the next connection goes to (loop 0) */
  int polling;                 /* loops busy polling now (atomic; the worker's hold_spin) */
  uint64_t n_conns;            /* open, and handed to a loop (atomic) */
  uint64_t next_conn_id;       /* atomic */
  int stopping;                /* loop 0 writes; atomic where others read */
  /* the socket file (listener.c): set after init, before listening */
  int socket_mode;             /* default FP4IDX_SERVER_SOCKET_MODE */
  long socket_gid;             /* -1: the daemon's group */
  /* fd budget and refusals (listener.c, loop 0) */
  int fds_planned;
  uint64_t base_fds;           /* open when listening started */
  int spare_fd;                /* released to drain the backlog at EMFILE */
  double refused_log_us;       /* last refusal line (0: none yet) */
  uint64_t refused_unlogged;   /* refusals since that line */
  uv_pipe_t reject_pipe;       /* refuses a connection without malloc */
  int reject_busy;
  /* the buffer budget (budget.c): set after init, before listening; the
   * counters are atomic (every loop and the worker use them), the pressure
   * changes under budget_mu */
  uint64_t budget;             /* bytes; 0 = FP4IDX_BUDGET_MIN */
  double buffer_timeout_us;    /* close a full, unread connection after this */
  pthread_mutex_t budget_mu;
  uint64_t held;               /* bytes held over all connections */
  uint64_t held_out;           /* the replies' share of held */
  uint64_t held_peak;          /* the most held has been */
  uint64_t reserved;           /* admitted replies being built */
  uint64_t n_deferred;         /* connections whose next reply waits to fit */
  uint64_t admitting;          /* their bounds, dispatched and not yet back */
  uint64_t deferred;           /* replies made to wait, since the start */
  int over_budget;             /* held reached budget (until below 7/8) */
  fp4idx_conn_t *grant;        /* may finish its frame while over budget */
  uint64_t slow_closed;        /* connections closed by the timeout */
  /* Set by the daemon. worker: where requests run (batch.h, with data as
   * the daemon). conn_event: +1 / -1 on open / close (any loop). */
  fp4idx_worker_t *worker;
  void (*conn_event)(fp4idx_server_t *srv, int delta);
  /* pressure: 1 when the buffer budget is reached, 0 when it lifts (and at
   * stop); the daemon holds the worker's bulk lane meanwhile. Any loop,
   * under budget_mu. May be NULL. */
  void (*pressure)(fp4idx_server_t *srv, int on);
  void (*on_stopped)(fp4idx_server_t *srv); /* all closed after stop (loop 0) */
  fp4idx_stages_t *stages;     /* where wake and write times go; may be NULL */
  void *data;                  /* the daemon's */
  fp4idx_buffered_t *buffered; /* where the budget's figures are published; may be NULL */
  int cuda_device;             /* regions: the CUDA backend's device, or -1 */
};

/* Initializes an idle server on `loop` (no listener yet). */
void fp4idx__server_init(fp4idx_server_t *srv, uv_loop_t *loop, uint64_t max_frame);

/* I/O loops (ioloop.c). Creates n (1..FP4IDX_SERVER_MAX_IO) loops, loop 0
 * on srv->loop, each with its busy polling (spin_us, busy: busypoll.h);
 * their threads start with fp4idx__server_io_start. FP4IDX_OK,
 * FP4IDX_EINVAL, FP4IDX_ENOMEM, FP4IDX_EINTERNAL (a libuv call failed). */
int fp4idx__server_io_init(fp4idx_server_t *srv, int n, int spin_us, const uint64_t *busy);
/* Starts the threads of loops 1..n-1. FP4IDX_OK or FP4IDX_EINTERNAL. */
int fp4idx__server_io_start(fp4idx_server_t *srv);
/* Loop 0, once every connection is closed: closes each loop's handles and
 * joins its thread. */
void fp4idx__server_io_quit(fp4idx_server_t *srv);
/* Frees the loops (after quit, or after a start that failed). */
void fp4idx__server_io_fini(fp4idx_server_t *srv);

/* Closes every handle of `loop` not closing yet and runs the loop until
 * their close callbacks ran (before uv_loop_close). */
void fp4idx__server_loop_close_all(uv_loop_t *loop);
/* Any thread: posts `flags` (FP4IDX_IO_*) to io and wakes it. */
void fp4idx__server_io_post(fp4idx_ioloop_t *io, unsigned flags);
/* Loop 0: hands the accepted connection fd to io (which owns it from here). */
void fp4idx__server_io_handoff(fp4idx_ioloop_t *io, int fd);
/* io's thread: what it was posted, and the connections handed to it. */
void fp4idx__server_io_msg(fp4idx_ioloop_t *io, unsigned flags);
void fp4idx__server_conn_open(fp4idx_ioloop_t *io, int fd);
/* io's thread: one connection (opened, or handed to io) is gone from the
 * count; the last one lets loop 0 see whether a stop is complete. */
void fp4idx__server_conn_gone(fp4idx_ioloop_t *io);

/* Binds and listens on `path` (listener.c): creates the parent folder if
 * missing (0700, or 0755 as root), refuses with FP4IDX_EEXIST when another
 * daemon answers on it, removes a stale socket file; the file gets exactly
 * srv->socket_mode and, when srv->socket_gid >= 0, that group. FP4IDX_EIO
 * (bind/chown/chmod/listen failed; a log line says why), FP4IDX_E2BIG (path
 * too long), FP4IDX_EINVAL. */
int fp4idx__server_listen_path(fp4idx_server_t *srv, const char *path);

/* Whether `path` is free to listen on: FP4IDX_OK when nothing is there or a
 * stale socket file was (it is removed), FP4IDX_EEXIST (logged) when a
 * daemon answers there or the path holds something that is not a socket.
 * fp4idx__server_listen_path checks again; main calls this before the pool
 * is allocated, so a refused start costs no device memory. */
int fp4idx__server_check_path(const char *path);

/* Listens on an already bound (e.g. systemd-activated) socket fd (its mode
 * is the unit's SocketMode=). The fd is owned by the server afterwards.
 * FP4IDX_EIO, FP4IDX_E2BIG (too many). */
int fp4idx__server_listen_fd(fp4idx_server_t *srv, int fd);

/* The connection cap now: FP4IDX_SERVER_MAX_CONNS, or less when the current
 * RLIMIT_NOFILE leaves less room (listener.c). */
uint64_t fp4idx__listener_conn_cap(const fp4idx_server_t *srv);

/* Re-checks whether c may be read and its parsed requests dispatched (the
 * budget calls it when pressure lifts). */
void fp4idx__server_resume(fp4idx_conn_t *c);

/* Closes c now, dropping unsent replies (the budget's timeout). */
void fp4idx__server_drop(fp4idx_conn_t *c);

/* Loop 0: writes what has come of every reply being written in parts (its
 * own connections; the other loops are posted FP4IDX_IO_STREAMS). */
void fp4idx__server_flush_streams(fp4idx_server_t *srv);

/* Accepts the pending connection of listener l as a new connection of the
 * next I/O loop in turn and starts reading it there (listener.c calls it
 * below the caps; loop 0). FP4IDX_OK, or FP4IDX_ENOMEM with nothing
 * accepted. */
int fp4idx__server_conn_accept(fp4idx_server_t *srv, uv_stream_t *l);
/* Stops accepting (closes the listeners, unlinks the socket file), stops
 * reading, lets every connection finish its in-flight requests and flush,
 * then closes it; srv->on_stopped runs once everything is closed. */
void fp4idx__server_stop(fp4idx_server_t *srv);

/* Closes every connection now, dropping responses not yet written (a
 * second SIGTERM: do not wait for clients that do not read). Requests on the
 * worker still run; their connections are freed when they come back. */
void fp4idx__server_close_all(fp4idx_server_t *srv);

/* What of r's wire bytes (frame with payloads spliced in) can be written
 * now: wire_len, less while its payload still comes back from the device,
 * -1 when that failed. Any thread. */
int64_t fp4idx__server_wire_ready(const fp4idx_req_t *r);

/* uv bufs for wire bytes [from, to) of r into bufs (room for 2 * npayloads
 * + 1); returns how many. Any thread. */
size_t fp4idx__server_wire_bufs(const fp4idx_req_t *r, size_t from, size_t to, uv_buf_t *bufs);

/* The response of `req` is set (req->resp, resp_len, payloads, wire_len,
 * close_after): the connection's loop. */
void fp4idx__server_req_done(fp4idx_req_t *req);

/* Frees a request and its buffers (used by the daemon on paths that never
 * queue it). */
void fp4idx__server_req_free(fp4idx_req_t *req);

#endif /* FP4IDX_DAEMON_SERVER_H */
