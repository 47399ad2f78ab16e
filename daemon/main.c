/* main.c - kvd: parse arguments, build one daemon, run it. */
#include <stdio.h>

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "kvd: not yet\n");
	return 64;
}
