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
// then reduced in a fixed order (a halving tree, in registers), then the scalar tail. That sequence
// does not depend on M, on R or on which block the row fell in, so a row's result is bit for bit
// the same in a one-row decode step and in a nine-row verify step (tests/test_05_cpu_gemm.py checks
// it). A GEMM library picks a different summation order per shape; this kernel never does.
//
// bfloat16 (speclab_gemm_xwt_bf16): the same product over half the bytes, y rounded to bfloat16 as
// torch rounds (nearest even), on the best of three paths. With AMX (Intel from Sapphire Rapids on)
// the product is turned around so W streams through the tiles, and 16 rows of x cost what one does
// (xwt_amx below). Where the CPU has AVX512-BF16 (Zen 4, Intel from Cooper Lake on),
// each step multiplies 32 bfloat16 pairs of x and W into 16 float32 sums (vdpbf16ps) with up to 8
// rows of x per block, 32 vector registers holding the R * MB sums; elsewhere (AVX2, NEON) each
// weight chunk is widened to float32 (a shift: bfloat16 is float32's top half) and takes the
// float32 tile above, x widened once per call (speclab_gemm_xwt_bf16_widened, compiled everywhere
// so a machine with AVX512-BF16 can test all three). On each path a row's sums run in one fixed
// order whatever M is, and for the 1-16 rows of a decode or verify step the path depends on the
// CPU and W's shape only, never on M (more rows than AMX's tile of x holds, 16, take AVX512-BF16;
// PackedLinear hands those to the GEMM library anyway); the paths differ from each other (and from
// oneDNN) in rounding.
//
// The reduction is not free: a 576-long row is 18 steps of the loop, and each of the M * N sums
// then needs its lanes added. Done through memory (the vector stored, its lanes read back as
// scalars), that tail cost more than the arithmetic: on 2026-12-04's Zen 4 EPYC (AVX512-BF16, one
// thread, load average 0.4-0.8, 7 calls, medians, a standalone C++ harness over SmolLM2's 211
// unfused products of a forward) bfloat16 on AVX512-BF16 took 15.6 / 21.1 / 47.3 ms for 1 / 5 / 9
// rows; with the same tree in registers 14.0 / 12.8 / 16.8 ms, the same bits. With AVX-512's 32
// registers the float32 tiles grow (below): 7-9 rows 45-54 -> 29-34 ms, 1-6 rows unchanged within
// the noise.
//
// Built by speclab/models/cpu_gemm.py with the host's C++ compiler (-O3 -march=native
// -ffp-contract=off); GCC's and clang's vector extensions compile to AVX2/FMA on x86 and to NEON
// on ARM.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX__) || defined(__FMA__) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint16_t bf16;  // a bfloat16's bits: float32's top 16

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

static inline v8 load8(const bf16* p) {  // 8 bfloat16 widened to float32: exact
    u16x8 h;
    std::memcpy(&h, p, sizeof(h));
    return (v8)(__builtin_convertvector(h, u32x8) << 16);
}

static inline float to_f32(float v) { return v; }
static inline float to_f32(bf16 h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

static inline void store(float* y, float s) { *y = s; }
static inline void store(bf16* y, float s) {  // round to nearest even, as torch's float -> bfloat16
    uint32_t u;
    std::memcpy(&u, &s, sizeof(u));
    *y = (u & 0x7fffffffu) > 0x7f800000u ? (bf16)0x7fc0 : (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float reduce8(v8 a) {  // fixed order: (0+4, 1+5, 2+6, 3+7), then pairs, then the two
#if defined(__AVX__)
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)a), _mm256_extractf128_ps((__m256)a, 1));
    const __m128 p = _mm_add_ps(s, _mm_movehl_ps(s, s));       // s0 + s2, s1 + s3
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));  // (s0 + s2) + (s1 + s3)
#else
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
#endif
}

constexpr long PREFETCH_BYTES = 16384;  // 16 KB ahead (a sweep of 2-16 KB: 8-16 KB were best, float32)
constexpr long LINE = 64;

// One tile: R rows of W (element type WT: float, or bfloat16 widened as it is loaded) against MB
// rows of float32 x, the R * MB results written as OT (float, or bfloat16 rounded).
template <typename WT, typename OT, int R, int MB>
static void tile(const float* x, long ldx, const WT* w, long ldw, OT* y, long ldy, long K) {
    constexpr long AHEAD = PREFETCH_BYTES / sizeof(WT), STEP_LINES = (R * 8 * sizeof(WT) + LINE - 1) / LINE;
    v8 acc[R][MB];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) acc[r][m] = v8{0, 0, 0, 0, 0, 0, 0, 0};
    const long K8 = K - K % 8;
    for (long k = 0; k < K8; k += 8) {
        v8 wv[R];
        // this tile's R rows lie one after another (ldw == K for a contiguous W), so R * 8 weights
        // of them are read per step: prefetch that many, far enough ahead to hide the memory
#pragma GCC unroll 8
        for (long q = 0; q < STEP_LINES; ++q) __builtin_prefetch(w + R * k + AHEAD + q * (LINE / (long)sizeof(WT)), 0, 2);
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
            for (long k = K8; k < K; ++k) s = fma1(x[m * ldx + k], to_f32(w[r * ldw + k]), s);
            store(y + m * ldy + r, s);
        }
}

template <typename WT, typename OT>
using tile_fn = void (*)(const float*, long, const WT*, long, OT*, long, long);

// The tiles the driver below uses. With 16 vector registers (AVX2, NEON): R = 6 rows of W with 1
// row of x, 4 with up to 2, 3 with up to 3, 2 with up to 6, and 1 (the last rows of W) with any
// block, at most 6 rows of x a block. With AVX-512's 32 (the same 8-lane code, more registers to
// hold sums): R = 8 with up to 2, 6 with 3, 5 with 4, 4 with up to 6, 3 with up to 9, 1 with any.
// Only these are compiled. A tile's shape changes no row's order of summation, so not its bits.
template <typename WT, typename OT, int R, int MAXMB>
static tile_fn<WT, OT> pick(int mb) {
    if constexpr (MAXMB > 1) {
        if (mb < MAXMB) return pick<WT, OT, R, MAXMB - 1>(mb);
    }
    return tile<WT, OT, R, MAXMB>;
}

#if defined(__AVX512F__)
constexpr int MAX_MB = 9;
static int rows_of_w(int mb) { return mb <= 2 ? 8 : (mb == 3 ? 6 : (mb == 4 ? 5 : (mb <= 6 ? 4 : 3))); }

template <typename WT, typename OT>
static tile_fn<WT, OT> pick_rows(int r, int mb) {
    switch (r) {
        case 8: return pick<WT, OT, 8, 2>(mb);
        case 6: return pick<WT, OT, 6, 3>(mb);
        case 5: return pick<WT, OT, 5, 4>(mb);
        case 4: return pick<WT, OT, 4, 6>(mb);
        case 3: return pick<WT, OT, 3, 9>(mb);
        default: return pick<WT, OT, 1, 9>(mb);
    }
}
#else
constexpr int MAX_MB = 6;
static int rows_of_w(int mb) { return mb == 1 ? 6 : (mb == 2 ? 4 : (mb == 3 ? 3 : 2)); }

template <typename WT, typename OT>
static tile_fn<WT, OT> pick_rows(int r, int mb) {
    switch (r) {
        case 6: return pick<WT, OT, 6, 1>(mb);
        case 4: return pick<WT, OT, 4, 2>(mb);
        case 3: return pick<WT, OT, 3, 3>(mb);
        case 2: return pick<WT, OT, 2, 6>(mb);
        default: return pick<WT, OT, 1, 6>(mb);
    }
}
#endif

template <typename WT, typename OT>
static void xwt(const float* x, long ldx, const WT* w, long ldw, OT* y, long ldy, long M, long N, long K) {
    if (M <= 0 || N <= 0) return;  // nothing to write (and no blocks: the division below needs one)
    // Rows of x per block: as even as possible, at most MAX_MB (AVX2: 5 + 4 for M = 9, not 6 + 3).
    const long blocks = (M + MAX_MB - 1) / MAX_MB;
    const int mb = (int)((M + blocks - 1) / blocks);
    // Rows of W per tile: as many as the vector registers allow beside the R * mb accumulators.
    const int R = rows_of_w(mb);
    const long N_main = N - N % R;
    for (long j = 0; j < N; ) {
        const int r = j < N_main ? R : 1;
        for (long m0 = 0; m0 < M; m0 += mb) {
            const int rows = (int)(M - m0 < mb ? M - m0 : mb);
            pick_rows<WT, OT>(r, rows)(x + m0 * ldx, ldx, w + j * ldw, ldw, y + m0 * ldy + j, ldy, K);
        }
        j += r;
    }
}

#if defined(__AVX512BF16__)
// bfloat16 with AVX512-BF16: each step takes 32 weights of each of R rows (one cache line) and
// multiplies them with 32 bfloat16 of each of MB rows of x into 16 float32 sums (vdpbf16ps adds
// each pair's two products to one lane). The sums of y[m, j] run over k in order, then one fixed
// reduction, then the scalar tail: the same whatever M, R or the block.
static inline float reduce16(__m512 a) {  // the same tree as reduce8(lo + hi), in registers
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));  // s_i = h_i + h_(i+4)
    const __m128 p = _mm_add_ps(s, _mm_movehl_ps(s, s));                                  // s0 + s2, s1 + s3
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));                             // (s0 + s2) + (s1 + s3)
}

template <int R, int MB>
static void tile_dp(const bf16* x, long ldx, const bf16* w, long ldw, bf16* y, long ldy, long K) {
    constexpr long AHEAD = PREFETCH_BYTES / sizeof(bf16);
    __m512 acc[R][MB];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) acc[r][m] = _mm512_setzero_ps();
    const long K32 = K - K % 32;
    for (long k = 0; k < K32; k += 32) {
        __m512bh wv[R];
#pragma GCC unroll 8
        for (int q = 0; q < R; ++q) __builtin_prefetch(w + R * k + AHEAD + q * 32, 0, 2);  // R lines a step
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(w + r * ldw + k);
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * ldx + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], xv, wv[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
            float s = reduce16(acc[r][m]);
            for (long k = K32; k < K; ++k) s = fma1(to_f32(x[m * ldx + k]), to_f32(w[r * ldw + k]), s);
            store(y + m * ldy + r, s);
        }
}

typedef void (*tile_dp_fn)(const bf16*, long, const bf16*, long, bf16*, long, long);

template <int R, int MAXMB>
static tile_dp_fn pick_dp(int mb) {
    if constexpr (MAXMB > 1) {
        if (mb < MAXMB) return pick_dp<R, MAXMB - 1>(mb);
    }
    return tile_dp<R, MAXMB>;
}

// Up to 8 rows of x per block; R rows of W as the 32 registers allow beside R * mb sums.
static int rows_of_w_dp(int mb) { return mb <= 2 ? 8 : (mb == 3 ? 6 : (mb == 4 ? 5 : (mb <= 6 ? 4 : 3))); }

static tile_dp_fn pick_rows_dp(int r, int mb) {
    switch (r) {
        case 8: return pick_dp<8, 2>(mb);
        case 6: return pick_dp<6, 3>(mb);
        case 5: return pick_dp<5, 4>(mb);
        case 4: return pick_dp<4, 6>(mb);
        case 3: return pick_dp<3, 8>(mb);
        default: return pick_dp<1, 8>(mb);
    }
}
#endif


#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
// bfloat16 with AMX (Intel from Sapphire Rapids on): the product turned around, y^T = W x^T, so the
// weight is the tile that streams. A tile of W is 16 of its rows by 32 of k (64 bytes a row), loaded
// straight from the (N, K) weight with its row stride; x^T is packed once per call into AMX's pair
// layout (k/2, M, 2), one tile per 32 of k; each tdpbf16ps adds 16 x M sums of 32 products, four
// tiles of W (64 rows) against one tile of x per step. The arithmetic of 16 rows of x costs what
// one row's does, so the read of W sets the time for any M up to 16. Each y[m, j] is one float32
// sum fed 32 products at a time in order of k, whatever M is (tests/test_05_cpu_gemm.py checks
// the bits); a W whose rows or K are not multiples of 16 and 32 takes the AVX512-BF16 tiles, and
// so does a machine whose kernel does not grant the tiles' state (arch_prctl).
#include <sys/syscall.h>
#include <unistd.h>

static bool amx_granted() {  // Linux hands out the tiles' 8 KB of state only on request
    static const int granted = [] {
        constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : 0;
    }();
    return granted;
}

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};  // bytes per row of tiles 0..15
    uint8_t rows[16] = {};
};

// tmm0-3: sums for 4 groups of 16 rows of W (16 x M float32); tmm4: x^T (16 pairs x M); tmm5-7: W.
static void amx_configure(long M) {
    TileConfig c;
    for (int t = 0; t < 4; ++t) { c.rows[t] = 16; c.colsb[t] = (uint16_t)(4 * M); }
    c.rows[4] = 16; c.colsb[4] = (uint16_t)(4 * M);
    for (int t = 5; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

static void amx_store(const float* c, long M, bf16* y, long ldy) {  // c: 16 x M, row n, column m
    for (int n = 0; n < 16; ++n)
        for (long m = 0; m < M; ++m) store(y + m * ldy + n, c[n * M + m]);
}

static bool xwt_amx(const bf16* x, long ldx, const bf16* w, long ldw, bf16* y, long ldy, long M, long N, long K) {
    if (M <= 0 || N <= 0) return true;  // nothing to write (a tile of 0 columns is no valid configuration)
    if (M > 16 || N % 16 || K % 32 || !amx_granted()) return false;
    thread_local std::vector<uint32_t> xp;  // x^T in pairs: xp[(k / 2) * M + m] = x[m, k], x[m, k + 1]
    xp.resize((size_t)(K / 2 * M));
    for (long m = 0; m < M; ++m)
        for (long k2 = 0; k2 < K / 2; ++k2) {
            uint32_t pair;
            std::memcpy(&pair, x + m * ldx + 2 * k2, sizeof(pair));
            xp[(size_t)(k2 * M + m)] = pair;
        }
    amx_configure(M);
    alignas(64) float c[4][16 * 16];
    const long wstride = ldw * (long)sizeof(bf16), xstride = 4 * M, N64 = N - N % 64;
    for (long j = 0; j < N; ) {
        const int groups = j < N64 ? 4 : 1;
        const bf16* wj = w + j * ldw;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (long k = 0; k < K; k += 32) {
            // each step reads a line of each of the 16 * groups rows, 16 * groups streams, which the
            // hardware prefetcher follows poorly: prefetch the next block of rows instead, as many lines
            // a step, so it is in L2 when its turn comes (1 row 18.3 -> 17.2 ms over SmolLM2's
            // products with the LM head, 5 rows 19.2 -> 18.3; the same distance ahead in this block's
            // order, as the tiles above do, gained nothing over no prefetch: 2026-12-04's Xeon, 7 rounds)
            for (int q = 0; q < 16 * groups; ++q) __builtin_prefetch(wj + 16 * groups * (ldw + k) + q * 32, 0, 2);
            _tile_loadd(4, xp.data() + (k / 2) * M, xstride);
            _tile_loadd(5, wj + k, wstride);
            _tile_dpbf16ps(0, 5, 4);
            if (groups == 4) {
                _tile_loadd(6, wj + 16 * ldw + k, wstride);
                _tile_dpbf16ps(1, 6, 4);
                _tile_loadd(7, wj + 32 * ldw + k, wstride);
                _tile_dpbf16ps(2, 7, 4);
                _tile_loadd(5, wj + 48 * ldw + k, wstride);
                _tile_dpbf16ps(3, 5, 4);
            }
        }
        _tile_stored(0, c[0], 4 * M);
        if (groups == 4) { _tile_stored(1, c[1], 4 * M); _tile_stored(2, c[2], 4 * M); _tile_stored(3, c[3], 4 * M); }
        for (int g = 0; g < groups; ++g) amx_store(c[g], M, y + j + 16 * g, ldy);
        j += 16 * groups;
    }
    _tile_release();
    return true;
}
#else
static bool xwt_amx(const bf16*, long, const bf16*, long, bf16*, long, long, long, long) { return false; }
#endif

extern "C" {

void speclab_gemm_xwt(const float* x, long ldx, const float* w, long ldw, float* y, long ldy,
                      long M, long N, long K) {
    xwt<float, float>(x, ldx, w, ldw, y, ldy, M, N, K);
}

// bfloat16 x and W, bfloat16 y, without AVX512-BF16's instruction: x widened once into float32
// (M * K floats), W widened chunk by chunk inside the float32 tiles.
void speclab_gemm_xwt_bf16_widened(const bf16* x, long ldx, const bf16* w, long ldw, bf16* y, long ldy,
                                   long M, long N, long K) {
    thread_local std::vector<float> xf;
    xf.resize((size_t)(M * K));
    for (long m = 0; m < M; ++m)
        for (long k = 0; k < K; ++k) xf[(size_t)(m * K + k)] = to_f32(x[m * ldx + k]);
    xwt<bf16, bf16>(xf.data(), K, w, ldw, y, ldy, M, N, K);
}

// bfloat16 with AVX512-BF16's vector instruction, not AMX (for tests, on a CPU that has both).
void speclab_gemm_xwt_bf16_dot(const bf16* x, long ldx, const bf16* w, long ldw, bf16* y, long ldy,
                               long M, long N, long K) {
#if defined(__AVX512BF16__)
    if (M <= 0 || N <= 0) return;
    const long blocks = (M + 7) / 8;
    const int mb = (int)((M + blocks - 1) / blocks);
    const int R = rows_of_w_dp(mb);
    const long N_main = N - N % R;
    for (long j = 0; j < N; ) {
        const int r = j < N_main ? R : 1;
        for (long m0 = 0; m0 < M; m0 += mb) {
            const int rows = (int)(M - m0 < mb ? M - m0 : mb);
            pick_rows_dp(r, rows)(x + m0 * ldx, ldx, w + j * ldw, ldw, y + m0 * ldy + j, ldy, K);
        }
        j += r;
    }
#else
    speclab_gemm_xwt_bf16_widened(x, ldx, w, ldw, y, ldy, M, N, K);
#endif
}

// Which bfloat16 path speclab_gemm_xwt_bf16 takes for an (M, K) x and (N, K) W here: 2 AMX, 1
// AVX512-BF16, 0 widened to float32.
int speclab_gemm_bf16_path(long M, long N, long K) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
    if (M <= 16 && N % 16 == 0 && K % 32 == 0 && amx_granted()) return 2;
#endif
    (void)M; (void)N; (void)K;
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

void speclab_gemm_xwt_bf16(const bf16* x, long ldx, const bf16* w, long ldw, bf16* y, long ldy,
                           long M, long N, long K) {
    if (!xwt_amx(x, ldx, w, ldw, y, ldy, M, N, K)) speclab_gemm_xwt_bf16_dot(x, ldx, w, ldw, y, ldy, M, N, K);
}

}  // extern "C"
