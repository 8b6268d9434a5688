/*
 * What the kernels' x86 paths share. Included by each kernel's source (the build hashes it
 * with them: `depends` in engine/model/kernels/__init__.py).
 */
#ifndef UG_SIMD_H
#define UG_SIMD_H
#if defined(__x86_64__)
#include <immintrin.h>

/* The sum of a register's eight floats. */
static inline __attribute__((target("avx2"))) float ug_hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif
#endif
