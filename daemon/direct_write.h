/* direct_write.h -- a reply written by the thread that built it.
 *
 * A request whose connection has nothing unwritten ahead of it when it goes
 * to the worker is "armed": while it runs, nothing else of that connection
 * can be written (replies leave in order and it is the first), so the
 * worker, once the reply is built and its bytes are all there, sends it
 * itself with one non-blocking sendmsg instead of handing it to the loop
 * and waiting for the loop to wake. The loop still does the bookkeeping
 * when the request comes back (fp4idx__server_req_done): a reply sent whole
 * is done; the bytes a short send left are written by the loop as usual.
 *
 * The connection's fd stays open while the worker may use it: the loop's
 * close disarms first and waits out a send in progress (a non-blocking
 * sendmsg, microseconds). States of c->direct: IDLE, ARMED (loop, at
 * dispatch), WRITING (worker, sole owner of the fd's write side), DONE
 * (worker; req->direct_sent says how much went). */
#ifndef FP4IDX_DAEMON_DIRECT_WRITE_H
#define FP4IDX_DAEMON_DIRECT_WRITE_H

#include "server.h"

enum { FP4IDX_DIRECT_IDLE = 0, FP4IDX_DIRECT_ARMED, FP4IDX_DIRECT_WRITING, FP4IDX_DIRECT_DONE };

/* Loop, as request r of c goes to the worker: arms c when r is the first
 * reply c has unwritten. */
void fp4idx__direct_arm(fp4idx_conn_t *c, fp4idx_req_t *r);

/* Worker, once r's reply is set: sends it when c is armed and the reply's
 * bytes are all there. Records what went in r->direct_sent (0: nothing,
 * the loop writes it all), r->direct_failed (the send failed: the peer is
 * gone) and r->direct_us (the send's time). */
void fp4idx__direct_try(fp4idx_req_t *r);

/* Loop: disarms c, waiting for a send in progress to end. Returns the
 * state it found (DONE: r->direct_* of the request in flight are set). */
int fp4idx__direct_disarm(fp4idx_conn_t *c);

#endif /* FP4IDX_DAEMON_DIRECT_WRITE_H */
