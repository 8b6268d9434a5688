/*
 * Matrices kept in a GGUF file's own quantized blocks, multiplied without widening them.
 *
 * Why: a decode step reads every weight once, so on a CPU it is bound by the bytes it reads.
 * A Q4_1 block holds 32 values in 20 bytes (0.625 bytes a value, against 2 for float16), a
 * Q8_0 block in 34. Each block is decoded in registers, into exactly the float32 values
 * gguf's numpy dequantizer gives (d * q + m, two roundings: built with -ffp-contract=off),
 * and used at once for every row of the input, so decoding costs once per weight per call
 * however many rows the batch has.
 *
 * Layouts (ggml's): Q4_1 = {half d; half m; uint8 qs[16]}, value j is the low nibble of
 * qs[j] for j < 16 and the high nibble of qs[j - 16] after. Q8_0 = {half d; int8 qs[32]}.
 *
 * One thread: an engine node runs one torch thread per core it owns. The AVX2 path is chosen
 * at run time (__builtin_cpu_supports), its AVX-512 passes for a batch of rows where the CPU
 * has AVX-512F, with a portable one for every other CPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define Q4_1_BYTES 20
#define Q8_0_BYTES 34
#define MAX_ROWS 8 /* rows of x per pass: one accumulator register each */

enum { FORMAT_Q4_1 = 0, FORMAT_Q8_0 = 1 };

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        exp = 113;
        while (!(mant & 0x400)) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t read_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

static int block_bytes(int format) { return format == FORMAT_Q4_1 ? Q4_1_BYTES : Q8_0_BYTES; }

/* One block's 32 values, exactly as gguf's numpy dequantizer computes them. */
static void decode_block(int format, const uint8_t *b, float *out) {
    float d = half_to_float(read_half(b));
    if (format == FORMAT_Q4_1) {
        float m = half_to_float(read_half(b + 2));
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            float lo = d * (float)(qs[j] & 0x0f);
            float hi = d * (float)(qs[j] >> 4);
            out[j] = lo + m;
            out[j + 16] = hi + m;
        }
    } else {
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < QK; j++) out[j] = (float)qs[j] * d;
    }
}

static void dequant_portable(int format, const uint8_t *w, int64_t cols, const int64_t *rows,
                             int64_t count, float *out) {
    int64_t blocks = cols / QK, stride = blocks * block_bytes(format);
    for (int64_t r = 0; r < count; r++) {
        const uint8_t *row = w + (rows ? rows[r] : r) * stride;
        for (int64_t k = 0; k < blocks; k++)
            decode_block(format, row + k * block_bytes(format), out + r * cols + k * QK);
    }
}

static void matmul_portable(int format, const float *x, int64_t m, int64_t cols, const uint8_t *w,
                            int64_t n, float *y) {
    int64_t blocks = cols / QK, bb = block_bytes(format), stride = blocks * bb;
    float values[QK];
    for (int64_t i0 = 0; i0 < m; i0 += MAX_ROWS) {
        int64_t rows = m - i0 < MAX_ROWS ? m - i0 : MAX_ROWS;
        for (int64_t o = 0; o < n; o++) {
            float acc[MAX_ROWS] = {0};
            for (int64_t k = 0; k < blocks; k++) {
                decode_block(format, w + o * stride + k * bb, values);
                for (int64_t i = 0; i < rows; i++) {
                    const float *xr = x + (i0 + i) * cols + k * QK;
                    float s = 0;
                    for (int j = 0; j < QK; j++) s += values[j] * xr[j];
                    acc[i] += s;
                }
            }
            for (int64_t i = 0; i < rows; i++) y[(i0 + i) * n + o] = acc[i];
        }
    }
}

#if defined(__x86_64__)
#include "simd.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* The block's 32 values in four registers (values 0-7, 8-15, 16-23, 24-31). */
static inline AVX2 __attribute__((always_inline)) void decode_avx2(int format, const uint8_t *b,
                                                                    __m256 v[4]) {
    __m256 d = _mm256_set1_ps(_cvtsh_ss(read_half(b)));
    if (format == FORMAT_Q4_1) {
        __m256 mn = _mm256_set1_ps(_cvtsh_ss(read_half(b + 2)));
        __m128i q = _mm_loadu_si128((const __m128i *)(b + 4));
        __m128i mask = _mm_set1_epi8(0x0f);
        __m128i lo = _mm_and_si128(q, mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int p = 0; p < 4; p++) {
            __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
            v[p] = _mm256_add_ps(_mm256_mul_ps(d, f), mn);
        }
    } else {
        for (int p = 0; p < 4; p++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * p));
            v[p] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
        }
    }
}

static AVX2 void dequant_avx2(int format, const uint8_t *w, int64_t cols, const int64_t *rows,
                              int64_t count, float *out) {
    int64_t blocks = cols / QK, bb = block_bytes(format), stride = blocks * bb;
    for (int64_t r = 0; r < count; r++) {
        const uint8_t *row = w + (rows ? rows[r] : r) * stride;
        for (int64_t k = 0; k < blocks; k++) {
            __m256 v[4];
            decode_avx2(format, row + k * bb, v);
            for (int p = 0; p < 4; p++) _mm256_storeu_ps(out + r * cols + k * QK + 8 * p, v[p]);
        }
    }
}

/* The block's 32 quants as floats, not yet scaled (q for Q4_1, the int8 values for Q8_0). */
static inline AVX2 __attribute__((always_inline)) void quants_avx2(int format, const uint8_t *b,
                                                                    __m256 f[4]) {
    if (format == FORMAT_Q4_1) {
        __m128i q = _mm_loadu_si128((const __m128i *)(b + 4));
        __m128i mask = _mm_set1_epi8(0x0f);
        __m128i lo = _mm_and_si128(q, mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        f[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
        f[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
        f[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
        f[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    } else {
        for (int p = 0; p < 4; p++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * p));
            f[p] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        }
    }
}

/* One row of x (decode of a single sequence), where decoding each block is most of the work:
 * the scale and the minimum are applied once per block rather than per value,
 * sum(d q x + m x) = d (q . x) + m sum(x), with sum(x) per block precomputed (`xsum`, as 8
 * lanes). Sums in another order than `pass_avx2`, so results differ in the last bits. */
static inline AVX2 __attribute__((always_inline)) void single_avx2(int format, const float *x,
                                                                    const float *xsum,
                                                                    int64_t cols,
                                                                    const uint8_t *w, int64_t n,
                                                                    float *y) {
    int64_t blocks = cols / QK, bb = block_bytes(format), stride = blocks * bb;
    for (int64_t o = 0; o < n; o++) {
        const uint8_t *row = w + o * stride;
        __m256 scaled[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        __m256 minimum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t k = 0; k < blocks; k++) {
            const uint8_t *b = row + k * bb;
            const float *xr = x + k * QK;
            __m256 f[4];
            quants_avx2(format, b, f);
            __m256 dot = _mm256_mul_ps(f[0], _mm256_loadu_ps(xr));
            __m256 dot2 = _mm256_mul_ps(f[1], _mm256_loadu_ps(xr + 8));
            dot = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(xr + 16), dot);
            dot2 = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(xr + 24), dot2);
            __m256 d = _mm256_set1_ps(_cvtsh_ss(read_half(b)));
            scaled[k & 1] = _mm256_fmadd_ps(_mm256_add_ps(dot, dot2), d, scaled[k & 1]);
            if (format == FORMAT_Q4_1) {
                __m256 m = _mm256_set1_ps(_cvtsh_ss(read_half(b + 2)));
                minimum[k & 1] = _mm256_fmadd_ps(m, _mm256_load_ps(xsum + 8 * k), minimum[k & 1]);
            }
        }
        __m256 total = _mm256_add_ps(_mm256_add_ps(scaled[0], scaled[1]),
                                     _mm256_add_ps(minimum[0], minimum[1]));
        y[o] = ug_hsum8(total);
    }
}

/* `rows` rows of x (a constant after inlining, so the accumulators stay in registers). With
 * few rows, each row gets several accumulators: one chain of dependent FMAs per row would wait
 * on the FMA latency (4 cycles) four times a block. */
static inline AVX2 __attribute__((always_inline)) void pass_avx2(int format, const float *x,
                                                                  int64_t rows, int64_t cols,
                                                                  const uint8_t *w, int64_t n,
                                                                  float *y) {
    int64_t blocks = cols / QK, bb = block_bytes(format), stride = blocks * bb;
    const int chains = rows == 1 ? 4 : rows <= 3 ? 2 : 1;
    for (int64_t o = 0; o < n; o++) {
        const uint8_t *row = w + o * stride;
        __m256 acc[MAX_ROWS][4];
        for (int64_t i = 0; i < rows; i++)
            for (int c = 0; c < chains; c++) acc[i][c] = _mm256_setzero_ps();
        for (int64_t k = 0; k < blocks; k++) {
            __m256 v[4];
            decode_avx2(format, row + k * bb, v);
            for (int64_t i = 0; i < rows; i++) {
                const float *xr = x + i * cols + k * QK;
                for (int p = 0; p < 4; p++)
                    acc[i][p % chains] =
                        _mm256_fmadd_ps(v[p], _mm256_loadu_ps(xr + 8 * p), acc[i][p % chains]);
            }
        }
        for (int64_t i = 0; i < rows; i++) {
            __m256 sum = acc[i][0];
            for (int c = 1; c < chains; c++) sum = _mm256_add_ps(sum, acc[i][c]);
            y[i * n + o] = ug_hsum8(sum);
        }
    }
}

/* The pass for `rows` (1 to 8, a constant in each case), `P` being PASS or PASS512. */
#define PASSES(P, F)                                                                               \
    switch (rows) {                                                                                \
        P(F, 1) P(F, 2) P(F, 3) P(F, 4) P(F, 5) P(F, 6) P(F, 7) P(F, 8)                            \
    }

/* -- AVX-512: a block's 16 values from a table --------------------------------------------
 * Where the CPU has AVX-512F, a Q4_1 block is decoded with two table lookups instead of four
 * conversions: its 16 possible values, d * q + m for q = 0..15 (the same two roundings as
 * gguf's dequantizer), are computed once into one register, and each of the block's halves
 * picks its 16 values from it by nibble (vpermps). Decoding is the cost every block pays
 * whatever the rows (about 8 cycles in the AVX2 path), so it is what a batch of a few rows,
 * a pipeline stage's micro-batch, saves the most on. Rows are multiplied 16 values at a time.
 */
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f")))

static inline AVX512 __attribute__((always_inline)) void decode_avx512(int format,
                                                                        const uint8_t *b,
                                                                        __m512 v[2]) {
    __m512 d = _mm512_set1_ps(_cvtsh_ss(read_half(b)));
    if (format == FORMAT_Q4_1) {
        const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512 table = _mm512_add_ps(_mm512_mul_ps(d, q),
                                     _mm512_set1_ps(_cvtsh_ss(read_half(b + 2))));
        __m128i bytes = _mm_loadu_si128((const __m128i *)(b + 4));
        __m128i mask = _mm_set1_epi8(0x0f);
        __m512i lo = _mm512_cvtepu8_epi32(_mm_and_si128(bytes, mask));
        __m512i hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask));
        v[0] = _mm512_permutexvar_ps(lo, table);
        v[1] = _mm512_permutexvar_ps(hi, table);
    } else {
        for (int p = 0; p < 2; p++) {
            __m128i q = _mm_loadu_si128((const __m128i *)(b + 2 + 16 * p));
            v[p] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
        }
    }
}

/* `rows` rows of x, as pass_avx2; `chains` accumulators a row (1 or 2). */
static inline AVX512 __attribute__((always_inline)) void pass_avx512(int format, const float *x,
                                                                      int64_t rows, int chains,
                                                                      int64_t cols,
                                                                      const uint8_t *w,
                                                                      int64_t n, float *y) {
    int64_t blocks = cols / QK, bb = block_bytes(format), stride = blocks * bb;
    for (int64_t o = 0; o < n; o++) {
        const uint8_t *row = w + o * stride;
        __m512 acc[MAX_ROWS][2];
        for (int64_t i = 0; i < rows; i++)
            for (int c = 0; c < chains; c++) acc[i][c] = _mm512_setzero_ps();
        for (int64_t k = 0; k < blocks; k++) {
            __m512 v[2];
            decode_avx512(format, row + k * bb, v);
            for (int64_t i = 0; i < rows; i++) {
                const float *xr = x + i * cols + k * QK;
                for (int p = 0; p < 2; p++)
                    acc[i][p % chains] = _mm512_fmadd_ps(v[p], _mm512_loadu_ps(xr + 16 * p),
                                                         acc[i][p % chains]);
            }
        }
        for (int64_t i = 0; i < rows; i++) {
            __m512 sum = chains == 2 ? _mm512_add_ps(acc[i][0], acc[i][1]) : acc[i][0];
            y[i * n + o] = _mm512_reduce_add_ps(sum);
        }
    }
}

#define PASS512(F, R)                                                                              \
    case R:                                                                                        \
        pass_avx512(F, xs, R, (R) <= 4 ? 2 : 1, cols, w, n, ys);                                   \
        break;

static AVX512 void passes_avx512(int format, const float *xs, int64_t rows, int64_t cols,
                                 const uint8_t *w, int64_t n, float *ys) {
    if (format == FORMAT_Q4_1) {
        PASSES(PASS512, FORMAT_Q4_1)
    } else {
        PASSES(PASS512, FORMAT_Q8_0)
    }
}

static int has_avx512(void) {
    static int found = -1;
    if (found < 0) {
        __builtin_cpu_init();
        found = __builtin_cpu_supports("avx512f");
    }
    return found;
}

#define PASS(F, R)                                                                                 \
    case R:                                                                                        \
        pass_avx2(F, xs, R, cols, w, n, ys);                                                       \
        break;

/* `wide`: the AVX-512 passes for a batch of rows (the CPU has AVX-512F). */
static AVX2 void matmul_avx2(int format, const float *x, int64_t m, int64_t cols,
                             const uint8_t *w, int64_t n, float *y, int wide) {
    if (m == 1 && format == FORMAT_Q8_0) {
        single_avx2(FORMAT_Q8_0, x, NULL, cols, w, n, y);
        return;
    }
    if (m == 1) { /* Q4_1 needs each block's sum of x; without memory, the general pass runs */
        int64_t blocks = cols / QK;
        float *xsum = aligned_alloc(32, (size_t)blocks * 32);
        if (xsum) {
            for (int64_t k = 0; k < blocks; k++) {
                const float *xr = x + k * QK;
                __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xr), _mm256_loadu_ps(xr + 8)),
                                         _mm256_add_ps(_mm256_loadu_ps(xr + 16),
                                                       _mm256_loadu_ps(xr + 24)));
                _mm256_store_ps(xsum + 8 * k, s);
            }
            single_avx2(FORMAT_Q4_1, x, xsum, cols, w, n, y);
            free(xsum);
            return;
        }
    }
    for (int64_t i0 = 0; i0 < m; i0 += MAX_ROWS) {
        int64_t rows = m - i0 < MAX_ROWS ? m - i0 : MAX_ROWS;
        const float *xs = x + i0 * cols;
        float *ys = y + i0 * n;
        if (wide) {
            passes_avx512(format, xs, rows, cols, w, n, ys);
            continue;
        }
        if (format == FORMAT_Q4_1) {
            PASSES(PASS, FORMAT_Q4_1)
        } else {
            PASSES(PASS, FORMAT_Q8_0)
        }
    }
}
#endif

/* 1 where this CPU runs the AVX2 path, 0 where the portable one. */
int ug_accelerated(void) {
#if defined(__x86_64__)
    static int accelerated = -1;
    if (accelerated < 0) {
        __builtin_cpu_init();
        accelerated = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    }
    return accelerated;
#else
    return 0;
#endif
}

/* out[r, :] = the values of rows[r] of w (rows x cols values), or of every row if rows is NULL. */
void ug_dequant(int format, const uint8_t *w, int64_t cols, const int64_t *rows, int64_t count,
                float *out) {
#if defined(__x86_64__)
    if (ug_accelerated()) {
        dequant_avx2(format, w, cols, rows, count, out);
        return;
    }
#endif
    dequant_portable(format, w, cols, rows, count, out);
}

/* The portable paths, whatever the CPU (the tests hold the two to the same values). */
void ug_dequant_portable(int format, const uint8_t *w, int64_t cols, const int64_t *rows,
                         int64_t count, float *out) {
    dequant_portable(format, w, cols, rows, count, out);
}

void ug_matmul_portable(int format, const float *x, int64_t m, int64_t cols, const uint8_t *w,
                        int64_t n, float *y) {
    matmul_portable(format, x, m, cols, w, n, y);
}

/* ug_matmul's body: `wide`, the AVX-512 passes for a batch of rows. */
static void matmul_with(int wide, int format, const float *x, int64_t m, int64_t cols,
                        const uint8_t *w, int64_t n, float *y) {
#if defined(__x86_64__)
    if (ug_accelerated()) {
        matmul_avx2(format, x, m, cols, w, n, y, wide);
        return;
    }
#endif
    (void)wide;
    matmul_portable(format, x, m, cols, w, n, y);
}

/* 1 where ug_matmul multiplies a batch of rows with AVX-512, 0 where not. */
int ug_wide(void) {
#if defined(__x86_64__)
    return ug_accelerated() && has_avx512();
#else
    return 0;
#endif
}

/* y (m x n) = x (m x cols, float32) @ W.T, W being n rows of cols values in `format` blocks.
 * cols must be a multiple of 32; all arrays are contiguous. */
void ug_matmul(int format, const float *x, int64_t m, int64_t cols, const uint8_t *w, int64_t n,
               float *y) {
    matmul_with(ug_wide(), format, x, m, cols, w, n, y);
}

/* The AVX2 path alone, where the CPU has AVX-512 too (the tests compare the paths); the
 * portable one where it has not even AVX2. */
void ug_matmul_avx2(int format, const float *x, int64_t m, int64_t cols, const uint8_t *w,
                    int64_t n, float *y) {
    matmul_with(0, format, x, m, cols, w, n, y);
}
