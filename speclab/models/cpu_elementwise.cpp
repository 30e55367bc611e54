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
// Built by speclab/models/native.py like cpu_gemm.cpp (-O3 -march=native -ffp-contract=off).
// RMSNorm's and RoPE's loops are plain enough for GCC to vectorise (g++ -fopt-info-vec says so);
// SiLU is written on 8 lanes, since GCC left its scalar loop alone (22 µs a SmolLM2 row, now 6: timeit
// medians of 20,000 calls through ctypes, one thread, 2026-12-03's Zen 3 EPYC, load average about 1).

#include <cmath>
#include <cstdint>
#include <cstring>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 load8(const float* p) {
    v8 v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

static inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof(v)); }

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

static inline v8 silu_mul8(v8 g, v8 u) { return g / (1.0f + exp8(-g)) * u; }

extern "C" {

void speclab_rms_norm(const float* x, long ldx, const float* w, float* out, long rows, long d, float eps) {
    for (long n = 0; n < rows; ++n) {
        const float* xr = x + n * ldx;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const long d8 = d - d % 8;
        for (long i = 0; i < d8; i += 8)
            for (int j = 0; j < 8; ++j) acc[j] += xr[i + j] * xr[i + j];
        float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        for (long i = d8; i < d; ++i) s += xr[i] * xr[i];
        const float inv = 1.0f / std::sqrt(s / (float)d + eps);
        float* o = out + n * d;
        for (long i = 0; i < d; ++i) o[i] = (xr[i] * inv) * w[i];
    }
}

// qkv: (rows, (H + 2 Hkv) Dh) with row stride ldq, q's heads then k's then v's; cos, sin: (rows, Dh);
// slots: (rows,) cache slot of each row; caches: (num_slots, Hkv * Dh) contiguous. Returns 1, having
// written nothing, if a slot lies outside the caches (index_copy_ raised there; a write would corrupt memory).
int speclab_rope_cache(float* qkv, long ldq, const float* cos, const float* sin, const int64_t* slots,
                       float* k_cache, float* v_cache, long num_slots, long rows, long H, long Hkv, long Dh) {
    for (long n = 0; n < rows; ++n)
        if (slots[n] < 0 || slots[n] >= num_slots) return 1;
    const long half = Dh / 2;
    float tmp[512];  // one head (Dh <= 512: llama.py checks)
    for (long n = 0; n < rows; ++n) {
        float* row = qkv + n * ldq;
        const float* c = cos + n * Dh;
        const float* s = sin + n * Dh;
        for (long h = 0; h < H + Hkv; ++h) {
            float* x = row + h * Dh;
            for (long i = 0; i < half; ++i) tmp[i] = x[i] * c[i] + (-x[i + half]) * s[i];
            for (long i = half; i < Dh; ++i) tmp[i] = x[i] * c[i] + x[i - half] * s[i];
            std::memcpy(x, tmp, Dh * sizeof(float));
        }
        std::memcpy(k_cache + slots[n] * Hkv * Dh, row + H * Dh, Hkv * Dh * sizeof(float));
        std::memcpy(v_cache + slots[n] * Hkv * Dh, row + (H + Hkv) * Dh, Hkv * Dh * sizeof(float));
    }
    return 0;
}

// gate_up: (rows, 2 I) with row stride ldg, gate in the first I columns; out: (rows, I).
void speclab_silu_mul(const float* gate_up, long ldg, float* out, long rows, long inter) {
    for (long n = 0; n < rows; ++n) {
        const float* g = gate_up + n * ldg;
        const float* u = g + inter;
        float* o = out + n * inter;
        const long i8 = inter - inter % 8;
        for (long i = 0; i < i8; i += 8) store8(o + i, silu_mul8(load8(g + i), load8(u + i)));
        if (i8 < inter) {  // the tail, through the same 8 lanes (zero-padded), so every element has the same arithmetic
            float gt[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ut[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ot[8];
            std::memcpy(gt, g + i8, (inter - i8) * sizeof(float));
            std::memcpy(ut, u + i8, (inter - i8) * sizeof(float));
            store8(ot, silu_mul8(load8(gt), load8(ut)));
            std::memcpy(o + i8, ot, (inter - i8) * sizeof(float));
        }
    }
}

}  // extern "C"
