/* generate.h - `kvd generate`: offline, in-process generation.
 *
 *   kvd generate --model FILE --prompt TEXT [--max-tokens N]
 *                [--temperature T] [--top-k K] [--top-p P] [--seed S]
 *                [--threads N] [--page-tokens N] [--kv-dtype f32|f16]
 *                [--json] [--cache-dir DIR]
 *
 * Loads the model and its tokenizer, builds a host KV pool just big
 * enough for the request, and runs the same engine the daemon runs (same
 * pages, same integrity checks), with no network. Text streams to stdout
 * as tokens arrive (never splitting a UTF-8 character); with --json one
 * object {"prompt_ids":[..],"output_ids":[..],"text":"..",
 * "finish_reason":"stop|length"} is printed at the end instead.
 * --cache-dir DIR (absolute) keeps the fingerprint and the repacked
 * weights in DIR as the daemon's model.fingerprint_cache does
 * (gpu/model/prepack.h), so a later run maps them instead of repacking.
 *
 * --max-tokens, --temperature, --top-k, --top-p and --seed are read as a
 * node reads those fields of a client request (proto_client_request_set,
 * the bounds of net/PROTOCOL.md s. 1: max-tokens 1..1048576, temperature
 * [0, 100], top-k 0..2^32-1, top-p (0, 1], seed decimal 0..2^64-1), so a
 * run here takes exactly what a node takes; a bad value of any option is
 * a usage error naming it: "kvd generate: --top-p '1.5': not a number in
 * (0, 1]".
 *
 * argv[0] is the command name ("generate"). Returns the process exit
 * code: 0 ok, 1 generation failed, 64 usage error, 66 model unusable.
 * Diagnostics go to stderr (this is a command, not a module).
 */
#pragma once

int kvd_cmd_generate(int argc, char **argv);
