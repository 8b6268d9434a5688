/*
 * RMSNorm of float32 rows, with the residual add before it fused in.
 *
 * Why: a decoder layer normalises twice, each time just after adding a residual, on rows of
 * a few hundred values. In torch that is an add and a norm that runs as about ten small ops;
 * at decode sizes their dispatch costs several times their arithmetic. One call does both.
 *
 *   sum = x + residual            (when residual is given; written to `sum` if it is given)
 *   out = sum * (1 / sqrt(mean(sum^2) + eps)) * weight
 *
 * x, residual, sum and out are (rows, cols), contiguous; weight is (cols,). `sum` may be x
 * itself. One thread; the AVX2 path (cols a multiple of 8) is chosen at run time, the
 * portable one runs everywhere else (the tests compare the two with torch's).
 */
#include <math.h>
#include <stdint.h>

static float inverse_rms(const float *h, int64_t cols, float eps) {
    float squares = 0;
    for (int64_t c = 0; c < cols; c++) squares += h[c] * h[c];
    return 1.0f / sqrtf(squares / (float)cols + eps);
}

static void norm_portable(const float *x, const float *residual, float *sum, const float *weight,
                          int64_t rows, int64_t cols, float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *hr = sum ? sum + r * cols : out + r * cols; /* out holds the sum meanwhile */
        if (residual) {
            const float *rr = residual + r * cols;
            for (int64_t c = 0; c < cols; c++) hr[c] = xr[c] + rr[c];
            xr = hr;
        }
        float scale = inverse_rms(xr, cols, eps);
        float *orow = out + r * cols;
        for (int64_t c = 0; c < cols; c++) orow[c] = (xr[c] * scale) * weight[c];
    }
}

#if defined(__x86_64__)
#include "simd.h"

#define AVX2 __attribute__((target("avx2")))

static AVX2 void norm_avx2(const float *x, const float *residual, float *sum, const float *weight,
                           int64_t rows, int64_t cols, float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *hr = sum ? sum + r * cols : out + r * cols;
        __m256 squares = _mm256_setzero_ps();
        for (int64_t c = 0; c < cols; c += 8) {
            __m256 h = _mm256_loadu_ps(xr + c);
            if (residual) {
                h = _mm256_add_ps(h, _mm256_loadu_ps(residual + r * cols + c));
                _mm256_storeu_ps(hr + c, h);
            }
            squares = _mm256_add_ps(squares, _mm256_mul_ps(h, h));
        }
        if (residual) xr = hr;
        __m256 scale = _mm256_set1_ps(1.0f / sqrtf(ug_hsum8(squares) / (float)cols + eps));
        for (int64_t c = 0; c < cols; c += 8) {
            __m256 n = _mm256_mul_ps(_mm256_loadu_ps(xr + c), scale);
            _mm256_storeu_ps(out + r * cols + c, _mm256_mul_ps(n, _mm256_loadu_ps(weight + c)));
        }
    }
}

static int has_avx2(void) {
    static int found = -1;
    if (found < 0) {
        __builtin_cpu_init();
        found = __builtin_cpu_supports("avx2");
    }
    return found;
}
#endif

/* 1 where ug_rms_norm runs the AVX2 path for rows of `cols`, 0 where the portable one. */
int ug_norm_accelerated(int64_t cols) {
#if defined(__x86_64__)
    return cols % 8 == 0 && has_avx2();
#else
    (void)cols;
    return 0;
#endif
}

void ug_rms_norm(const float *x, const float *residual, float *sum, const float *weight,
                 int64_t rows, int64_t cols, float eps, float *out) {
#if defined(__x86_64__)
    if (ug_norm_accelerated(cols)) {
        norm_avx2(x, residual, sum, weight, rows, cols, eps, out);
        return;
    }
#endif
    norm_portable(x, residual, sum, weight, rows, cols, eps, out);
}

void ug_rms_norm_portable(const float *x, const float *residual, float *sum, const float *weight,
                          int64_t rows, int64_t cols, float eps, float *out) {
    norm_portable(x, residual, sum, weight, rows, cols, eps, out);
}
