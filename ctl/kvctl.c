/* kvctl.c - the admin command. */
#include <stdio.h>

int main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "usage: kvctl COMMAND\n");
	return 2;
}
