/* Causal prefill attention on CPU (see causal_prefill.h).
 *
 * Why: torch's CPU flash kernel (SDPA, is_causal) ran a 1,024-token prompt of 8 query / 2 kv heads
 * of 32 dims at ~12 ms a layer, plus copies to repeat the kv heads: ~40% of a tiny model's
 * prefill. Here a work item is TQ query tokens of one kv head's query heads: the request's keys
 * are transposed once (blocks of [dim][KB keys]); the item's rows, (token, query head) pairs,
 * go ROWS at a time, so that each loaded key or value vector feeds ROWS rows' FMAs (vLLM's 8 x 2
 * register tile); per tile of TK keys, scores into a buffer, an online softmax over it (a running
 * max and sum per row, the accumulator rescaled when the max moves), then the values.
 * That prompt, one thread of an AMD EPYC "family 26 model 2" (Zen 5): 3.8 ms, as vLLM's
 * cpu_attention_with_kv_cache (3.8); the previous tiling here (4 rows of one head, each key
 * vector a memory operand of every row's FMA: more loads than FMAs) took 5.9. Two threads: 2.1.
 */
#include "causal_prefill.h"

#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define TQ 32      /* query tokens per work item (one kv head's query heads for these tokens) */
#define KB 32      /* keys per score block: two 16-float vectors; the keys' transposed tiles */
#define TK 128     /* keys per softmax tile: four score blocks (their K and V stay in L1) */
#define ROWS 8     /* (token, query head) rows a pass computes together */
#define MAX_DIM 256
#define MAX_GROUP 8
/* -ffast-math assumes no infinities: a finite "minus infinity" */
#define NEG_BIG (-1e30f)

/* GCC vector extensions: 16 floats, one AVX-512 register (two AVX2 ones, four SSE ones: the build
 * uses -march=native); aligned(4) allows loads from any float address. */
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4)));

static inline v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

/* where m (all ones or zeros per lane, from a comparison): a, elsewhere b */
static inline v16 blend(v16i m, v16 a, v16 b) {
    v16i ai, bi, r;
    v16 out;
    __builtin_memcpy(&ai, &a, sizeof ai);
    __builtin_memcpy(&bi, &b, sizeof bi);
    r = (ai & m) | (bi & ~m);
    __builtin_memcpy(&out, &r, sizeof out);
    return out;
}

#if defined(__AVX512F__)
/* one vmaxps: the compare-and-blend below is three instructions */
static inline v16 vmax(v16 a, v16 b) { return (v16)_mm512_max_ps((__m512)a, (__m512)b); }
#else
static inline v16 vmax(v16 a, v16 b) { return blend(a > b, a, b); }
#endif

/* A vector the compiler must keep in a register: without this GCC folded each key (value) load
 * into every row's FMA as a memory operand, 16 loads per 16 FMAs where 2 suffice, and the
 * loads, not the FMAs, set the pace (two 512-bit loads a cycle on Zen 5). */
static inline v16 in_register(v16 x) {
#if defined(__AVX512F__)
    __asm__("" : "+v"(x));
#endif
    return x;
}

/* log-step horizontal reductions: four shuffles instead of sixteen lane extractions */
static inline float hmax(v16 x) {
    x = vmax(x, __builtin_shuffle(x, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
    x = vmax(x, __builtin_shuffle(x, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
    x = vmax(x, __builtin_shuffle(x, (v16i){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
    x = vmax(x, __builtin_shuffle(x, (v16i){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
    return x[0];
}

static inline float hsum(v16 x) {
    x += __builtin_shuffle(x, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x += __builtin_shuffle(x, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    x += __builtin_shuffle(x, (v16i){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    x += __builtin_shuffle(x, (v16i){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return x[0];
}

/* exp of x <= 0 (scores minus their running max): 2^n * p(r), n = round(x / ln 2),
 * r = x - n ln 2 in [-ln2/2, ln2/2], p a degree-6 polynomial (relative error ~2e-7);
 * anything under -87 gives exp(-87) (1.6e-38: as good as 0 beside the row's largest term, 1).
 * With AVX-512, vrndscaleps rounds and vscalefps multiplies by 2^n: four instructions fewer than
 * the conversions and exponent arithmetic, for every score. */
static inline v16 exp_nonpositive(v16 x) {
    x = vmax(x, splat(-87.f));
#if defined(__AVX512F__)
    v16 n = (v16)_mm512_roundscale_ps((__m512)(x * splat(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    v16 n = __builtin_convertvector(__builtin_convertvector(x * splat(1.44269504f) - splat(0.5f), v16i), v16);
#endif
    v16 r = x - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
    v16 p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.f);
#if defined(__AVX512F__)
    return (v16)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16 scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    return p * scale;
#endif
}

/* Scores of ROWS rows against one block of KB keys: s[r][j] = q_r . k_j, the keys' dims at
 * kt[d * KB + j]. Each key vector, loaded once, feeds ROWS rows' FMAs (16 chains for the FMA
 * latency): vLLM's layout of the same product. */
static inline void score_block(const float *const q[ROWS], const float *kt, int64_t head_dim, float *s,
                               int64_t s_stride) {
    v16 a[ROWS][2];
    for (int r = 0; r < ROWS; r++)
        a[r][0] = a[r][1] = splat(0.f);
    for (int64_t d = 0; d < head_dim; d++) {
        v16 k0 = in_register(*(const v16 *)(kt + d * KB)), k1 = in_register(*(const v16 *)(kt + d * KB + 16));
        for (int r = 0; r < ROWS; r++) {
            v16 qd = splat(q[r][d]);
            a[r][0] += qd * k0;
            a[r][1] += qd * k1;
        }
    }
    for (int r = 0; r < ROWS; r++) {
        *(v16 *)(s + r * s_stride) = a[r][0];
        *(v16 *)(s + r * s_stride + 16) = a[r][1];
    }
}

/* acc[r][e0 .. e0 + 32) += sum_j p[r][j] v_j[e0 ..], for j < nk: each value vector loaded once for
 * ROWS rows (16 chains); then the same 16 dims at a time for the rest (v_dim % 32). */
static inline void value_pass(float *const acc[ROWS], const float *p, int64_t p_stride, const float *vt,
                              int64_t v_row_stride, int64_t nk, int64_t v_dim) {
    int64_t e = 0;
    for (; e + 32 <= v_dim; e += 32) {
        v16 o[ROWS][2];
        for (int r = 0; r < ROWS; r++) {
            o[r][0] = *(const v16 *)(acc[r] + e);
            o[r][1] = *(const v16 *)(acc[r] + e + 16);
        }
        for (int64_t j = 0; j < nk; j++) {
            v16 v0 = in_register(*(const v16 *)(vt + j * v_row_stride + e));
            v16 v1 = in_register(*(const v16 *)(vt + j * v_row_stride + e + 16));
            for (int r = 0; r < ROWS; r++) {
                v16 pj = splat(p[r * p_stride + j]);
                o[r][0] += pj * v0;
                o[r][1] += pj * v1;
            }
        }
        for (int r = 0; r < ROWS; r++) {
            *(v16 *)(acc[r] + e) = o[r][0];
            *(v16 *)(acc[r] + e + 16) = o[r][1];
        }
    }
    for (; e < v_dim; e += 16) {
        v16 o[ROWS];
        for (int r = 0; r < ROWS; r++)
            o[r] = *(const v16 *)(acc[r] + e);
        for (int64_t j = 0; j < nk; j++) {
            v16 v0 = in_register(*(const v16 *)(vt + j * v_row_stride + e));
            for (int r = 0; r < ROWS; r++)
                o[r] += splat(p[r * p_stride + j]) * v0;
        }
        for (int r = 0; r < ROWS; r++)
            *(v16 *)(acc[r] + e) = o[r];
    }
}

/* One work item: query tokens [q0, q0 + nq) of every query head of kv head `kv_head` against all
 * the keys they may see. Its rows are the (token, query head) pairs, token-major, ROWS at a time
 * (with 4 query heads a kv head: 2 tokens x 4 heads, as vLLM's kernel takes them), so that every
 * query head of the group shares each loaded key and value. Query i sits at position offset + i:
 * it sees keys [0, offset + i] (offset: keys before the first query, a cached prefix). For each
 * tile of TK keys, each pass of ROWS rows: scores (score_block), an online softmax over the tile
 * (a running max and sum per row; the accumulator rescaled only when the max moves), then p . V
 * added to the rows' accumulators (value_pass). Rows past the end duplicate the last row's inputs
 * and are dropped. */
static void attend_tile(
    const float *q, int64_t q_row_stride, const float *kt_head,
    const float *v, int64_t v_row_stride, int64_t q0, int64_t nq, int64_t offset, int64_t head_dim, int64_t v_dim,
    int64_t kv_head, int64_t group, float sm_scale, float *out, int64_t out_row_stride) {
    int64_t n_rows = nq * group;  /* row i * group + g: token q0 + i, query head kv_head * group + g */
    /* accumulators, one v_dim row per row and one more that padding rows write to */
    float acc_store[(n_rows + 1) * v_dim + 16];
    float *acc_base = (float *)(((uintptr_t)acc_store + 63) & ~(uintptr_t)63);
    float row_max[TQ * MAX_GROUP], row_sum[TQ * MAX_GROUP];
    float s[ROWS][TK] __attribute__((aligned(64)));  /* scores, then probabilities, of a pass's rows */
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    memset(acc_base, 0, sizeof(float) * n_rows * v_dim);
    for (int64_t i = 0; i < n_rows; i++) {
        row_max[i] = NEG_BIG;
        row_sum[i] = 0.f;
    }
    int64_t q_end = offset + q0 + nq;  /* keys [0, q_end) are visible to some row of the item */
    for (int64_t k0 = 0; k0 < q_end; k0 += TK) {
        int64_t nk = q_end - k0 < TK ? q_end - k0 : TK;
        const float *kt = kt_head + k0 * head_dim;  /* blocks of KB keys, [dim][KB] each */
        const float *vt = v + k0 * v_row_stride + kv_head * v_dim;
        for (int64_t r0 = 0; r0 < n_rows; r0 += ROWS) {
            int64_t last = r0 + ROWS <= n_rows ? r0 + ROWS - 1 : n_rows - 1;
            int64_t newest = offset + q0 + last / group;  /* the position of the pass's last token */
            if (k0 > newest)
                continue;  /* none of these rows sees any of these keys */
            int64_t used = newest - k0 + 1 < nk ? newest - k0 + 1 : nk;  /* keys some row sees */
            const float *qr[ROWS];
            float *accr[ROWS];
            int64_t visible[ROWS];  /* keys row r sees in this tile (causal: keys <= its own) */
            for (int r = 0; r < ROWS; r++) {
                int64_t row = r0 + r <= last ? r0 + r : last;
                int64_t i = row / group, g = row % group;
                qr[r] = q + (q0 + i) * q_row_stride + (kv_head * group + g) * head_dim;
                accr[r] = acc_base + (r0 + r <= last ? row : n_rows) * v_dim;
                int64_t t = offset + q0 + i - k0 + 1;
                visible[r] = r0 + r > last ? 0 : t < used ? (t > 0 ? t : 0) : used;
            }
            for (int64_t b = 0; b < used; b += KB)
                score_block(qr, kt + b * head_dim, head_dim, &s[0][b], TK);
            /* online softmax of each row over the tile's visible keys; probabilities of the keys
             * [visible, used) are 0, so value_pass may run every row over `used` keys */
            int64_t used_vectors = (used + 15) / 16;
            for (int r = 0; r < ROWS; r++) {
                int64_t row = r0 + r;
                int64_t vis = visible[r], full = vis / 16, vectors = (vis + 15) / 16;
                float *sr = s[r];
                if (vis <= 0) {  /* a padding row, or one that sees none of these keys */
                    memset(sr, 0, sizeof(float) * used_vectors * 16);
                    continue;
                }
                v16 m = splat(NEG_BIG);
                for (int64_t c = 0; c < full; c++)
                    m = vmax(m, *(v16 *)(sr + 16 * c));
                if (full < vectors)  /* the diagonal: lanes past the row's own key are masked */
                    m = vmax(m, blend(lane < (v16i){0} + (int32_t)(vis - 16 * full), *(v16 *)(sr + 16 * full),
                                      splat(NEG_BIG)));
                float old_max = row_max[row], tile_max = hmax(m) * sm_scale;
                float mx = tile_max > old_max ? tile_max : old_max;
                v16 sum = splat(0.f), neg_max = splat(-mx), scale = splat(sm_scale);
                for (int64_t c = 0; c < full; c++) {
                    v16 e = exp_nonpositive(*(v16 *)(sr + 16 * c) * scale + neg_max);
                    sum += e;
                    *(v16 *)(sr + 16 * c) = e;
                }
                if (full < vectors) {
                    v16 e = blend(lane < (v16i){0} + (int32_t)(vis - 16 * full),
                                  exp_nonpositive(*(v16 *)(sr + 16 * full) * scale + neg_max), splat(0.f));
                    sum += e;
                    *(v16 *)(sr + 16 * full) = e;
                }
                for (int64_t c = vectors; c < used_vectors; c++)
                    *(v16 *)(sr + 16 * c) = splat(0.f);
                /* past the first tiles the running max rarely moves: no exp, no rescale, for a factor of 1 */
                if (mx != old_max) {
                    float correction = exp_nonpositive(splat(old_max - mx))[0];
                    row_sum[row] *= correction;
                    for (int64_t e = 0; e < v_dim; e += 16)
                        *(v16 *)(accr[r] + e) *= splat(correction);
                    row_max[row] = mx;
                }
                row_sum[row] += hsum(sum);
            }
            value_pass(accr, &s[0][0], TK, vt, v_row_stride, used, v_dim);
        }
    }
    for (int64_t row = 0; row < n_rows; row++) {
        int64_t i = row / group, g = row % group;
        float inv = 1.f / row_sum[row];
        float *dst = out + (q0 + i) * out_row_stride + (kv_head * group + g) * v_dim;
        for (int64_t e = 0; e < v_dim; e++)
            dst[e] = acc_base[row * v_dim + e] * inv;
    }
}

/* One kv head's keys [0, n), transposed once for every work item that reads them, a block of KB
 * keys at a time: key j's dim d at kt[(j / KB) * head_dim * KB + d * KB + j % KB]; keys [n, stride)
 * are zeros (a block past the last key reads them, masked). One [dim][all keys] matrix instead
 * would put a block's rows 4 KB apart, on the same L1 sets. */
static void transpose_keys(const float *k, int64_t k_row_stride, int64_t n, int64_t stride, int64_t kv_head,
                           int64_t head_dim, float *kt) {
    for (int64_t k0 = 0; k0 < stride; k0 += KB) {
        float *block = kt + k0 * head_dim;
        for (int64_t j = 0; j < KB; j++) {
            const float *kr = k + (k0 + j < n ? k0 + j : 0) * k_row_stride + kv_head * head_dim;
            for (int64_t d = 0; d < head_dim; d++)
                block[d * KB + j] = k0 + j < n ? kr[d] : 0.f;
        }
    }
}

/* One request's num_q queries over num_prefix earlier keys and their own: the keys of every kv head
 * transposed, then the (kv head, query tile) pairs shared among the threads of torch's pool (the
 * libgomp runtime torch loaded, see build_cpu_attention.py); the last query tiles see the most keys,
 * so they are handed out first. Returns 0, or -2 when the scratch cannot be allocated. */
static int attend_request(
    const float *q, int64_t q_row_stride, const float *k, int64_t k_row_stride,
    const float *v, int64_t v_row_stride, int64_t num_q, int64_t num_prefix,
    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim, float sm_scale,
    float *out, int64_t out_row_stride) {
    int64_t group = num_q_heads / num_kv_heads, n_keys = num_prefix + num_q;
    int64_t stride = (n_keys + TK - 1) / TK * TK, tiles = (num_q + TQ - 1) / TQ;
    float *kt = malloc(sizeof(float) * num_kv_heads * head_dim * stride);
    if (kt == NULL)
        return -2;
    for (int64_t h = 0; h < num_kv_heads; h++)
        transpose_keys(k, k_row_stride, n_keys, stride, h, head_dim, kt + h * head_dim * stride);
#pragma omp parallel for schedule(dynamic, 1) if (tiles * num_kv_heads > 1)
    for (int64_t item = 0; item < tiles * num_kv_heads; item++) {
        int64_t h = item % num_kv_heads, q0 = (tiles - 1 - item / num_kv_heads) * TQ;
        int64_t nq = num_q - q0 < TQ ? num_q - q0 : TQ;
        attend_tile(q, q_row_stride, kt + h * head_dim * stride, v, v_row_stride, q0, nq, num_prefix,
                    head_dim, v_dim, h, group, sm_scale, out, out_row_stride);
    }
    free(kt);
    return 0;
}

int causal_prefill_attention(
    const float *q, int64_t q_row_stride, const float *k, int64_t k_row_stride,
    const float *v, int64_t v_row_stride, const int64_t *starts, const int64_t *lens, int64_t num_requests,
    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim, float sm_scale,
    float *out, int64_t out_row_stride) {
    int64_t group = num_q_heads / num_kv_heads;
    if (head_dim > MAX_DIM || v_dim > MAX_DIM || v_dim % 16 || group > 8)
        return -1;
    for (int64_t r = 0; r < num_requests; r++) {
        int64_t s = starts[r];
        int rc = attend_request(q + s * q_row_stride, q_row_stride, k + s * k_row_stride, k_row_stride,
                                v + s * v_row_stride, v_row_stride, lens[r], 0, num_q_heads, num_kv_heads, head_dim,
                                v_dim, sm_scale, out + s * out_row_stride, out_row_stride);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int prefix_prefill_attention(
    const float *q, int64_t q_row_stride, const float *k, int64_t k_row_stride,
    const float *v, int64_t v_row_stride, int64_t num_q, int64_t num_prefix,
    int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t v_dim, float sm_scale,
    float *out, int64_t out_row_stride) {
    int64_t group = num_q_heads / num_kv_heads;
    if (head_dim > MAX_DIM || v_dim > MAX_DIM || v_dim % 16 || group > 8 || num_prefix < 0)
        return -1;
    return attend_request(q, q_row_stride, k, k_row_stride, v, v_row_stride, num_q, num_prefix, num_q_heads,
                          num_kv_heads, head_dim, v_dim, sm_scale, out, out_row_stride);
}
