/* cmd_generate.h - `kvctl generate`, the client API's command-line client
 * (see ctl/cmd_generate.c for the options and output). argv[0] is the
 * command name. Returns the exit code: 0 ok, 1 typed error from the
 * server or out of memory, 2 usage (a bad value included), 69 server
 * unavailable. No global state.
 */
#pragma once

int kvctl_cmd_generate(int argc, char **argv);
