/* main.c -- fp4idxd: the program (program.h). */
#include "program.h"

int main(int argc, char **argv) { return fp4idx__program_main(argc, argv); }
