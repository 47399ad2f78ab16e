/* cmd_model.h - `kvctl model make|inspect`: generate and examine GGUF models.
 *
 *   kvctl model make OUT.gguf [--layers N] [--dim N] [--heads N]
 *       [--kv-heads N] [--ff N] [--vocab N] [--ctx N]
 *       [--dtype f32|f16|q8_0] [--seed S] [--tied] [--tokenizer llama|gpt2]
 *   kvctl model inspect FILE [--memory BYTES] [--kv-dtype f32|f16] [--json]
 *
 * argv[0] is "model" (the dispatcher passes its argv from the command
 * word on). Output goes to stdout, diagnostics to stderr. Returns the
 * process exit status: 0 ok, 1 bad or unreadable file (the typed GGUF
 * error and its byte offset are printed), 2 usage error.
 * No global state; safe to call more than once in one process.
 */
#pragma once

int kvctl_cmd_model(int argc, char **argv);
/* `kvctl model tokenize|detokenize` (cmd_tokenize.c); argv[1] names which. */
int kvctl_cmd_model_tok(int argc, char **argv);
