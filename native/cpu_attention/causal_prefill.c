/* Causal prefill attention on CPU (see causal_prefill.h).
 *
 * Why: torch's CPU flash kernel (SDPA, is_causal) ran a 1,024-token prompt of 8 query / 2 kv heads
 * of 32 dims at ~12 ms a layer, plus copies to repeat the kv heads: ~40% of a tiny model's
 * prefill. Here a tile is TQ query tokens x TK keys: each request's keys are transposed once
 * (tiles of [dim][TK]) and read by all the query heads of their kv head; R query rows go together,
 * so each loaded key vector feeds R independent FMA chains; the online softmax keeps a running max
 * and sum per query row and rescales its output accumulator, its steps interleaved across the R
 * rows. That prompt takes 5.3 ms on one thread of an Intel Xeon ("family 6 model 167", AVX-512)
 * where vLLM's own CPU attention takes 5.6 (its profile, float32), and 2.8 ms on two threads.
 */
#include "causal_prefill.h"

#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* Tile sizes measured on the 2-core dev box (Zen 4), 1,024 tokens, 8 query / 2 kv heads of 32:
 * TQ 32, TK 64, R 4 took 9.4 ms; TQ 16 or 64, TK 32, R 2 or 8: 11-17 ms; torch's SDPA 12 ms. */
#define TQ 32      /* query tokens per tile */
#define TK 64      /* keys per tile: four 16-float vectors of scores per row */
#define MAX_DIM 256
/* -ffast-math assumes no infinities: a finite "minus infinity" whose exp is 0 */
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
/* one vmaxps: the compare-and-blend below is three instructions, in the hottest loop */
static inline v16 vmax(v16 a, v16 b) { return (v16)_mm512_max_ps((__m512)a, (__m512)b); }
#else
static inline v16 vmax(v16 a, v16 b) { return blend(a > b, a, b); }
#endif

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
 * anything under -87 gives exp(-87) (1.6e-38: as good as 0 beside the row's largest term, 1). */
static inline v16 exp_nonpositive(v16 x) {
    x = vmax(x, splat(-87.f));
    v16 n = __builtin_convertvector(__builtin_convertvector(x * splat(1.44269504f) - splat(0.5f), v16i), v16);
    v16 r = x - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
    v16 p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.f);
    v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16 scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#define R 4   /* query rows computed together: independent FMA chains hide the FMA latency */
#define NV (TK / 16)  /* score vectors per row and key tile */

/* One tile: query tokens [q0, q0 + nq) of every query head of kv head `kv_head` against all the
 * keys they may see, R rows (tokens of one query head) at a time. Query i sits at position
 * offset + i: it sees keys [0, offset + i] (offset: keys before the first query, a cached prefix). */
static void attend_tile(
    const float *q, int64_t q_row_stride, const float *kt_head,
    const float *v, int64_t v_row_stride, int64_t q0, int64_t nq, int64_t offset, int64_t head_dim, int64_t v_dim,
    int64_t kv_head, int64_t group, float sm_scale, float *out, int64_t out_row_stride) {
    float acc[8][TQ][MAX_DIM];       /* output accumulators per (query head of the group, row) */
    float row_max[8][TQ], row_sum[8][TQ];
    float p[R][TK];                  /* probabilities of R rows for the tile's keys */
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < TQ; i++) {
            row_max[g][i] = NEG_BIG;
            row_sum[g][i] = 0.f;
            memset(acc[g][i], 0, sizeof(float) * v_dim);
        }
    int64_t q_end = offset + q0 + nq;  /* keys [0, q_end) are visible to some row of the tile */
    for (int64_t k0 = 0; k0 < q_end; k0 += TK) {
        int64_t nk = q_end - k0 < TK ? q_end - k0 : TK;
        const float *kt = kt_head + k0 * head_dim;  /* key k0 + j's dim d at kt[d * TK + j] */
        const float *vt = v + k0 * v_row_stride + kv_head * v_dim;
        for (int64_t g = 0; g < group; g++) {
            const float *qh = q + (kv_head * group + g) * head_dim;
            for (int64_t i0 = 0; i0 < nq; i0 += R) {
                if (k0 > offset + q0 + i0 + R - 1)
                    continue;  /* none of these R rows sees any of these keys */
                float correction[R];
                int64_t used = 0;  /* keys any of the R rows sees */
                /* scores of R rows (rows past nq read row nq - 1 and are dropped) */
                const float *qr[R];
                for (int r = 0; r < R; r++)
                    qr[r] = qh + (q0 + (i0 + r < nq ? i0 + r : nq - 1)) * q_row_stride;
                v16 s[R][NV];
                for (int r = 0; r < R; r++)
                    for (int c = 0; c < NV; c++)
                        s[r][c] = splat(0.f);
                for (int64_t d = 0; d < head_dim; d++)
                    for (int r = 0; r < R; r++) {
                        v16 qd = splat(qr[r][d]);
                        for (int c = 0; c < NV; c++)
                            s[r][c] += qd * *(const v16 *)(kt + d * TK + 16 * c);
                    }
                /* online softmax of the R rows, each step for all R rows before the next: per row,
                 * max, exp and sum are a chain of dependent reductions and polynomial steps, and one
                 * row at a time left the FMA ports waiting on it (perf annotate) */
                int64_t visible[R];  /* keys row r sees in this tile (causal: keys <= its own) */
                for (int r = 0; r < R; r++) {
                    int64_t t = offset + q0 + i0 + r;
                    visible[r] = i0 + r >= nq ? 0 : t - k0 + 1 < nk ? t - k0 + 1 : nk;
                    used = visible[r] > used ? visible[r] : used;
                }
                v16 m[R];
                for (int r = 0; r < R; r++) {
                    m[r] = splat(NEG_BIG);
                    for (int c = 0; c < NV; c++) {
                        s[r][c] *= splat(sm_scale);
                        if (visible[r] < TK)  /* the diagonal or the end: mask keys past the row's own */
                            s[r][c] = blend(lane + 16 * c < (v16i){0} + (int32_t)visible[r], s[r][c], splat(NEG_BIG));
                        m[r] = vmax(m[r], s[r][c]);
                    }
                }
                float mx[R];
                for (int r = 0; r < R; r++) {
                    float old_max = row_max[g][i0 + r], tile_max = hmax(m[r]);
                    mx[r] = tile_max > old_max ? tile_max : old_max;
                }
                v16 sum[R];
                for (int r = 0; r < R; r++) {
                    sum[r] = splat(0.f);
                    for (int c = 0; c < NV; c++) {
                        v16 e = exp_nonpositive(s[r][c] - splat(mx[r]));
                        sum[r] += e;
                        *(v16 *)&p[r][16 * c] = e;
                    }
                }
                for (int r = 0; r < R; r++) {
                    int64_t i = i0 + r;
                    if (visible[r] <= 0) {  /* a row past the tile's end, or one that sees none of these keys */
                        memset(p[r], 0, sizeof p[r]);
                        correction[r] = 1.f;
                        continue;
                    }
                    /* past the first tiles the running max rarely moves: no exp for a factor of 1 */
                    float old_max = row_max[g][i];
                    correction[r] = mx[r] == old_max ? 1.f : exp_nonpositive(splat(old_max - mx[r]))[0];
                    row_max[g][i] = mx[r];
                    row_sum[g][i] = row_sum[g][i] * correction[r] + hsum(sum[r]);
                }
                /* acc = acc * correction + p . V, 32 output dims at a time (R x 2 independent FMA
                 * chains: with R alone each chain's 4-cycle latency held the loop to one FMA a
                 * cycle, perf annotate), then 16 at a time for the rest */
                int64_t e = 0;
                for (; e + 32 <= v_dim; e += 32) {
                    v16 lo[R], hi[R];
                    for (int r = 0; r < R; r++) {
                        lo[r] = *(const v16 *)&acc[g][(i0 + r) % TQ][e];
                        hi[r] = *(const v16 *)&acc[g][(i0 + r) % TQ][e + 16];
                        lo[r] *= splat(correction[r]);
                        hi[r] *= splat(correction[r]);
                    }
                    for (int64_t j = 0; j < used; j++) {
                        v16 v_lo = *(const v16 *)(vt + j * v_row_stride + e);
                        v16 v_hi = *(const v16 *)(vt + j * v_row_stride + e + 16);
                        for (int r = 0; r < R; r++) {
                            v16 pj = splat(p[r][j]);
                            lo[r] += pj * v_lo;
                            hi[r] += pj * v_hi;
                        }
                    }
                    for (int r = 0; r < R; r++)
                        if (i0 + r < nq) {
                            *(v16 *)&acc[g][i0 + r][e] = lo[r];
                            *(v16 *)&acc[g][i0 + r][e + 16] = hi[r];
                        }
                }
                for (; e < v_dim; e += 16) {
                    v16 o[R];
                    for (int r = 0; r < R; r++) {
                        o[r] = *(const v16 *)&acc[g][(i0 + r) % TQ][e];
                        o[r] *= splat(correction[r]);
                    }
                    for (int64_t j = 0; j < used; j++) {
                        v16 vj = *(const v16 *)(vt + j * v_row_stride + e);
                        for (int r = 0; r < R; r++)
                            o[r] += splat(p[r][j]) * vj;
                    }
                    for (int r = 0; r < R; r++)
                        if (i0 + r < nq)
                            *(v16 *)&acc[g][i0 + r][e] = o[r];
                }
            }
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < nq; i++) {
            float inv = 1.f / row_sum[g][i];
            float *dst = out + (q0 + i) * out_row_stride + (kv_head * group + g) * v_dim;
            for (int64_t e = 0; e < v_dim; e++)
                dst[e] = acc[g][i][e] * inv;
        }
}

/* One kv head's keys [0, n), transposed once for every query tile that reads them, a tile of TK
 * keys at a time: key j's dim d at kt[(j / TK) * head_dim * TK + d * TK + j % TK]; keys [n, stride)
 * are zeros (a tile past the last key reads them, masked). Transposing each key tile again for
 * every query tile cost a scalar store per key and dim each time; one [dim][all keys] matrix
 * instead put a tile's rows 4 KB apart, on the same L1 sets (slower than the copies). */
static void transpose_keys(const float *k, int64_t k_row_stride, int64_t n, int64_t stride, int64_t kv_head,
                           int64_t head_dim, float *kt) {
    for (int64_t k0 = 0; k0 < stride; k0 += TK) {
        float *tile = kt + k0 * head_dim;
        for (int64_t j = 0; j < TK; j++) {
            const float *kr = k + (k0 + j < n ? k0 + j : 0) * k_row_stride + kv_head * head_dim;
            for (int64_t d = 0; d < head_dim; d++)
                tile[d * TK + j] = k0 + j < n ? kr[d] : 0.f;
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
