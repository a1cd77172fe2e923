/* AMX bfloat16 linear; see amx_linear.h. Compiled for AMX by function attributes, so the module
 * builds on any x86-64 host and amx_linear_init says at run time whether it can be used. */
#include "amx_linear.h"

#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_ROWS 16        /* rows of x per tile, and input pairs per weight tile */
#define TILE_K 32           /* bfloat16 inputs per tile row (64 bytes) */
#define TILE_N 16           /* output features per weight tile */
#define N_TILES_PER_PASS 4  /* accumulator tiles 0-3 share one x tile (4); weights alternate 5, 6 */

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16,avx512vl")))

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int ready;  /* amx_linear_init succeeded: tile instructions would fault before it */

int amx_linear_init(void) {
    if (!ready) ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return ready ? 0 : -1;
}

/* Tiles 0-3 accumulate `rows` x 16 floats, 4 holds `rows` x 32 inputs, 5 and 6 a weight tile. */
AMX static void configure(int64_t rows) {
    tile_config config;
    memset(&config, 0, sizeof(config));
    config.palette_id = 1;
    for (int t = 0; t < 5; t++) {
        config.rows[t] = (uint8_t)rows;
        config.colsb[t] = 64;
    }
    for (int t = 5; t < 7; t++) {
        config.rows[t] = TILE_ROWS;
        config.colsb[t] = 64;
    }
    /* GCC 12 does not see ldtilecfg read the struct and drops the stores above: a barrier keeps them. */
    __asm__ __volatile__("" : : "r"(&config) : "memory");
    _tile_loadconfig(&config);
}

/* Rounds `rows` x (16 * tiles) accumulated floats (row stride 64 floats) into bfloat16 out. */
AMX static void store_rounded(const float *acc, int64_t rows, int tiles, uint16_t *out, int64_t out_row_stride) {
    for (int64_t r = 0; r < rows; r++)
        for (int t = 0; t < tiles; t++) {
            __m256bh y = _mm512_cvtneps_pbh(_mm512_loadu_ps(acc + r * 64 + t * TILE_N));
            _mm256_storeu_si256((__m256i *)(out + r * out_row_stride + t * TILE_N), (__m256i)y);
        }
}

/* The weight tiles 5 and 6 alternate so that one tile's load overlaps the other's product. */
#define PRODUCT(acc, wtile, nb)                                                          \
    do {                                                                                 \
        _tile_loadd(wtile, packed_w + ((nb) * k_tiles + kb) * (TILE_ROWS * TILE_K), 64); \
        _tile_dpbf16ps(acc, 4, wtile);                                                   \
    } while (0)

/* One block of up to 16 rows (the configured tile rows) times `tiles` weight tiles from nb. */
AMX static void block_product(const uint16_t *x_block, int64_t block_rows, int64_t x_row_stride,
                              const uint16_t *packed_w, int64_t nb, int tiles, int64_t k_tiles,
                              uint16_t *out_block, int64_t out_row_stride) {
    float acc[TILE_ROWS * 64] __attribute__((aligned(64)));
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < k_tiles; kb++) {
        _tile_loadd(4, x_block + kb * TILE_K, x_row_stride * 2);
        PRODUCT(0, 5, nb);
        if (tiles > 1) PRODUCT(1, 6, nb + 1);
        if (tiles > 2) PRODUCT(2, 5, nb + 2);
        if (tiles > 3) PRODUCT(3, 6, nb + 3);
    }
    _tile_stored(0, acc, 256);
    if (tiles > 1) _tile_stored(1, acc + 16, 256);
    if (tiles > 2) _tile_stored(2, acc + 32, 256);
    if (tiles > 3) _tile_stored(3, acc + 48, 256);
    store_rounded(acc, block_rows, tiles, out_block + nb * TILE_N, out_row_stride);
}

/* Whole 16-row blocks go weight-tiles-outer, so each weight tile is read from memory once and
 * from cache for the other blocks; a last, shorter block takes its own pass (its own tile rows). */
AMX int amx_bf16_linear(const uint16_t *x, int64_t rows, int64_t x_row_stride, const uint16_t *packed_w,
                        int64_t out_features, int64_t in_features, uint16_t *out, int64_t out_row_stride) {
    if (!ready) return -1;
    const int64_t k_tiles = in_features / TILE_K, n_tiles = out_features / TILE_N;
    const int64_t full_rows = rows - rows % TILE_ROWS;
    if (full_rows > 0) {
        configure(TILE_ROWS);
        for (int64_t nb = 0; nb < n_tiles; nb += N_TILES_PER_PASS) {
            const int tiles = n_tiles - nb < N_TILES_PER_PASS ? (int)(n_tiles - nb) : N_TILES_PER_PASS;
            for (int64_t row0 = 0; row0 < full_rows; row0 += TILE_ROWS)
                block_product(x + row0 * x_row_stride, TILE_ROWS, x_row_stride, packed_w, nb, tiles, k_tiles,
                              out + row0 * out_row_stride, out_row_stride);
        }
    }
    if (rows > full_rows) {
        configure(rows - full_rows);
        for (int64_t nb = 0; nb < n_tiles; nb += N_TILES_PER_PASS) {
            const int tiles = n_tiles - nb < N_TILES_PER_PASS ? (int)(n_tiles - nb) : N_TILES_PER_PASS;
            block_product(x + full_rows * x_row_stride, rows - full_rows, x_row_stride, packed_w, nb, tiles,
                          k_tiles, out + full_rows * out_row_stride, out_row_stride);
        }
    }
    _tile_release();
    return 0;
}

AMX int amx_bf16_grouped_linear(const uint16_t *x, int64_t x_row_stride, const int32_t *group_ends, int64_t groups,
                                const uint16_t *packed_w, int64_t out_features, int64_t in_features, uint16_t *out,
                                int64_t out_row_stride) {
    if (!ready) return -1;
    int64_t start = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t end = group_ends[g];
        if (end > start)
            amx_bf16_linear(x + start * x_row_stride, end - start, x_row_stride, packed_w + g * out_features * in_features,
                            out_features, in_features, out + start * out_row_stride, out_row_stride);
        start = end > start ? end : start;
    }
    return 0;
}
