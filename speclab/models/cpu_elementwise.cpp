// The elementwise work of a decoder layer, one pass each: RMSNorm, RoPE with the cache write, SwiGLU.
//
// Between its four projections a Llama layer does little arithmetic (a few hundred floats per
// token), but torch spends a dozen small ops on it: F.rms_norm alone is a pow, a mean, an add, an
// rsqrt and two multiplies, about 50 µs a call on one thread, for 576 floats. Over SmolLM2's 30
// layers those ops cost more than its attention in a decode step (torch.profiler, 2026-12-03, Zen 3
// EPYC, one thread). Each function below does one of them in one pass over its rows:
//
//   speclab_rms_norm    out = x / sqrt(mean(x^2) + eps) * w                     (each row alone)
//   speclab_rope_cache  rotate q's and k's heads of the fused qkv rows in place, then copy each
//                       row's k and v into its cache slot (what llama.rotate and two index_copy_ did)
//   speclab_silu_mul    out = silu(gate) * up, gate and up the two halves of the fused gate_up rows
//
// Exactness: every output depends on its own row only, computed in one fixed order, so a token's
// values are the same bits in a decode step and in a verify step. RoPE is the same sequence of
// float32 roundings as torch's (x * cos, then the rotated half times sin, then the sum), so it is
// bit for bit torch's; RMSNorm sums the squares in 8 lanes (then a fixed reduction) and takes
// 1 / sqrt, and SiLU's exp is a polynomial (Cephes' expf, within 2 ulp): both agree with torch to
// float32 rounding, not bit for bit (tests/test_05_cpu_elementwise.py).
//
// bfloat16 (the _bf16 entry points): the same loops over bfloat16 rows, widened to float32 as they
// are read, with torch's roundings where torch's bfloat16 ops make them: RMSNorm rounds x * inv,
// then its product with w; RoPE rounds x * cos, the rotated half times sin, then their sum; SwiGLU
// rounds silu(gate), then its product with up (each to nearest even). RoPE is then torch's bits in
// bfloat16 too; RMSNorm and SiLU agree with torch to a bfloat16 rounding of a float32 difference.
// One template per function (T = float or bfloat16), so both dtypes run the same arithmetic; a
// rounding to float is no operation, and the float32 entry points are the arithmetic they were.
//
// Built by speclab/models/native.py like cpu_gemm.cpp (-O3 -march=native -ffp-contract=off).
// RMSNorm's and RoPE's loops are plain enough for GCC to vectorise (g++ -fopt-info-vec says so);
// SiLU is written on 8 lanes, since GCC left its scalar loop alone (22 µs a SmolLM2 row, now 6: timeit
// medians of 20,000 calls through ctypes, one thread, 2026-12-03's Zen 3 EPYC, load average about 1).

#include <cmath>
#include <cstdint>
#include <cstring>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint16_t bf16;  // a bfloat16's bits: float32's top 16

static inline float to_f32(float v) { return v; }
static inline float to_f32(bf16 h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

static inline bf16 bf16_bits(float f) {  // round to nearest even, as torch's float -> bfloat16
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return (u & 0x7fffffffu) > 0x7f800000u ? (bf16)0x7fc0 : (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename T> static inline T from_f32(float f);
template <> inline float from_f32<float>(float f) { return f; }
template <> inline bf16 from_f32<bf16>(float f) { return bf16_bits(f); }

template <typename T> static inline float round_to(float f) { return to_f32(from_f32<T>(f)); }  // T's rounding

static inline v8 load8(const float* p) {
    v8 v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

static inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof(v)); }

static inline v8 load8(const bf16* p) {  // widened: exact
    v8h h;
    std::memcpy(&h, p, sizeof(h));
    return (v8)(__builtin_convertvector(h, v8u) << 16);
}

static inline v8h bf16_bits8(v8 f) {  // bf16_bits on 8 lanes
    const v8u u = (v8u)f;
    const v8u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const v8u nan = (u & 0x7fffffffu) > 0x7f800000u;  // all ones where NaN
    return __builtin_convertvector((rounded & ~nan) | (nan & 0x7fc0u), v8h);
}

static inline void store8(bf16* p, v8 v) {
    const v8h h = bf16_bits8(v);
    std::memcpy(p, &h, sizeof(h));
}

template <typename T> static inline v8 round8(v8 f) { return f; }
template <> inline v8 round8<bf16>(v8 f) { return (v8)(__builtin_convertvector(bf16_bits8(f), v8u) << 16); }

// e^x of 8 floats (Cephes' expf): e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2, a degree-6
// polynomial for e^r, and 2^n built in the exponent bits; x clamped to [-87, 88] (n in [-126, 127]).
static inline v8 exp8(v8 x) {
    const v8 zero = v8{0, 0, 0, 0, 0, 0, 0, 0};
    x = x < zero - 87.0f ? zero - 87.0f : x;
    x = x > zero + 88.0f ? zero + 88.0f : x;
    const v8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23)
    v8 r = x - n * 0.693359375f;                                         // ln 2 in two parts
    r = r - n * -2.12194440e-4f;
    v8 p = zero + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8 scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

template <typename T>
static inline v8 silu_mul8(v8 g, v8 u) { return round8<T>(g / (1.0f + exp8(-g))) * u; }

template <typename T>
static void rms_norm(const T* x, long ldx, const T* w, T* out, long rows, long d, float eps) {
    for (long n = 0; n < rows; ++n) {
        const T* xr = x + n * ldx;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const long d8 = d - d % 8;
        for (long i = 0; i < d8; i += 8)
            for (int j = 0; j < 8; ++j) acc[j] += to_f32(xr[i + j]) * to_f32(xr[i + j]);
        float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        for (long i = d8; i < d; ++i) s += to_f32(xr[i]) * to_f32(xr[i]);
        const float inv = 1.0f / std::sqrt(s / (float)d + eps);
        T* o = out + n * d;
        for (long i = 0; i < d; ++i) o[i] = from_f32<T>(round_to<T>(to_f32(xr[i]) * inv) * to_f32(w[i]));
    }
}

template <typename T>
static int rope_cache(T* qkv, long ldq, const T* cos, const T* sin, const int64_t* slots,
                      T* k_cache, T* v_cache, long num_slots, long rows, long H, long Hkv, long Dh) {
    for (long n = 0; n < rows; ++n)
        if (slots[n] < 0 || slots[n] >= num_slots) return 1;
    const long half = Dh / 2;
    T tmp[512];  // one head (Dh <= 512: llama.py checks)
    for (long n = 0; n < rows; ++n) {
        T* row = qkv + n * ldq;
        const T* c = cos + n * Dh;
        const T* s = sin + n * Dh;
        for (long h = 0; h < H + Hkv; ++h) {
            T* x = row + h * Dh;
            for (long i = 0; i < half; ++i)
                tmp[i] = from_f32<T>(round_to<T>(to_f32(x[i]) * to_f32(c[i])) +
                                     round_to<T>((-to_f32(x[i + half])) * to_f32(s[i])));
            for (long i = half; i < Dh; ++i)
                tmp[i] = from_f32<T>(round_to<T>(to_f32(x[i]) * to_f32(c[i])) +
                                     round_to<T>(to_f32(x[i - half]) * to_f32(s[i])));
            std::memcpy(x, tmp, Dh * sizeof(T));
        }
        std::memcpy(k_cache + slots[n] * Hkv * Dh, row + H * Dh, Hkv * Dh * sizeof(T));
        std::memcpy(v_cache + slots[n] * Hkv * Dh, row + (H + Hkv) * Dh, Hkv * Dh * sizeof(T));
    }
    return 0;
}

template <typename T>
static void silu_mul(const T* gate_up, long ldg, T* out, long rows, long inter) {
    for (long n = 0; n < rows; ++n) {
        const T* g = gate_up + n * ldg;
        const T* u = g + inter;
        T* o = out + n * inter;
        const long i8 = inter - inter % 8;
        for (long i = 0; i < i8; i += 8) store8(o + i, silu_mul8<T>(load8(g + i), load8(u + i)));
        if (i8 < inter) {  // the tail, through the same 8 lanes (zero-padded), so every element has the same arithmetic
            T gt[8] = {}, ut[8] = {}, ot[8];
            std::memcpy(gt, g + i8, (inter - i8) * sizeof(T));
            std::memcpy(ut, u + i8, (inter - i8) * sizeof(T));
            store8(ot, silu_mul8<T>(load8(gt), load8(ut)));
            std::memcpy(o + i8, ot, (inter - i8) * sizeof(T));
        }
    }
}

extern "C" {

// x: (rows, d) with row stride ldx; w: (d,); out: (rows, d) contiguous.
void speclab_rms_norm(const float* x, long ldx, const float* w, float* out, long rows, long d, float eps) {
    rms_norm(x, ldx, w, out, rows, d, eps);
}
void speclab_rms_norm_bf16(const bf16* x, long ldx, const bf16* w, bf16* out, long rows, long d, float eps) {
    rms_norm(x, ldx, w, out, rows, d, eps);
}

// qkv: (rows, (H + 2 Hkv) Dh) with row stride ldq, q's heads then k's then v's; cos, sin: (rows, Dh);
// slots: (rows,) cache slot of each row; caches: (num_slots, Hkv * Dh) contiguous. Returns 1, having
// written nothing, if a slot lies outside the caches (index_copy_ raised there; a write would corrupt memory).
int speclab_rope_cache(float* qkv, long ldq, const float* cos, const float* sin, const int64_t* slots,
                       float* k_cache, float* v_cache, long num_slots, long rows, long H, long Hkv, long Dh) {
    return rope_cache(qkv, ldq, cos, sin, slots, k_cache, v_cache, num_slots, rows, H, Hkv, Dh);
}
int speclab_rope_cache_bf16(bf16* qkv, long ldq, const bf16* cos, const bf16* sin, const int64_t* slots,
                            bf16* k_cache, bf16* v_cache, long num_slots, long rows, long H, long Hkv, long Dh) {
    return rope_cache(qkv, ldq, cos, sin, slots, k_cache, v_cache, num_slots, rows, H, Hkv, Dh);
}

// gate_up: (rows, 2 I) with row stride ldg, gate in the first I columns; out: (rows, I).
void speclab_silu_mul(const float* gate_up, long ldg, float* out, long rows, long inter) {
    silu_mul(gate_up, ldg, out, rows, inter);
}
void speclab_silu_mul_bf16(const bf16* gate_up, long ldg, bf16* out, long rows, long inter) {
    silu_mul(gate_up, ldg, out, rows, inter);
}

}  // extern "C"
