/* Paged decode attention on CPU: one query token per request over its paged KV, read in place.
 *
 * cffi cdef: build_cpu_attention.py strips comments and preprocessor lines from this header.
 */
#include <stdint.h>

/* Attention of one query token per request over that request's KV pages, read where they lie
 * (no gathered copy). Grouped query heads share their kv head's reads: each K and V row is read
 * once per kv head for all of its query heads.
 *
 * q:          float32, query row of request b at q + rows[b] * q_row_stride, heads of head_dim
 *             floats each, contiguous ([num_tokens, num_q_heads, head_dim]).
 * k_cache, v_cache: the layer's pages, float32 (cache_dtype 0), bfloat16 (1) or float8_e4m3fn
 *             (2: element values are multiplied by k_scale and v_scale, the layer's static fp8
 *             scales; the scales are not read for other dtypes); element
 *             (page, head, token, i) at page * page_stride + head * head_stride
 *             + token * token_stride + i, in elements; the same strides for K and V (V rows are
 *             the first v_dim elements of theirs: MLA's latent values inside its keys).
 * page_indices, page_indptr: request b's pages are page_indices[page_indptr[b] .. page_indptr[b+1]).
 * kv_lens:    [batch] tokens of KV of each request (its last page holds the rest).
 * out:        float32, request b's output row at out + rows[b] * out_row_stride
 *             ([num_tokens, num_q_heads, v_dim]).
 * Runs on the threads of the process's OpenMP pool (torch's: `torch.set_num_threads`) when the
 * call has more than one (request, kv head) pair and enough work; each pair on one thread, so the
 * result does not depend on the thread count.
 * Returns 0, or -1 when a scratch allocation fails (out is then incomplete).
 */
int paged_decode_attention(
    const float *q, int64_t q_row_stride, const int64_t *rows, int64_t batch,
    const void *k_cache, const void *v_cache, int cache_dtype, float k_scale, float v_scale,
    int64_t page_stride, int64_t head_stride, int64_t token_stride,
    const int64_t *page_indices, const int64_t *page_indptr, const int64_t *kv_lens,
    int64_t page_size, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim,
    float sm_scale, float *out, int64_t out_row_stride);

/* The OpenMP pool's thread count as this module sees it: torch's `get_num_threads()` when the
 * module shares torch's OpenMP runtime, as it must (one libgomp per process). */
int paged_decode_threads(void);
