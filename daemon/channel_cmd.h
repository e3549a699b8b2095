/* channel_cmd.h -- the command table's rows for the channel ops, included
 * by commands.c once fp4idx__cmd_t is defined: each hands its request to
 * channel.c, where the op lives. */
#ifndef FP4IDX_DAEMON_CHANNEL_CMD_H
#define FP4IDX_DAEMON_CHANNEL_CMD_H

#include "channel.h"

static int fp4idx__cmd_channel_open(fp4idx__cmd_t *c) {
  return fp4idx__channel_open(&c->d->channels, c->regions, c->fd, &c->req->u.channel_open,
                              &c->resp->u.channel_open, c->msg, FP4IDX_CMD_MSG);
}

static int fp4idx__cmd_channel_close(fp4idx__cmd_t *c) {
  return fp4idx__channel_close(c->regions, c->req->u.channel_close.channel, c->msg,
                               FP4IDX_CMD_MSG);
}

#endif /* FP4IDX_DAEMON_CHANNEL_CMD_H */
