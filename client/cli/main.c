/* main.c -- fp4idx-cli: global options and command dispatch.
 *
 *   fp4idx-cli [-s SOCKET] [-t MS] COMMAND [ARGS...]
 *
 * Exit status: 0 success; 1 the operation failed (daemon error, connection,
 * I/O); 2 bad command line; 130 interrupted by SIGINT (143 SIGTERM). On
 * failure exactly one line goes to stderr:
 *   fp4idx-cli: <command>: <message> (<CODE>)
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const struct {
  const char *name;
  fp4idx_cli_cmd_fn fn;
  const char *what;
} cli_commands[] = {
    {"info", fp4idx__cli_info, "daemon version, backend, device and pool"},
    {"stats", fp4idx__cli_stats, "counters (--prometheus for node_exporter)"},
    {"append", fp4idx__cli_append, "append keys to a sequence"},
    {"score", fp4idx__cli_score, "score verify rows (full logits or top-k)"},
    {"truncate", fp4idx__cli_truncate, "keep the first N keys of a sequence"},
    {"drop", fp4idx__cli_drop, "drop a sequence"},
    {"fork", fp4idx__cli_fork, "start a sequence as another's prefix (shared)"},
    {"read", fp4idx__cli_read, "read keys back (packed or dequantized)"},
    {"list", fp4idx__cli_list, "list the sequences with their keys and pages"},
    {"save", fp4idx__cli_save, "make the daemon write its snapshot now"},
    {"export", fp4idx__cli_export, "write a sequence in SGLang's page layout"},
    {"import", fp4idx__cli_import, "append an exported (or SGLang) sequence"},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: fp4idx-cli [-s SOCKET] [-t MS] COMMAND [ARGS...]\n"
          "Talks to fp4idxd, the FP4 index-key cache daemon.\n\n"
          "  -s, --socket PATH   daemon socket (default: $FP4IDX_SOCKET, else\n"
          "                      $XDG_RUNTIME_DIR/fp4idx/fp4idxd.sock, or\n"
          "                      /run/fp4idx/fp4idxd.sock as root)\n"
          "  -t, --timeout MS    limit per request in milliseconds (default\n"
          "                      none)\n"
          "  -h, --help          this text (also: help); COMMAND --help or\n"
          "                      help COMMAND for a command\n"
          "  -V, --version       print the version\n\ncommands:\n");
  for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++)
    fprintf(f, "  %-9s %s\n", cli_commands[i].name, cli_commands[i].what);
  /* the ops of the op table without a command of their own */
  size_t nops = 0;
  const fp4idx_client_op_t *ops = fp4idx_client_ops(&nops);
  int any = 0;
  for (size_t k = 0; k < nops; k++) {
    int own = 0;
    for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++)
      own |= strcmp(cli_commands[i].name, ops[k].name) == 0;
    if (own) continue;
    char args[128];
    if (!any++) fprintf(f, "\nprotocol ops (operands: the request's fields; PROTOCOL.md):\n");
    fprintf(f, "  %s %s\n", ops[k].name, fp4idx__cli_table_operands(&ops[k], args, sizeof args));
  }
  fprintf(f,
          "\nExit status: 0 success, 1 failure, 2 bad command line, 130 Ctrl-C;\n"
          "errors are one line on stderr: 'fp4idx-cli: COMMAND: MESSAGE (CODE)'.\n");
}

static int report(const char *op, const fp4idx_cli_err_t *e) {
  if (e->signal) { /* interrupted: the message says what was done */
    fprintf(stderr, "fp4idx-cli: %s: %s (%s)\n", op, e->msg,
            e->signal == SIGINT ? "SIGINT" : "SIGTERM");
    return 128 + e->signal;
  }
  /* One line, always: flatten any newline a message may carry. */
  char msg[sizeof e->msg];
  snprintf(msg, sizeof msg, "%s", e->msg);
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
  fprintf(stderr, "fp4idx-cli: %s: %s (%s)\n", op, msg,
          fp4idx_status_name(e->status));
  return e->usage ? 2 : 1;
}

int main(int argc, char **argv) {
  static const struct option lo[] = {{"socket", required_argument, 0, 's'},
                                     {"timeout", required_argument, 0, 't'},
                                     {"help", no_argument, 0, 'h'},
                                     {"version", no_argument, 0, 'V'},
                                     {0}};
  fp4idx_cli_t cli = {0};
  int ch;
  opterr = 0;
  /* '+': stop at the command name; its options are its own. */
  while ((ch = getopt_long(argc, argv, "+s:t:hV", lo, NULL)) != -1) {
    switch (ch) {
      case 's': cli.socket = optarg; break;
      case 't': {
        uint64_t ms;
        if (fp4idx__parse_u64(optarg, &ms) != 0 || ms > 2000000000u) {
          fp4idx__cli_usage(&cli.err, "--timeout '%s': expected milliseconds",
                            optarg);
          return report("options", &cli.err);
        }
        cli.timeout_ms = (int)ms;
        break;
      }
      case 'h': usage(stdout); return 0;
      case 'V':
        printf("fp4idx-cli %s (libfp4idx-client %s)\n", FP4IDX_VERSION_STRING,
               fp4idx_client_version());
        return 0;
      default:
        fp4idx__cli_usage(&cli.err, "unknown option or missing value: %s",
                          argv[optind - 1]);
        return report("options", &cli.err);
    }
  }
  if (optind >= argc) {
    fp4idx__cli_usage(&cli.err, "no command given (try --help)");
    return report("options", &cli.err);
  }
  const char *name = argv[optind];
  /* `help` and `help COMMAND`: the same texts as --help. */
  if (strcmp(name, "help") == 0) {
    if (optind + 1 >= argc) {
      usage(stdout);
      return 0;
    }
    name = argv[optind + 1];
    for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++) {
      if (strcmp(name, cli_commands[i].name) != 0) continue;
      char *help_argv[] = {(char *)cli_commands[i].name, (char *)"--help", NULL};
      optind = 0;
      return cli_commands[i].fn(&cli, 2, help_argv) == 0 ? 0 : report(name, &cli.err);
    }
    const fp4idx_client_op_t *op = fp4idx__cli_table_op(name);
    if (op) {
      char *help_argv[] = {(char *)op->name, (char *)"--help", NULL};
      return fp4idx__cli_table_call(&cli, op, 2, help_argv);
    }
    fp4idx__cli_usage(&cli.err, "unknown command '%s' (try help)", name);
    return report("help", &cli.err);
  }
  for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++) {
    if (strcmp(name, cli_commands[i].name) != 0) continue;
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    optind = 0; /* glibc: 0 fully re-initialises getopt for the command */
    int st = cli_commands[i].fn(&cli, sub_argc, sub_argv);
    if (st == 0) return 0;
    if (cli.err.msg[0] == '\0')
      fp4idx__cli_fail(&cli.err, st, "%s", fp4idx_strerror(st));
    return report(name, &cli.err);
  }
  /* An op of the op table without a command of its own. */
  const fp4idx_client_op_t *op = fp4idx__cli_table_op(name);
  if (op) {
    int st = fp4idx__cli_table_call(&cli, op, argc - optind, argv + optind);
    if (st == 0) return 0;
    if (cli.err.msg[0] == '\0') fp4idx__cli_fail(&cli.err, st, "%s", fp4idx_strerror(st));
    return report(name, &cli.err);
  }
  fp4idx__cli_usage(&cli.err, "unknown command '%s' (try --help)", name);
  return report("options", &cli.err);
}
