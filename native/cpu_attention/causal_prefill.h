/* Causal prefill attention on CPU: fresh prompts (no earlier KV), queries over their own new keys;
 * and one chunk over a prefix of earlier keys (a prefix-cache hit, a later chunk of a long prompt).
 *
 * cffi cdef: build_cpu_attention.py strips comments and preprocessor lines from this header.
 */
#include <stdint.h>

/* Causal attention of each request's new tokens over themselves (flash-style: tiles of queries
 * against tiles of keys with an online softmax; nothing of [q, kv] size is materialised, and
 * tiles above the diagonal are never computed). Grouped query heads share each transposed key
 * tile of their kv head.
 *
 * q:      float32 [num_tokens, num_q_heads, head_dim], token t at q + t * q_row_stride.
 * k, v:   float32 [num_tokens, num_kv_heads, head_dim | v_dim], token t at k + t * k_row_stride
 *         (v + t * v_row_stride); heads contiguous within a token.
 * starts, lens: request r owns tokens [starts[r], starts[r] + lens[r]) of q, k, v and out.
 * out:    float32 [num_tokens, num_q_heads, v_dim], token t at out + t * out_row_stride.
 * Each request's keys are transposed once into a scratch buffer; its (kv head, query tile) pairs are
 * shared among the threads of the OpenMP pool (torch's: torch.set_num_threads sets it), each pair
 * computed whole by one thread, so the result does not depend on the thread count.
 * Returns 0; -1 (nothing computed) when head_dim or v_dim exceeds 256, v_dim is not a multiple of
 * 16, or a kv head has more than 8 query heads; -2 when the scratch cannot be allocated.
 */
int causal_prefill_attention(
    const float *q, int64_t q_row_stride, const float *k, int64_t k_row_stride,
    const float *v, int64_t v_row_stride, const int64_t *starts, const int64_t *lens, int64_t num_requests,
    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim, float sm_scale,
    float *out, int64_t out_row_stride);

/* Causal attention of one request's chunk of num_q new tokens over num_prefix earlier keys and
 * themselves: query i (row i of q and out) sees keys [0, num_prefix + i] of k and v, which hold
 * num_prefix + num_q token rows (the prefix's keys gathered from its pages, then the chunk's).
 * Layouts, threads and returns as causal_prefill_attention's; also -1 for a negative num_prefix.
 */
int prefix_prefill_attention(
    const float *q, int64_t q_row_stride, const float *k, int64_t k_row_stride,
    const float *v, int64_t v_row_stride, int64_t num_q, int64_t num_prefix,
    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim, float sm_scale,
    float *out, int64_t out_row_stride);
