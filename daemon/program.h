/* program.h -- fp4idxd as a program: arguments -> configuration -> the
 * daemon, its service module (systemd, persistence) and its scrape endpoint
 * -> run until stopped.
 *
 * main.c is this one call; a program that links the daemon's core with a
 * backend of its own (fp4idx__engine_set_backend, engine.h) calls it too
 * and so starts, answers and stops exactly as fp4idxd does.
 */
#ifndef FP4IDX_DAEMON_PROGRAM_H
#define FP4IDX_DAEMON_PROGRAM_H

/* Runs fp4idxd with argv (argv[0] the program's name) and returns its exit
 * code: 0 (stopped, or --help / --version), 1 (start failed), 2 (bad
 * command line). */
int fp4idx__program_main(int argc, char **argv);

#endif /* FP4IDX_DAEMON_PROGRAM_H */
