/* Paged decode attention on CPU (see paged_decode.h).
 *
 * Why a kernel of our own: in torch, a decode step first gathers every request's pages into a
 * contiguous copy and then runs batched matmuls, a masked fill and a softmax over it. At batch 6
 * with ~1,100 tokens of context the gather alone took 31% of the step and the attention matmuls
 * 18%: the KV is read three times and written once. Here each K and V row is read once, in place.
 *
 * Per (request, kv head): scores of the group's query heads against every key (pass 1), a softmax
 * per query head (pass 2), the probability-weighted sum of values (pass 3). Scores live in a
 * scratch of group * kv_len floats, small enough for L2 at the context lengths served on a CPU.
 * Built with -ffast-math and OpenMP SIMD pragmas (no OpenMP runtime): the dot products and the
 * exp (glibc's libmvec) vectorise, for the CPU it is built on (-march=native).
 */
#include "paged_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *scores;    /* [group][kv_len] */
    float *row;       /* one K or V row as float32 (bf16 caches only) */
} scratch_t;

static inline float bf16_to_float(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)x << 16;
    return c.f;
}

/* The row at element offset `at`, as float32: in place for float32 caches, converted into
 * `tmp` for bfloat16 ones. */
static inline const float *row_f32(const void *base, int64_t at, int is_bf16, float *tmp, int64_t n) {
    if (!is_bf16)
        return (const float *)base + at;
    const uint16_t *src = (const uint16_t *)base + at;
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        tmp[i] = bf16_to_float(src[i]);
    return tmp;
}

static void attend_one_head(
    const float *q_group, int64_t group, int64_t head_dim, int64_t v_dim,
    const void *k_cache, const void *v_cache, int is_bf16, int64_t head_base,
    int64_t page_stride, int64_t token_stride, const int64_t *pages, int64_t kv_len,
    int64_t page_size, float sm_scale, float *out_group, scratch_t *s) {
    float *scores = s->scores;
    /* pass 1: scores[g][t] = q_g . k_t * scale */
    for (int64_t t0 = 0, p = 0; t0 < kv_len; t0 += page_size, p++) {
        int64_t n = kv_len - t0 < page_size ? kv_len - t0 : page_size;
        int64_t page_at = pages[p] * page_stride + head_base;
        for (int64_t j = 0; j < n; j++) {
            const float *k = row_f32(k_cache, page_at + j * token_stride, is_bf16, s->row, head_dim);
            for (int64_t g = 0; g < group; g++) {
                const float *qg = q_group + g * head_dim;
                float acc = 0.f;
#pragma omp simd reduction(+ : acc)
                for (int64_t i = 0; i < head_dim; i++)
                    acc += qg[i] * k[i];
                scores[g * kv_len + t0 + j] = acc * sm_scale;
            }
        }
    }
    /* pass 2: softmax of each query head's scores */
    for (int64_t g = 0; g < group; g++) {
        float *sg = scores + g * kv_len;
        float mx = -1e30f;  /* finite: -ffast-math assumes no infinities */
#pragma omp simd reduction(max : mx)
        for (int64_t t = 0; t < kv_len; t++)
            mx = sg[t] > mx ? sg[t] : mx;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < kv_len; t++) {
            sg[t] = expf(sg[t] - mx);
            sum += sg[t];
        }
        float inv = 1.f / sum;
#pragma omp simd
        for (int64_t t = 0; t < kv_len; t++)
            sg[t] *= inv;
    }
    /* pass 3: out_g = sum_t p[g][t] v_t */
    memset(out_group, 0, sizeof(float) * group * v_dim);
    for (int64_t t0 = 0, p = 0; t0 < kv_len; t0 += page_size, p++) {
        int64_t n = kv_len - t0 < page_size ? kv_len - t0 : page_size;
        int64_t page_at = pages[p] * page_stride + head_base;
        for (int64_t j = 0; j < n; j++) {
            const float *v = row_f32(v_cache, page_at + j * token_stride, is_bf16, s->row, v_dim);
            for (int64_t g = 0; g < group; g++) {
                float w = scores[g * kv_len + t0 + j];
                float *og = out_group + g * v_dim;
#pragma omp simd
                for (int64_t i = 0; i < v_dim; i++)
                    og[i] += w * v[i];
            }
        }
    }
}

int paged_decode_attention(
    const float *q, int64_t q_row_stride, const int64_t *rows, int64_t batch,
    const void *k_cache, const void *v_cache, int cache_is_bf16,
    int64_t page_stride, int64_t head_stride, int64_t token_stride,
    const int64_t *page_indices, const int64_t *page_indptr, const int64_t *kv_lens,
    int64_t page_size, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim,
    float sm_scale, float *out, int64_t out_row_stride) {
    int64_t group = num_q_heads / num_kv_heads;
    int64_t max_len = 0;
    for (int64_t b = 0; b < batch; b++)
        max_len = kv_lens[b] > max_len ? kv_lens[b] : max_len;
    int64_t row_len = head_dim > v_dim ? head_dim : v_dim;
    scratch_t s;
    s.scores = malloc(sizeof(float) * (group * max_len + 1));
    s.row = malloc(sizeof(float) * row_len);
    if (!s.scores || !s.row) {
        free(s.scores);
        free(s.row);
        return -1;
    }
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *pages = page_indices + page_indptr[b];
        for (int64_t h = 0; h < num_kv_heads; h++) {
            attend_one_head(q + rows[b] * q_row_stride + h * group * head_dim, group, head_dim, v_dim,
                            k_cache, v_cache, cache_is_bf16, h * head_stride, page_stride, token_stride,
                            pages, kv_lens[b], page_size, sm_scale,
                            out + rows[b] * out_row_stride + h * group * v_dim, &s);
        }
    }
    free(s.scores);
    free(s.row);
    return 0;
}
