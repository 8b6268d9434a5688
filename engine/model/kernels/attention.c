/*
 * Decode attention read straight from the paged KV cache: one new query token per entry,
 * attending to every cached position it may see, through its block table.
 *
 * Why: torch has no attention over blocks, so the torch path first gathers each entry's
 * blocks into a padded copy (every layer, keys and values), then runs a masked SDPA over it.
 * For a decode step the arithmetic is small (a few hundred thousand multiply-adds a layer) and
 * those two passes, their copies and their dispatch were a fifth of an 8-entry step here.
 * This kernel reads each key and value row once, where it lives, and writes nothing but the
 * output.
 *
 * It also does the two steps before, which cost more in torch's dispatch than in arithmetic:
 * each entry's new key and value are written to their cache row, and, given the rotary
 * tables' rows, the query and the key are rotated first (Llama's rotate-half convention, the
 * same products and sum as torch's x * cos + rotated * sin, so the same values).
 *
 * Layouts (all float32, contiguous unless a stride is given):
 *   q        (batch, heads, dim), row b at q + b * q_stride
 *   k_new    (batch, kv_heads, dim), row b at k_new + b * k_stride; v_new likewise
 *   cos, sin (batch, dim), or both NULL: q and k_new are rotated already
 *   rows     (batch,) the cache row each entry's key and value go to
 *   k, v     one layer's cache, (cache_rows, kv_heads, dim); row r of block t is
 *            t * block_size + r
 *   tables   (batch, width) block ids; entry b sees positions 0 .. lengths[b] - 1
 *   out      (batch, heads, dim)
 * Query head h reads kv head h / (heads / kv_heads), as grouped-query attention does. The
 * softmax is the usual one, its maximum subtracted first, scores scaled by `scale`.
 *
 * One thread, like the block kernels: the AVX2 path is chosen at run time where dim is a
 * multiple of 8 up to 64 (SmolLM2's and Llama's heads are 64 wide), and the portable one runs
 * everywhere else (the tests compare the two).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* out = x rotated by its position's angles, for `count` heads of `dim` (even) values. */
static void rotate(const float *x, const float *cos, const float *sin, int64_t count,
                   int64_t dim, float *out) {
    int64_t half = dim / 2;
    for (int64_t h = 0; h < count; h++, x += dim, out += dim) {
        for (int64_t d = 0; d < half; d++) {
            float a = x[d] * cos[d], b = -x[d + half] * sin[d];
            out[d] = a + b;
        }
        for (int64_t d = half; d < dim; d++) {
            float a = x[d] * cos[d], b = x[d - half] * sin[d];
            out[d] = a + b;
        }
    }
}

static const float *row_at(const float *base, const int64_t *table, int64_t position,
                           int64_t block_size, int64_t kv_heads, int64_t dim, int64_t head) {
    int64_t row = table[position / block_size] * block_size + position % block_size;
    return base + (row * kv_heads + head) * dim;
}

/* scores[j] <- exp(scores[j] - max), returning their sum. */
static float softmax_numerators(float *scores, int64_t n) {
    float max = scores[0];
    for (int64_t j = 1; j < n; j++) max = scores[j] > max ? scores[j] : max;
    float sum = 0;
    for (int64_t j = 0; j < n; j++) {
        scores[j] = expf(scores[j] - max);
        sum += scores[j];
    }
    return sum;
}

static void attend_portable(int64_t heads, int64_t kv_heads, int64_t dim, const float *q,
                            const float *k, const float *v, const int64_t *table, int64_t length,
                            int64_t block_size, float scale, float *scores, float *out) {
    int64_t group = heads / kv_heads;
    for (int64_t h = 0; h < heads; h++) {
        int64_t g = h / group;
        const float *qh = q + h * dim;
        for (int64_t j = 0; j < length; j++) {
            const float *kr = row_at(k, table, j, block_size, kv_heads, dim, g);
            float s = 0;
            for (int64_t d = 0; d < dim; d++) s += qh[d] * kr[d];
            scores[j] = s * scale;
        }
        float sum = softmax_numerators(scores, length);
        float *oh = out + h * dim;
        for (int64_t d = 0; d < dim; d++) oh[d] = 0;
        for (int64_t j = 0; j < length; j++) {
            const float *vr = row_at(v, table, j, block_size, kv_heads, dim, g);
            for (int64_t d = 0; d < dim; d++) oh[d] += scores[j] * vr[d];
        }
        for (int64_t d = 0; d < dim; d++) oh[d] /= sum;
    }
}

#if defined(__x86_64__)
#include "simd.h"

#define AVX2 __attribute__((target("avx2,fma")))

/* exp(x) for eight floats: Cephes' expf (range reduction by ln 2 in two parts, a degree-5
 * polynomial, the power of two put in the exponent bits), within about 2 ulp of expf. */
static inline AVX2 __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_floor_ps(
        _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(y, x), x), x), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* softmax_numerators with the exponentials eight at a time. */
static AVX2 float softmax_numerators_avx2(float *scores, int64_t n) {
    float max = scores[0];
    for (int64_t j = 1; j < n; j++) max = scores[j] > max ? scores[j] : max;
    __m256 m = _mm256_set1_ps(max), total = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j), m));
        _mm256_storeu_ps(scores + j, e);
        total = _mm256_add_ps(total, e);
    }
    float sum = ug_hsum8(total);
    for (; j < n; j++) {
        scores[j] = expf(scores[j] - max);
        sum += scores[j];
    }
    return sum;
}

/* The eight sums of a[0..7]'s lanes, in order, as one register. */
static inline AVX2 __m256 sums8(const __m256 a[8]) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* As attend_portable, dim a multiple of 8 and at most 64: each query head's registers stay
 * put while it meets its kv head's keys eight positions at a time; the value rows are
 * summed into eight registers. */
static AVX2 void attend_avx2(int64_t heads, int64_t kv_heads, int64_t dim, const float *q,
                             const float *k, const float *v, const int64_t *table,
                             int64_t length, int64_t block_size, float scale, float *scores,
                             float *out) {
    int64_t group = heads / kv_heads, chunks = dim / 8;
    __m256 scale_by = _mm256_set1_ps(scale);
    for (int64_t h = 0; h < heads; h++) {
        int64_t g = h / group;
        __m256 qh[8];
        for (int64_t c = 0; c < chunks; c++) qh[c] = _mm256_loadu_ps(q + h * dim + 8 * c);
        int64_t j = 0;
        for (; j + 8 <= length; j += 8) {
            __m256 acc[8];
            for (int p = 0; p < 8; p++) {
                const float *kr = row_at(k, table, j + p, block_size, kv_heads, dim, g);
                __m256 a = _mm256_mul_ps(qh[0], _mm256_loadu_ps(kr));
                for (int64_t c = 1; c < chunks; c++)
                    a = _mm256_add_ps(a, _mm256_mul_ps(qh[c], _mm256_loadu_ps(kr + 8 * c)));
                acc[p] = a;
            }
            _mm256_storeu_ps(scores + j, _mm256_mul_ps(sums8(acc), scale_by));
        }
        for (; j < length; j++) {
            const float *kr = row_at(k, table, j, block_size, kv_heads, dim, g);
            __m256 a = _mm256_mul_ps(qh[0], _mm256_loadu_ps(kr));
            for (int64_t c = 1; c < chunks; c++)
                a = _mm256_add_ps(a, _mm256_mul_ps(qh[c], _mm256_loadu_ps(kr + 8 * c)));
            scores[j] = ug_hsum8(a) * scale;
        }
        __m256 inv = _mm256_set1_ps(1.0f / softmax_numerators_avx2(scores, length));
        __m256 o[8];
        for (int64_t c = 0; c < chunks; c++) o[c] = _mm256_setzero_ps();
        for (j = 0; j < length; j++) {
            const float *vr = row_at(v, table, j, block_size, kv_heads, dim, g);
            __m256 p = _mm256_set1_ps(scores[j]);
            for (int64_t c = 0; c < chunks; c++)
                o[c] = _mm256_add_ps(o[c], _mm256_mul_ps(p, _mm256_loadu_ps(vr + 8 * c)));
        }
        for (int64_t c = 0; c < chunks; c++)
            _mm256_storeu_ps(out + h * dim + 8 * c, _mm256_mul_ps(o[c], inv));
    }
}

static int has_avx2(void) {
    static int found = -1;
    if (found < 0) {
        __builtin_cpu_init();
        found = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return found;
}
#endif

/* 1 where ug_attend_decode runs the AVX2 path for this dim, 0 where the portable one. */
int ug_attend_accelerated(int64_t dim) {
#if defined(__x86_64__)
    return dim % 8 == 0 && dim <= 64 && has_avx2();
#else
    (void)dim;
    return 0;
#endif
}

static int attend_with(int accelerated, int64_t batch, int64_t heads, int64_t kv_heads,
                       int64_t dim, const float *q, int64_t q_stride, const float *k_new,
                       int64_t k_stride, const float *v_new, int64_t v_stride, const float *cos,
                       const float *sin, const int64_t *rows, int64_t cache_rows, float *k,
                       float *v, const int64_t *tables, int64_t width, const int64_t *lengths,
                       int64_t block_size, float scale, float *out) {
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads || dim <= 0 || dim % 2 ||
        block_size <= 0 || (cos == NULL) != (sin == NULL))
        return -1;
    int64_t longest = 0, blocks = cache_rows / block_size;
    for (int64_t b = 0; b < batch; b++) { /* nothing out of the cache is read or written */
        if (lengths[b] <= 0 || lengths[b] > width * block_size) return -1;
        if (rows[b] < 0 || rows[b] >= cache_rows) return -1;
        for (int64_t t = 0; t < (lengths[b] + block_size - 1) / block_size; t++)
            if (tables[b * width + t] < 0 || tables[b * width + t] >= blocks) return -1;
        longest = lengths[b] > longest ? lengths[b] : longest;
    }
    /* Scores, then (rotating) the batch's rotated queries. */
    size_t queries = cos ? (size_t)(batch * heads * dim) : 0;
    float *scores = malloc(((size_t)longest + 8 + queries) * sizeof(float));
    if (!scores) return -2;
    float *rotated = scores + longest + 8;
    int64_t row_values = kv_heads * dim;
    for (int64_t b = 0; b < batch; b++) { /* every write before any read */
        const float *kb = k_new + b * k_stride;
        if (cos) {
            rotate(kb, cos + b * dim, sin + b * dim, kv_heads, dim, k + rows[b] * row_values);
            rotate(q + b * q_stride, cos + b * dim, sin + b * dim, heads, dim,
                   rotated + b * heads * dim);
        } else {
            memcpy(k + rows[b] * row_values, kb, (size_t)row_values * sizeof(float));
        }
        memcpy(v + rows[b] * row_values, v_new + b * v_stride, (size_t)row_values * sizeof(float));
    }
    for (int64_t b = 0; b < batch; b++) {
        const float *qb = cos ? rotated + b * heads * dim : q + b * q_stride;
        const int64_t *table = tables + b * width;
        float *ob = out + b * heads * dim;
#if defined(__x86_64__)
        if (accelerated) {
            attend_avx2(heads, kv_heads, dim, qb, k, v, table, lengths[b], block_size, scale,
                        scores, ob);
            continue;
        }
#endif
        (void)accelerated;
        attend_portable(heads, kv_heads, dim, qb, k, v, table, lengths[b], block_size, scale,
                        scores, ob);
    }
    free(scores);
    return 0;
}

#define ATTEND_ARGS                                                                                \
    int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim, const float *q,                 \
        int64_t q_stride, const float *k_new, int64_t k_stride, const float *v_new,               \
        int64_t v_stride, const float *cos, const float *sin, const int64_t *rows,                \
        int64_t cache_rows, float *k, float *v, const int64_t *tables, int64_t width,             \
        const int64_t *lengths, int64_t block_size, float scale, float *out
#define ATTEND_PASS                                                                                \
    batch, heads, kv_heads, dim, q, q_stride, k_new, k_stride, v_new, v_stride, cos, sin, rows,  \
        cache_rows, k, v, tables, width, lengths, block_size, scale, out

/* Write, then attend: 0, or -1 for a shape it cannot take (the caller checks first; this is
 * the last guard, and it returns before writing anything), -2 when out of memory. */
int ug_attend_decode(ATTEND_ARGS) { return attend_with(ug_attend_accelerated(dim), ATTEND_PASS); }

int ug_attend_decode_portable(ATTEND_ARGS) { return attend_with(0, ATTEND_PASS); }
