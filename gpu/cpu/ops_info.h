/* ops_info.h - which kernel variant a kernel table runs for a weight type.
 *
 * A table (ops_cpu.h) is named for its widest instruction set, but not
 * every weight type has a kernel of that width: the "avx512" table runs
 * AVX-512 dots for some K-quant types and the AVX2 ones for the rest. This
 * answers per type by looking at which table the dot functions actually
 * comes from, so it stays true when a kernel is added or moved. Used by
 * `kvd generate --json` (timings.kernels) and the benchmarks.
 */
#pragma once

#include "gpu/gguf/gguf.h"

struct ops_kernels;

/* "scalar", "avx2", "avx512", ... for weight type t under table k; "none"
 * for a type the matmul does not support. */
const char *ops_kernel_variant(const struct ops_kernels *k, enum ggml_type t);
