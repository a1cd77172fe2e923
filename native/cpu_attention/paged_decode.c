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
 * Built with -ffast-math and OpenMP: the dot products and the exp (glibc's libmvec) vectorise,
 * for the CPU it is built on (-march=native), and a call with enough work deals its
 * (request, kv head) pairs to torch's threads (at batch 16 on two threads attention went from
 * 26-27% to 21-24% of a decode step: before, one core attended while the other waited).
 *
 * fp8 caches (float8_e4m3fn, `kv.dtype: fp8`) are read 16 bytes at a time by bit arithmetic
 * (e4m3x16), rows of other lengths through a 256-entry table per call that holds each byte's value
 * already multiplied by the layer's scale; both give the float32 product `stored.float() * scale`
 * the torch reference computes.
 */
#include "paged_decode.h"

#include <math.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

enum { CACHE_F32 = 0, CACHE_BF16 = 1, CACHE_FP8_E4M3 = 2 };  /* cache_dtype (paged_decode.h) */

typedef struct {
    float *scores;    /* [group][kv_len] */
    float *row;       /* one K or V row as float32 (bf16 and fp8 caches only) */
    float *block;     /* 16 K rows as float32 (bf16 and fp8 caches, the vector path only) */
    float *zeros;     /* one row of zeros: the K row of the keys past a page's last */
} scratch_t;

static inline float bf16_to_float(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)x << 16;
    return c.f;
}

/* The value of an e4m3fn byte: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (mantissa / 8 * 2^-6); 0x7f and 0xff are NaN (never stored: writes saturate). */
static float e4m3_to_float(uint8_t b) {
    int exponent = (b >> 3) & 0xf, mantissa = b & 7;
    float v;
    if (exponent == 15 && mantissa == 7) {
        union { uint32_t u; float f; } nan = {0x7fc00000u};  /* not NAN: -ffast-math may fold it */
        v = nan.f;
    } else if (exponent == 0) {
        v = ldexpf((float)mantissa, -9);
    } else {
        v = ldexpf(1.0f + (float)mantissa / 8.0f, exponent - 7);
    }
    return b & 0x80 ? -v : v;
}

/* lut[b] = value of byte b times scale: the whole dequantization of an fp8 element.
 * lut[FP8_ONE] = 1.0 * scale = scale exactly: the vector path reads the scale from there. */
#define FP8_ONE 0x38  /* exponent 7 (the bias), mantissa 0 */
static void fp8_table(float scale, float *lut) {
    for (int b = 0; b < 256; b++)
        lut[b] = e4m3_to_float((uint8_t)b) * scale;
}

/* 16-float vectors (GCC vector extensions, AVX-512 with -march=native); aligned(4): any address */
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16), aligned(1)));

/* 16 e4m3 bytes as float32 times scale, by bit arithmetic (a table lookup per element is a
 * gather: fp8 decode ran 3x slower than bfloat16 through the table). A normal byte's exponent and
 * mantissa moved to float32's fields, with the bias 127 - 7 added, is its value; a subnormal one
 * (exponent 0) is mantissa * 2^-9, from an int-to-float conversion (no float32 denormals, which
 * -ffast-math may flush). Equal to the table's entries: both are the exact value times scale.
 * The NaN bytes (never stored) come out as 480. */
static inline v16 e4m3x16(const uint8_t *src, float scale) {
#ifdef __AVX512F__  /* one vpmovzxbd: GCC's generic widening of 16 bytes went lane by lane */
    v16i b = (v16i)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src));
#else
    v16i b = __builtin_convertvector(*(const u8x16 *)src, v16i);
#endif
    v16i em = b & 0x7f;
    v16i normal = (em << 20) + (120 << 23);
    v16 sub = __builtin_convertvector(em & 7, v16) * (1.0f / 512.0f);
    v16i is_sub = (em >> 3) == 0;  /* -1 in lanes with exponent 0 */
    v16i bits = ((v16i)sub & is_sub) | (normal & ~is_sub);
    bits |= (b & 0x80) << 24;
    return (v16)bits * scale;
}

/* The row at element offset `at`, as float32: in place for float32 caches, converted into
 * `tmp` for bfloat16 ones and, through `lut`, for fp8 ones. */
static inline const float *row_f32(const void *base, int64_t at, int dtype, const float *lut, float *tmp,
                                   int64_t n) {
    if (dtype == CACHE_F32)
        return (const float *)base + at;
    if (dtype == CACHE_FP8_E4M3) {
        const uint8_t *src = (const uint8_t *)base + at;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            *(v16 *)(tmp + i) = e4m3x16(src + i, lut[FP8_ONE]);
        for (; i < n; i++)
            tmp[i] = lut[src[i]];
        return tmp;
    }
    const uint16_t *src = (const uint16_t *)base + at;
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        tmp[i] = bf16_to_float(src[i]);
    return tmp;
}

/* pass 2: softmax of each of the `group` rows of `kv_len` scores, in place */
static void softmax_rows(float *scores, int64_t group, int64_t kv_len) {
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
}

/* out[j] = the sum of a[j]'s lanes, j = 0..15: a transpose-and-add tree (four levels of two
 * two-input shuffles and an add), 16 dot products finished in ~45 vector ops instead of 16
 * separate horizontal reductions. */
static inline v16 sum16x16(const v16 *a) {
    v16 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)  /* b[i]: lanes 0-7 partial sums of a[2i], lanes 8-15 of a[2i+1] */
        b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], (v16i){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23})
             + __builtin_shuffle(a[2 * i], a[2 * i + 1], (v16i){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
    for (int i = 0; i < 4; i++)  /* c[i]: 4 lanes for each of a[4i + k], k = 0..3 */
        c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], (v16i){0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27})
             + __builtin_shuffle(b[2 * i], b[2 * i + 1], (v16i){4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
    for (int i = 0; i < 2; i++)  /* d[i]: 2 lanes for each of a[8i + k], k = 0..7 */
        d[i] = __builtin_shuffle(c[2 * i], c[2 * i + 1], (v16i){0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29})
             + __builtin_shuffle(c[2 * i], c[2 * i + 1], (v16i){2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
    return __builtin_shuffle(d[0], d[1], (v16i){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30})
         + __builtin_shuffle(d[0], d[1], (v16i){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
}

#define GB 8  /* query heads whose output accumulators stay in registers through the value pass */

/* out_g = sum_t w[g][t] v_t for ng (<= GB) query heads whose weights are rows of kv_len floats
 * at w; inlined where ng is a constant, so the head loop unrolls around the accumulators. */
static inline __attribute__((always_inline)) void value_block(
    int64_t ng, const float *w, const void *v_cache, int dtype, const float *v_lut, int64_t head_base,
    int64_t page_stride,
    int64_t token_stride, const int64_t *pages, int64_t kv_len, int64_t page_size, int64_t v_dim,
    float *out) {
    const v16 zero = {0};
    for (int64_t e = 0; e < v_dim; e += 16) {
        v16 o[GB];
        for (int64_t g = 0; g < GB; g++)
            o[g] = zero;
        for (int64_t t0 = 0, p = 0; t0 < kv_len; t0 += page_size, p++) {
            int64_t in_page = kv_len - t0 < page_size ? kv_len - t0 : page_size;
            int64_t page_at = pages[p] * page_stride + head_base;
            for (int64_t j = 0; j < in_page; j++) {
                v16 vj;
                if (dtype == CACHE_BF16) {
                    const uint16_t *src = (const uint16_t *)v_cache + page_at + j * token_stride + e;
                    for (int l = 0; l < 16; l++)
                        vj[l] = bf16_to_float(src[l]);
                } else if (dtype == CACHE_FP8_E4M3) {
                    vj = e4m3x16((const uint8_t *)v_cache + page_at + j * token_stride + e, v_lut[FP8_ONE]);
                } else {
                    vj = *(const v16 *)((const float *)v_cache + page_at + j * token_stride + e);
                }
                const float *wt = w + t0 + j;
                for (int64_t g = 0; g < ng; g++)
                    o[g] += wt[g * kv_len] * vj;
            }
        }
        for (int64_t g = 0; g < ng; g++)
            *(v16 *)(out + g * v_dim + e) = o[g];
    }
}

/* attend_one_head for head and value dims that are multiples of 16: the scores of 16 keys at a
 * time finished by sum16x16, the value pass with GB x 16 output floats in registers. */
static void attend_one_head_v16(
    const float *q_group, int64_t group, int64_t head_dim, int64_t v_dim,
    const void *k_cache, const void *v_cache, int dtype, const float *k_lut, const float *v_lut,
    int64_t head_base, int64_t page_stride, int64_t token_stride, const int64_t *pages, int64_t kv_len,
    int64_t page_size, float sm_scale, float *out_group, scratch_t *s) {
    float *scores = s->scores;
    const v16 zero = {0};
    int64_t nd = head_dim / 16;
    /* pass 1: scores[g][t] = q_g . k_t * scale, 16 keys of one page at a time */
    for (int64_t t0 = 0, p = 0; t0 < kv_len; t0 += page_size, p++) {
        int64_t in_page = kv_len - t0 < page_size ? kv_len - t0 : page_size;
        int64_t page_at = pages[p] * page_stride + head_base;
        for (int64_t j0 = 0; j0 < in_page; j0 += 16) {
            int64_t n = in_page - j0 < 16 ? in_page - j0 : 16;
            /* rows past the page's last key read zeros, so the loops below have no branch and
             * always run 16 keys: GCC then keeps the 16 accumulators in registers (with a
             * per-key trip count they lived on the stack, zeroed by a memset per block) */
            const float *krow[16];
            for (int64_t j = 0; j < 16; j++)
                krow[j] = j < n ? row_f32(k_cache, page_at + (j0 + j) * token_stride, dtype, k_lut,
                                          s->block + j * head_dim, head_dim)
                                : s->zeros;
            for (int64_t g = 0; g < group; g++) {
                const float *qg = q_group + g * head_dim;
                v16 acc[16];
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++)
                    acc[j] = zero;
                for (int64_t c = 0; c < nd; c++) {
                    v16 qc = *(const v16 *)(qg + 16 * c);
#pragma GCC unroll 16
                    for (int j = 0; j < 16; j++)
                        acc[j] += *(const v16 *)(krow[j] + 16 * c) * qc;
                }
                v16 sj = sum16x16(acc) * sm_scale;
                float *dst = scores + g * kv_len + t0 + j0;
                if (n == 16)
                    *(v16 *)dst = sj;
                else
                    for (int64_t j = 0; j < n; j++)
                        dst[j] = sj[j];
            }
        }
    }
    softmax_rows(scores, group, kv_len);
    /* pass 3: out_g = sum_t p[g][t] v_t, up to GB query heads x 16 output dims in registers.
     * The head count of a block is a constant in each call of value_block (a per-token loop over
     * a variable count compiled to a chain of compares that took a third of the kernel). */
    for (int64_t g0 = 0; g0 < group; g0 += GB) {
        int64_t ng = group - g0 < GB ? group - g0 : GB;
        const float *w = scores + g0 * kv_len;
        float *o = out_group + g0 * v_dim;
#define VALUE_BLOCK(heads) \
    value_block(heads, w, v_cache, dtype, v_lut, head_base, page_stride, token_stride, pages, kv_len, page_size, \
                v_dim, o)
        switch (ng) {
        case GB: VALUE_BLOCK(GB); break;
        case 4: VALUE_BLOCK(4); break;
        case 2: VALUE_BLOCK(2); break;
        case 1: VALUE_BLOCK(1); break;
        default: VALUE_BLOCK(ng);
        }
#undef VALUE_BLOCK
    }
}

static void attend_one_head(
    const float *q_group, int64_t group, int64_t head_dim, int64_t v_dim,
    const void *k_cache, const void *v_cache, int dtype, const float *k_lut, const float *v_lut,
    int64_t head_base, int64_t page_stride, int64_t token_stride, const int64_t *pages, int64_t kv_len,
    int64_t page_size, float sm_scale, float *out_group, scratch_t *s) {
    float *scores = s->scores;
    /* pass 1: scores[g][t] = q_g . k_t * scale */
    for (int64_t t0 = 0, p = 0; t0 < kv_len; t0 += page_size, p++) {
        int64_t n = kv_len - t0 < page_size ? kv_len - t0 : page_size;
        int64_t page_at = pages[p] * page_stride + head_base;
        for (int64_t j = 0; j < n; j++) {
            const float *k = row_f32(k_cache, page_at + j * token_stride, dtype, k_lut, s->row, head_dim);
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
    softmax_rows(scores, group, kv_len);
    /* pass 3: out_g = sum_t p[g][t] v_t */
    memset(out_group, 0, sizeof(float) * group * v_dim);
    for (int64_t t0 = 0, p = 0; t0 < kv_len; t0 += page_size, p++) {
        int64_t n = kv_len - t0 < page_size ? kv_len - t0 : page_size;
        int64_t page_at = pages[p] * page_stride + head_base;
        for (int64_t j = 0; j < n; j++) {
            const float *v = row_f32(v_cache, page_at + j * token_stride, dtype, v_lut, s->row, v_dim);
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

/* Below this many multiply-adds a call stays on one thread: waking the other threads (~5-10 us)
 * would cost more than it saves. One request of ~200 tokens with 8 query heads of 32 is ~100k. */
#define PARALLEL_MIN_FMAS (1 << 18)

int paged_decode_threads(void) {
    return omp_get_max_threads();
}

int paged_decode_attention(
    const float *q, int64_t q_row_stride, const int64_t *rows, int64_t batch,
    const void *k_cache, const void *v_cache, int cache_dtype, float k_scale, float v_scale,
    int64_t page_stride, int64_t head_stride, int64_t token_stride,
    const int64_t *page_indices, const int64_t *page_indptr, const int64_t *kv_lens,
    int64_t page_size, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim,
    float sm_scale, float *out, int64_t out_row_stride) {
    int64_t group = num_q_heads / num_kv_heads;
    float k_lut[256], v_lut[256];  /* fp8 only: per call, so a call's scales never leak to another */
    if (cache_dtype == CACHE_FP8_E4M3) {
        fp8_table(k_scale, k_lut);
        fp8_table(v_scale, v_lut);
    }
    int64_t max_len = 0, total_len = 0;
    for (int64_t b = 0; b < batch; b++) {
        max_len = kv_lens[b] > max_len ? kv_lens[b] : max_len;
        total_len += kv_lens[b];
    }
    int64_t row_len = head_dim > v_dim ? head_dim : v_dim;
    int vector_path = head_dim % 16 == 0 && v_dim % 16 == 0;
    int64_t pairs = batch * num_kv_heads;  /* independent (request, kv head) units of work */
    int64_t fmas = total_len * num_q_heads * (head_dim + v_dim);
    int failed = 0;
    /* the (request, kv head) pairs dealt round-robin to the threads of torch's own OpenMP pool
     * (one libgomp per process: see build_cpu_attention.py), each with its own scratch */
#pragma omp parallel if (pairs > 1 && fmas >= PARALLEL_MIN_FMAS) reduction(| : failed)
    {
        scratch_t s;
        s.scores = malloc(sizeof(float) * (group * max_len + 1));
        s.row = malloc(sizeof(float) * row_len);
        s.block = malloc(sizeof(float) * 16 * row_len);
        s.zeros = calloc(row_len, sizeof(float));
        if (!s.scores || !s.row || !s.block || !s.zeros) {
            failed = 1;
        } else {
            int64_t threads = omp_get_num_threads();
            for (int64_t i = omp_get_thread_num(); i < pairs; i += threads) {
                int64_t b = i / num_kv_heads, h = i % num_kv_heads;
                (vector_path ? attend_one_head_v16 : attend_one_head)(
                    q + rows[b] * q_row_stride + h * group * head_dim, group, head_dim, v_dim,
                    k_cache, v_cache, cache_dtype, k_lut, v_lut, h * head_stride, page_stride, token_stride,
                    page_indices + page_indptr[b], kv_lens[b], page_size, sm_scale,
                    out + rows[b] * out_row_stride + h * group * v_dim, &s);
            }
        }
        free(s.scores);
        free(s.row);
        free(s.block);
        free(s.zeros);
    }
    return failed ? -1 : 0;
}
