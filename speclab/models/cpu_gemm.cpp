// y = x W^T for the few rows a speculative step verifies: one pass over the weight, at memory speed.
//
// x is (M, K) with row stride ldx, W is (N, K) with row stride ldw (rows contiguous), y is (M, N)
// with row stride ldy; float32. A decode or verify step has M = 1..16 rows, so the product is a
// handful of dot products per weight row, and its cost is reading W once (lesson 00's roofline).
// The loop nest streams W row by row, R rows at a time, and computes their dot products with a
// block of up to MB rows of x, all R * MB partial sums in vector registers. The next block of x
// rows reuses the same R rows of W, now in the L1 cache, so W is read from memory once whatever M
// is; x (M * K floats) stays in L2. Each step also prefetches the weight 16 KB ahead of where the
// tile reads, in the order the tiles walk it: with 5 rows the arithmetic (about 1 GFLOP for
// SmolLM2) takes half as long as the read, and without the prefetch the two do not overlap
// (measured 2026-12-01: 30 layers of SmolLM2's projections, 5 rows, 50 ms without it, 34 with it).
// The prefetch asks for the L2 cache (prefetcht1), not a non-temporal one (prefetchnta): on a
// 2-core Intel Xeon with AMX (2026-12-02) the non-temporal hint made one row 2.4x slower than
// torch (75 ms against 32 for the 30 layers), as if every line were fetched twice; with the L2
// hint one row takes 32 ms (as torch), five 34 (torch 56) and nine 43 (torch 71). On the AMD EPYC
// of the figures above the non-temporal hint gave 34 ms for five rows; the L2 hint was not timed there.
//
// Exactness: every output y[m, j] is one accumulator of 8 lanes, fed chunk by chunk in order of k,
// then reduced in a fixed order, then the scalar tail. That sequence does not depend on M, on R
// or on which block the row fell in, so a row's result is bit for bit the same in a one-row decode
// step and in a nine-row verify step (tests/test_05_cpu_gemm.py checks it). A GEMM library picks a
// different summation order per shape; this kernel never does.
//
// Built by speclab/models/cpu_gemm.py with the host's C++ compiler (-O3 -march=native
// -ffp-contract=off); GCC's and clang's vector extensions compile to AVX2/FMA on x86 and to NEON
// on ARM.

#include <cstddef>
#include <cstring>
#if defined(__FMA__)
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));

// a * b + c. Built with -ffp-contract=off, so the compiler fuses nothing on its own: left to it,
// it fused a multiply-add in some tile shapes and not in others, and a row's bits then depended on
// the number of rows (tests/test_05_cpu_gemm.py caught it). Every fused multiply-add is written.
static inline v8 fma8(v8 a, v8 b, v8 c) {
#if defined(__FMA__)
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;  // no FMA unit (or not x86): the same two roundings in every shape
#endif
}

static inline float fma1(float a, float b, float c) {
#if defined(__FMA__)
    return __builtin_fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

static inline v8 load8(const float* p) {
    v8 v;
    std::memcpy(&v, p, sizeof(v));  // unaligned load
    return v;
}

static inline float reduce8(v8 a) {  // fixed order: (0+4, 1+5, 2+6, 3+7), then pairs, then the two
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

constexpr long PREFETCH_FLOATS = 4096;  // 16 KB ahead (a sweep of 2-16 KB: 8-16 KB were best)

template <int R, int MB>
static void tile(const float* x, long ldx, const float* w, long ldw, float* y, long ldy, long K) {
    v8 acc[R][MB];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) acc[r][m] = v8{0, 0, 0, 0, 0, 0, 0, 0};
    const long K8 = K - K % 8;
    for (long k = 0; k < K8; k += 8) {
        v8 wv[R];
        // this tile's R rows lie one after another (ldw == K for a contiguous W), so R * 8 floats
        // of them are read per step: prefetch that many, far enough ahead to hide the memory
#pragma GCC unroll 8
        for (int q = 0; q < (R + 1) / 2; ++q) __builtin_prefetch(w + R * k + PREFETCH_FLOATS + 16 * q, 0, 2);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[r] = load8(w + r * ldw + k);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
            const v8 xv = load8(x + m * ldx + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) acc[r][m] = fma8(xv, wv[r], acc[r][m]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
            float s = reduce8(acc[r][m]);
            for (long k = K8; k < K; ++k) s = fma1(x[m * ldx + k], w[r * ldw + k], s);
            y[m * ldy + r] = s;
        }
}

typedef void (*tile_fn)(const float*, long, const float*, long, float*, long, long);

// The tiles the driver below uses: R = 6 rows of W with 1 row of x, 4 with up to 2, 3 with up to
// 3, 2 with up to 6, and 1 (the last rows of W) with any block; only these are compiled.
template <int R, int MAXMB>
static tile_fn pick(int mb) {
    if constexpr (MAXMB > 1) {
        if (mb < MAXMB) return pick<R, MAXMB - 1>(mb);
    }
    return tile<R, MAXMB>;
}

static tile_fn pick_rows(int r, int mb) {
    switch (r) {
        case 6: return pick<6, 1>(mb);
        case 4: return pick<4, 2>(mb);
        case 3: return pick<3, 3>(mb);
        case 2: return pick<2, 6>(mb);
        default: return pick<1, 6>(mb);
    }
}

extern "C" {

void speclab_gemm_xwt(const float* x, long ldx, const float* w, long ldw, float* y, long ldy,
                      long M, long N, long K) {
    // Rows of x per block: as even as possible, at most 6 (5 + 4 for M = 9, not 6 + 3).
    const long blocks = (M + 5) / 6;
    const int mb = (int)((M + blocks - 1) / blocks);
    // Rows of W per tile: as many as the 16 registers allow beside the R * mb accumulators.
    const int R = mb == 1 ? 6 : (mb == 2 ? 4 : (mb == 3 ? 3 : 2));
    const long N_main = N - N % R;
    for (long j = 0; j < N; ) {
        const int r = j < N_main ? R : 1;
        for (long m0 = 0; m0 < M; m0 += mb) {
            const int rows = (int)(M - m0 < mb ? M - m0 : mb);
            pick_rows(r, rows)(x + m0 * ldx, ldx, w + j * ldw, ldw, y + m0 * ldy + j, ldy, K);
        }
        j += r;
    }
}

}  // extern "C"
