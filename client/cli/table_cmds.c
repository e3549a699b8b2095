/* table_cmds.c -- the commands fp4idx-cli takes from the op table: every op
 * whose fields are all integers (fp4idx_client_ops(), generated from
 * protocol/optable.py) is a command that takes its request fields as
 * operands, in order, and prints its response fields, one "FIELD VALUE"
 * line each ("ok" for an op without any). An op the CLI has a command of
 * its own for (truncate, fork, drop) keeps that command. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

const fp4idx_client_op_t *fp4idx__cli_table_op(const char *name) {
  size_t n = 0;
  const fp4idx_client_op_t *ops = fp4idx_client_ops(&n);
  for (size_t i = 0; i < n; i++)
    if (strcmp(ops[i].name, name) == 0) return &ops[i];
  return NULL;
}

const char *fp4idx__cli_table_operands(const fp4idx_client_op_t *op, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < op->nrequest && at + 1 < cap; i++) {
    int w = snprintf(buf + at, cap - at, "%s%s", i ? " " : "", op->request[i]);
    if (w < 0) break;
    at += (size_t)w < cap - at ? (size_t)w : cap - at - 1;
  }
  for (char *p = buf; *p; p++)
    if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
  return buf;
}

int fp4idx__cli_table_call(fp4idx_cli_t *cli, const fp4idx_client_op_t *op, int argc,
                           char **argv) {
  char args[128];
  uint64_t in[16], out[16];
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    printf("usage: fp4idx-cli [-s SOCKET] %s %s\n"
           "Sends the protocol op \"%s\" (PROTOCOL.md) with these fields and prints\n"
           "each field of its response as FIELD VALUE.\n",
           op->name, fp4idx__cli_table_operands(op, args, sizeof args), op->name);
    return 0;
  }
  if (op->nrequest > 16 || op->nresponse > 16)
    return fp4idx__cli_fail(&cli->err, FP4IDX_EINVAL, "op %s has too many fields", op->name);
  if ((size_t)(argc - 1) != op->nrequest)
    return fp4idx__cli_usage(&cli->err, "expected %s", fp4idx__cli_table_operands(op, args, sizeof args));
  for (size_t i = 0; i < op->nrequest; i++)
    if (fp4idx__cli_parse_num(cli, op->request[i], argv[1 + i], &in[i])) return FP4IDX_EINVAL;
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  st = fp4idx_client_call_ints(c, op->name, in, op->nrequest, out, op->nresponse);
  if (st) {
    fp4idx__cli_fail(&cli->err, st, "%s", fp4idx_client_last_error(c));
  } else {
    for (size_t i = 0; i < op->nresponse; i++)
      printf("%s %llu\n", op->response[i], (unsigned long long)out[i]);
    if (op->nresponse == 0) puts("ok");
  }
  fp4idx_client_close(c);
  return st;
}
