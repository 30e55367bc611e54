// Causal attention of a flattened ragged batch, read straight from the paged KV cache: no gather.
//
// The batch holds B requests; request b's new tokens are rows qsl[b] .. qsl[b + 1] of q, and the
// token at position t attends to its request's cache slots 0..t, found through the block table
// (slot s lies in block table[b][s / block_size], at offset s % block_size). A request whose new
// tokens are a tree of drafts (lesson 10) has its nodes in slots base.. of its cache, and a node
// sees the committed slots and its ancestors' only (`attend` says how). The caches are
// (num_blocks, block_size, Hkv, Dh), float32 or bfloat16, contiguous, and already hold this step's
// keys and values. Query head h reads key/value head h / (H / Hkv) (grouped-query attention).
// q and out are float32: a bfloat16 model's caller widens q and rounds out (cpu_attention.py), and a
// bfloat16 key or value is widened to float32 as it is loaded (its 16 bits are a float32's upper
// half, so the widening is exact), so the arithmetic below is the same in both dtypes.
//
// What it replaces: torch's path pads the batch to a rectangle, gathers every request's blocks
// into a (B, Cmax) copy of its keys and values in every layer, and runs one masked SDPA over it.
// For a decode batch of 8 requests over ~200 cached tokens on SmolLM2 that was about a fifth of
// the step (measured 2026-12-02, one thread); here each query reads its own slots in place, skips
// what the causal mask would hide, and the padding does not exist.
//
// Exactness: each (token, head) output is computed alone, in one fixed order: the scores one key
// at a time (an 8-lane dot product over Dh, reduced in a fixed order, times the scale), their
// maximum, exp(score - max) and their sum in key order, then the values summed in key order with
// those weights, then one division. Nothing depends on the other queries in the batch, on the
// batch's shape or on how many tokens a request brings, so a token's attention has the same bits in
// a one-token decode step, in a k + 1 token verify step and in a prefill, alone or in a batch of
// 32 (tests/test_05_cpu_attention.py checks it). torch's kernels pick blockings per shape.
//
// Built by speclab/models/native.py like cpu_gemm.cpp (-O3 -march=native -ffp-contract=off).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__FMA__)
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));

static inline v8 fma8(v8 a, v8 b, v8 c) {  // a * b + c, fused where the CPU has FMA (cpu_gemm.cpp says why it is spelled out)
#if defined(__FMA__)
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

static inline v8 load8(const float* p) {
    v8 v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

static inline v8 load8(const uint16_t* p) {  // 8 bfloat16 widened to float32, exactly
    uint32_t u[8];
    for (int j = 0; j < 8; ++j) u[j] = (uint32_t)p[j] << 16;
    v8 v;
    std::memcpy(&v, u, sizeof(v));
    return v;
}

static inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof(v)); }

static inline float reduce8(v8 a) {  // cpu_gemm.cpp's fixed order: (0+4, 1+5, 2+6, 3+7), then (s0+s2) + (s1+s3)
#if defined(__AVX__)
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)a), _mm256_extractf128_ps((__m256)a, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                  // s0 + s2, s1 + s3
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
#else
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
#endif
}

// exp of 8 floats, for x <= 0 (a score minus the maximum): x = n ln 2 + r with |r| <= ln 2 / 2,
// exp(r) by a degree-6 polynomial (Taylor coefficients; relative error below 2e-7 on that range),
// times 2^n built in the exponent bits. Below -87 the result is 0 (exp's float is below 2^-126 there).
static inline v8 round8(v8 x) {  // to the nearest integer, ties to even
#if defined(__AVX__)
    return (v8)_mm256_round_ps((__m256)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    for (int j = 0; j < 8; ++j) x[j] = std::nearbyint(x[j]);
    return x;
#endif
}

static inline v8 exp8(v8 x) {
    const v8 zero = v8{0, 0, 0, 0, 0, 0, 0, 0};
    const auto tiny = x < zero - 87.0f;      // lanes whose exp is below float's normal range: 0
    x = tiny ? zero - 87.0f : x;
    const v8 n = round8(x * 1.44269504088896341f);
    v8 r = fma8(n, zero - 0.693359375f, x);          // ln 2 in two parts: hi (exact in float), lo
    r = fma8(n, zero + 2.12194440e-4f, r);
    v8 p = zero + 1.0f / 720.0f;
    p = fma8(p, r, zero + 1.0f / 120.0f);
    p = fma8(p, r, zero + 1.0f / 24.0f);
    p = fma8(p, r, zero + 1.0f / 6.0f);
    p = fma8(p, r, zero + 0.5f);
    p = fma8(p, r, zero + 1.0f);
    p = fma8(p, r, zero + 1.0f);
    typedef int v8i __attribute__((vector_size(32)));
    const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;  // 2^n, n in [-126, 0]
    v8 scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return tiny ? zero : p * scale;
}

constexpr long MAX_DH = 128;  // head_dim up to 128, a multiple of 8 (cpu_attention.py checks both)

// R query heads of one token that share a key/value head, over that head's slots 0..n-1 of one
// request: q_r = q + r * q_head (Dh = 8 * CHUNKS floats each), out_r = out + r * Dh. Each key and
// value row is read once for the R heads (grouped-query attention shares them). Every row's
// arithmetic is the same sequence whatever R is: the tiling changes what is read together, not a
// bit of the result. CHUNKS and R are template parameters, so that accumulators stay in registers
// (with a runtime head_dim they spilled to the stack, which was 3x slower).
//
// A token of a tree of drafts (lesson 10) reads slots 0..n-1 of its request, where n is the request's
// length, but sees only the committed ones (before `base`) and those of its ancestors and itself:
// `seen` (n - base flags) says which of the slots from `base` on. An unseen slot's score is -inf,
// so its weight is exactly 0 and adds exactly nothing to the sum or to the values: the output has
// the bits of the same token attending to the seen slots alone (a causal chain of its ancestors).
template <typename T, long CHUNKS, int R>
static void attend(const float* q, long q_head, const T* kc, const T* vc, const long* table,
                   long block_size, long row_stride, long n, float scale, float* scores, long ld_scores,
                   float* out, const uint8_t* seen, long base) {
    float m[R];
    for (int r = 0; r < R; ++r) m[r] = -INFINITY;
    for (long s0 = 0, blk = 0; s0 < n; s0 += block_size, ++blk) {
        const T* k = kc + table[blk] * block_size * row_stride;
        const long end = n - s0 < block_size ? n - s0 : block_size;
        for (long o = 0; o < end; ++o, k += row_stride) {  // R independent chains per key
            v8 a[R];
            for (int r = 0; r < R; ++r) a[r] = v8{0, 0, 0, 0, 0, 0, 0, 0};
            for (long c = 0; c < CHUNKS; ++c) {
                const v8 kv = load8(k + 8 * c);
                for (int r = 0; r < R; ++r) a[r] = fma8(load8(q + r * q_head + 8 * c), kv, a[r]);
            }
            const bool hidden = seen && s0 + o >= base && !seen[s0 + o - base];
            for (int r = 0; r < R; ++r) {
                const float x = hidden ? -INFINITY : reduce8(a[r]) * scale;
                scores[r * ld_scores + s0 + o] = x;
                m[r] = x > m[r] ? x : m[r];
            }
        }
    }
    // the weights exp(score - max), 8 at a time (the tail padded with -inf, whose weight is 0),
    // summed in key order
    const long n8 = (n + 7) / 8 * 8;
    float sum[R];
    for (int r = 0; r < R; ++r) {
        float* sr = scores + r * ld_scores;
        for (long s = n; s < n8; ++s) sr[s] = -INFINITY;
        sum[r] = 0.0f;
        for (long s = 0; s < n8; s += 8) {
            const v8 p = exp8(load8(sr + s) - m[r]);
            store8(sr + s, p);
            for (int j = 0; j < 8; ++j) sum[r] += p[j];
        }
    }
    // the values, in passes over CH chunks of Dh so that the R * CH accumulators fit in registers
    constexpr long CH = (12 / R < CHUNKS) ? 12 / R : CHUNKS;
    for (long c0 = 0; c0 < CHUNKS; c0 += CH) {
        v8 acc[R][CH];
        for (int r = 0; r < R; ++r)
            for (long c = 0; c < CH; ++c) acc[r][c] = v8{0, 0, 0, 0, 0, 0, 0, 0};
        for (long s0 = 0, blk = 0; s0 < n; s0 += block_size, ++blk) {
            const T* v = vc + table[blk] * block_size * row_stride + 8 * c0;
            const long end = n - s0 < block_size ? n - s0 : block_size;
            for (long o = 0; o < end; ++o, v += row_stride) {
                v8 p[R];
                for (int r = 0; r < R; ++r) p[r] = v8{0, 0, 0, 0, 0, 0, 0, 0} + scores[r * ld_scores + s0 + o];
                for (long c = 0; c < CH && c0 + c < CHUNKS; ++c) {
                    const v8 vv = load8(v + 8 * c);
                    for (int r = 0; r < R; ++r) acc[r][c] = fma8(p[r], vv, acc[r][c]);
                }
            }
        }
        for (int r = 0; r < R; ++r) {
            const v8 inv = v8{0, 0, 0, 0, 0, 0, 0, 0} + sum[r];
            for (long c = 0; c < CH && c0 + c < CHUNKS; ++c) store8(out + r * CHUNKS * 8 + 8 * (c0 + c), acc[r][c] / inv);
        }
    }
}

template <typename T>
using attend_t = void (*)(const float*, long, const T*, const T*, const long*, long, long, long, float, float*, long,
                          float*, const uint8_t*, long);

constexpr int MAX_R = 4;  // query heads per tile

template <typename T, long C>
static attend_t<T> pick(long chunks, int r) {  // attend<T, chunks, r> for head_dim 8..MAX_DH, 1..MAX_R heads
    if constexpr (C > 1) {
        if (chunks < C) return pick<T, C - 1>(chunks, r);
    }
    switch (r) {
        case 4: return attend<T, C, 4>;
        case 3: return attend<T, C, 3>;
        case 2: return attend<T, C, 2>;
        default: return attend<T, C, 1>;
    }
}

// q: (N, H, Dh) float32 with row strides (q_tok, q_head); out: (N, H, Dh) float32, contiguous.
// tables: (B, bt_stride) int64 block ids; qsl: (B + 1) int64 query offsets; positions: (N) int64;
// the caches hold num_blocks blocks of T (float, or bfloat16's bits). Returns 0, or 1 when a
// position needs a block its table does not hold (a padding -1, an id past the pool, or past the
// table's width), before anything is read; the caller raises.
// trees: null (every request causal) or (B, 2) int64: (base, length) of request b when its new tokens
// are a tree of drafts, (-1, 0) when they are causal; seen: (N, ld_seen) uint8, token i's flags for
// its request's slots base..length-1 (rows of causal requests are not read).
template <typename T>
static int paged_attention(const float* q, long q_tok, long q_head, const T* k_cache, const T* v_cache,
                           long num_blocks, const long* tables, long bt_stride, const long* qsl,
                           const long* positions, float* out, long B, long H, long Hkv, long Dh, long block_size,
                           float scale, const long* trees, const uint8_t* seen, long ld_seen) {
    const long group = H / Hkv, row_stride = Hkv * Dh;
    // a group's heads in tiles of at most MAX_R, as even as possible (9 heads: 3 + 3 + 3)
    const long tiles = (group + MAX_R - 1) / MAX_R, tile = (group + tiles - 1) / tiles;
    long longest = 1;
    for (long b = 0; b < B; ++b) {
        long n = 0;  // the most slots a token of request b reads
        for (long i = qsl[b]; i < qsl[b + 1]; ++i) n = positions[i] + 1 > n ? positions[i] + 1 : n;
        if (trees && trees[2 * b] >= 0) {
            if (trees[2 * b + 1] - trees[2 * b] > ld_seen) return 1;
            n = trees[2 * b + 1];
        }
        const long blocks = (n + block_size - 1) / block_size;
        if (blocks > bt_stride) return 1;
        for (long j = 0; j < blocks; ++j)
            if (tables[b * bt_stride + j] < 0 || tables[b * bt_stride + j] >= num_blocks) return 1;
        longest = n > longest ? n : longest;
    }
    const long ld_scores = (longest + 7) / 8 * 8;  // (padded to whole vectors)
    std::vector<float> scores(MAX_R * ld_scores);
    for (long b = 0; b < B; ++b) {
        const long* table = tables + b * bt_stride;
        const bool tree = trees && trees[2 * b] >= 0;
        for (long i = qsl[b]; i < qsl[b + 1]; ++i) {
            const long n = tree ? trees[2 * b + 1] : positions[i] + 1;  // a tree's slots, or slots 0..t
            const uint8_t* flags = tree ? seen + i * ld_seen : nullptr;
            for (long h = 0; h < H; h += tile) {
                const long g = h / group, r = (g + 1) * group - h < tile ? (g + 1) * group - h : tile;
                pick<T, MAX_DH / 8>(Dh / 8, (int)r)(q + i * q_tok + h * q_head, q_head, k_cache + g * Dh, v_cache + g * Dh,
                                                  table, block_size, row_stride, n, scale, scores.data(), ld_scores,
                                                  out + (i * H + h) * Dh, flags, tree ? trees[2 * b] : 0);
            }
        }
    }
    return 0;
}

extern "C" {

int speclab_paged_attention(const float* q, long q_tok, long q_head, const float* k_cache, const float* v_cache,
                            long num_blocks, const long* tables, long bt_stride, const long* qsl,
                            const long* positions, float* out, long B, long H, long Hkv, long Dh, long block_size,
                            float scale, const long* trees, const uint8_t* seen, long ld_seen) {
    return paged_attention<float>(q, q_tok, q_head, k_cache, v_cache, num_blocks, tables, bt_stride, qsl, positions,
                                  out, B, H, Hkv, Dh, block_size, scale, trees, seen, ld_seen);
}

// the same with bfloat16 caches (their raw 16-bit patterns)
int speclab_paged_attention_bf16(const float* q, long q_tok, long q_head, const uint16_t* k_cache,
                                 const uint16_t* v_cache, long num_blocks, const long* tables, long bt_stride,
                                 const long* qsl, const long* positions, float* out, long B, long H, long Hkv,
                                 long Dh, long block_size, float scale, const long* trees, const uint8_t* seen,
                                 long ld_seen) {
    return paged_attention<uint16_t>(q, q_tok, q_head, k_cache, v_cache, num_blocks, tables, bt_stride, qsl,
                                     positions, out, B, H, Hkv, Dh, block_size, scale, trees, seen, ld_seen);
}

}  // extern "C"
