/* y = x W^T in bfloat16 on Intel AMX tiles, for the few rows of a decode step.
 *
 * oneDNN (what torch's bfloat16 F.linear runs) spends ~40-80 us a call on a small product however
 * few the rows (python -m disaggsdk.bench.skinny_gemm --dtype bfloat16), while the AMX work of a
 * decode step's 16 x 256 x 1024 product is a few microseconds: the difference is dispatch and the
 * per-call repacking of W. Here W is packed once, at load, into the tiles' layout.
 *
 * cffi cdef: build_cpu_linear.py strips comments and preprocessor lines from this header.
 */
#include <stdint.h>

/* Asks Linux for the AMX tile state of this process (arch_prctl ARCH_REQ_XCOMP_PERM); idempotent.
 * Returns 0 where AMX can run, -1 where it cannot (no AMX, or a kernel without the permission). */
int amx_linear_init(void);

/* out = x packed_w^T, bfloat16 in and out, float32 accumulation, round to nearest even.
 *
 * x:          bfloat16 [rows, in_features], row r at x + r * x_row_stride (elements).
 * packed_w:   the weight [out_features, in_features] as tiles: tile (nb, kb) of 16 output features
 *             by 32 inputs at packed_w + (nb * (in_features / 32) + kb) * 512, 16 rows of input
 *             pairs, each row the pairs (w[n][2i], w[n][2i + 1]) of its 16 features in order
 *             (AMX's VNNI layout; amx_linear.py packs it).
 * in_features must be a multiple of 32, out_features of 16.
 * out:        bfloat16 [rows, out_features], row r at out + r * out_row_stride.
 * Returns 0, or -1 (nothing computed) when amx_linear_init has not succeeded in this process.
 */
int amx_bf16_linear(const uint16_t *x, int64_t rows, int64_t x_row_stride, const uint16_t *packed_w,
                     int64_t out_features, int64_t in_features, uint16_t *out, int64_t out_row_stride);

/* A mixture of experts' products: rows [group_ends[g - 1], group_ends[g]) of x (group_ends[-1] = 0)
 * times expert g's packed weight, at packed_w + g * out_features * in_features (amx_linear.pack of
 * the stacked [groups, out_features, in_features] weights), into the same rows of out. Rows are
 * sorted by expert; the ends are read here, so the caller never waits for them (no host sync).
 * Returns 0, or -1 as amx_bf16_linear. */
int amx_bf16_grouped_linear(const uint16_t *x, int64_t x_row_stride, const int32_t *group_ends, int64_t groups,
                            const uint16_t *packed_w, int64_t out_features, int64_t in_features, uint16_t *out,
                            int64_t out_row_stride);
