// A run of decoder layers in one call: the few-row forward of a decode or verify step without Python
// between its kernels.
//
// A Llama layer on a CPU is speclab's kernels in a fixed sequence: RMSNorm, the fused q/k/v
// projection, RoPE with the cache write, paged attention, the output projection and the residual
// add, then RMSNorm, the fused gate/up projection, SwiGLU, the down projection and the residual add.
// Called from Python, each kernel costs a module call, a few checks, a new tensor and a ctypes call
// around it: about 100 µs a layer, 3-4 ms of a 25 ms SmolLM2 decode step (perf, 2026-12-06, a Zen 4
// EPYC, one thread). This function runs that sequence for layers 0..L-1 with the same kernels,
// called through their own entry points (the addresses of speclab_gemm_xwt, speclab_rms_norm, ...
// in their own libraries, handed in by cpu_decoder.py), so every output has the bits the Python path
// gives: the same functions on the same inputs, in the same order.
//
// x: (M, D) the residual stream, updated in place. layers: L rows of 8 addresses each (input norm
// weight, qkv weight, o weight, post-attention norm weight, gate_up weight, down weight, key cache,
// value cache), the weights (out, in) with contiguous rows, the caches (num_blocks, block_size, Hkv,
// Dh) contiguous. dims: M, D, H, Hkv, Dh, I, num_blocks, block_size, B, the block table's width and
// the tree flags' width. The step's tables (cos, sin, slots, block tables, query offsets, positions,
// trees, seen) are those cpu_elementwise.py and cpu_attention.py document.
//
// T = float, or bfloat16's bits: the kernels' _bf16 entry points, and what cpu_attention.py does
// around its kernel (q widened to float32, the output rounded to bfloat16), and the residual adds
// rounded as torch's bfloat16 add rounds (the float32 sum, to nearest even).
// seconds: null, or 3 doubles to which the time in the projections, in attention and in the rest is
// added (`python -m speclab.bench verify-cost`'s phase profile).
//
// Built by speclab/models/native.py like cpu_gemm.cpp (-O3 -march=native -ffp-contract=off).

#include <cstdint>
#include <cstring>
#include <ctime>
#include <vector>

typedef uint16_t bf16;  // a bfloat16's bits: float32's top 16

template <typename T>
struct Kernels {  // the other libraries' entry points, in the order cpu_decoder.py passes them
    void (*gemm)(const T*, long, const T*, long, T*, long, long, long, long);
    void (*rms_norm)(const T*, long, const T*, T*, long, long, float);
    int (*rope_cache)(T*, long, const T*, const T*, const int64_t*, T*, T*, long, long, long, long, long);
    void (*silu_mul)(const T*, long, T*, long, long);
    int (*attention)(const float*, long, long, const T*, const T*, long, const long*, long, const long*,
                     const long*, float*, long, long, long, long, long, float, const long*, const uint8_t*, long);
};

static inline float to_f32(float v) { return v; }
static inline float to_f32(bf16 h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

template <typename T> static inline T from_f32(float f);
template <> inline float from_f32<float>(float f) { return f; }
template <> inline bf16 from_f32<bf16>(float f) {  // to nearest even, as torch's float -> bfloat16
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return (u & 0x7fffffffu) > 0x7f800000u ? (bf16)0x7fc0 : (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename T>
static void add_to(T* x, const T* t, long n) {  // x += t, as torch's x + t in T
    for (long i = 0; i < n; ++i) x[i] = from_f32<T>(to_f32(x[i]) + to_f32(t[i]));
}

static double clock_now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct Phases {  // adds each phase's time to seconds[0..2] when the caller asked for it
    double* seconds;
    double last;
    explicit Phases(double* s) : seconds(s), last(s ? clock_now() : 0.0) {}
    void lap(int phase) {
        if (!seconds) return;
        const double now = clock_now();
        seconds[phase] += now - last;
        last = now;
    }
};
enum { PROJECTIONS = 0, ATTENTION = 1, REST = 2 };

// Returns 0, 1 when a slot lies outside the caches (cpu_elementwise's rope_cache wrote nothing),
// or 2 when a position needs a block its table does not hold (cpu_attention read nothing).
template <typename T>
static int layers_forward(const void* const* kernels, const int64_t* layers, long L, const long* dims, T* x,
                          const T* cos, const T* sin, const int64_t* slots, const long* tables, const long* qsl,
                          const long* positions, const long* trees, const uint8_t* seen, float eps, float scale,
                          double* seconds) {
    Kernels<T> k;
    std::memcpy(&k, kernels, sizeof(k));
    const long M = dims[0], D = dims[1], H = dims[2], Hkv = dims[3], Dh = dims[4], I = dims[5];
    const long num_blocks = dims[6], block_size = dims[7], B = dims[8], width = dims[9], ld_seen = dims[10];
    const long Q = H * Dh, QKV = (H + 2 * Hkv) * Dh, num_slots = num_blocks * block_size;
    // scratch, kept between calls (cpu_decoder.py hands this call a decode or verify step: at most 16 rows)
    thread_local std::vector<T> buf;  // h (M, D), qkv (M, QKV), attn (M, Q), t (M, D), gate_up (M, 2I), act (M, I)
    buf.resize((size_t)(M * (2 * D + QKV + Q + 3 * I)));
    T *h = buf.data(), *qkv = h + M * D, *attn = qkv + M * QKV, *t = attn + M * Q, *gu = t + M * D;
    T* act = gu + M * 2 * I;
    thread_local std::vector<float> q32, out32;  // attention's float32 q and output (bfloat16: widened, rounded)
    out32.resize((size_t)(M * Q));
    if (sizeof(T) != sizeof(float)) q32.resize((size_t)(M * Q));
    Phases clock(seconds);
    for (long l = 0; l < L; ++l) {
        const int64_t* p = layers + 8 * l;
        const T *norm1 = (const T*)p[0], *w_qkv = (const T*)p[1], *w_o = (const T*)p[2], *norm2 = (const T*)p[3];
        const T *w_gu = (const T*)p[4], *w_down = (const T*)p[5];
        T *k_cache = (T*)p[6], *v_cache = (T*)p[7];
        k.rms_norm(x, D, norm1, h, M, D, eps);
        clock.lap(REST);
        k.gemm(h, D, w_qkv, D, qkv, QKV, M, QKV, D);
        clock.lap(PROJECTIONS);
        if (k.rope_cache(qkv, QKV, cos, sin, slots, k_cache, v_cache, num_slots, M, H, Hkv, Dh)) return 1;
        const float* q = (const float*)qkv;  // float32: q's heads read in place from the qkv rows
        long q_tok = QKV;
        if (sizeof(T) != sizeof(float)) {  // bfloat16: q widened (exactly), as cpu_attention.py does
            for (long m = 0; m < M; ++m)
                for (long j = 0; j < Q; ++j) q32[(size_t)(m * Q + j)] = to_f32(qkv[m * QKV + j]);
            q = q32.data();
            q_tok = Q;
        }
        clock.lap(REST);
        float* out = sizeof(T) == sizeof(float) ? (float*)attn : out32.data();
        if (k.attention(q, q_tok, Dh, k_cache, v_cache, num_blocks, tables, width, qsl, positions, out, B, H, Hkv,
                        Dh, block_size, scale, trees, seen, ld_seen)) return 2;
        clock.lap(ATTENTION);
        if (sizeof(T) != sizeof(float))
            for (long j = 0; j < M * Q; ++j) attn[j] = from_f32<T>(out32[(size_t)j]);
        clock.lap(REST);
        k.gemm(attn, Q, w_o, Q, t, D, M, D, Q);
        clock.lap(PROJECTIONS);
        add_to(x, t, M * D);
        k.rms_norm(x, D, norm2, h, M, D, eps);
        clock.lap(REST);
        k.gemm(h, D, w_gu, D, gu, 2 * I, M, 2 * I, D);
        clock.lap(PROJECTIONS);
        k.silu_mul(gu, 2 * I, act, M, I);
        clock.lap(REST);
        k.gemm(act, I, w_down, I, t, D, M, D, I);
        clock.lap(PROJECTIONS);
        add_to(x, t, M * D);
        clock.lap(REST);
    }
    return 0;
}

extern "C" {

int speclab_decoder_layers(const void* const* kernels, const int64_t* layers, long L, const long* dims, float* x,
                           const float* cos, const float* sin, const int64_t* slots, const long* tables,
                           const long* qsl, const long* positions, const long* trees, const uint8_t* seen,
                           float eps, float scale, double* seconds) {
    return layers_forward(kernels, layers, L, dims, x, cos, sin, slots, tables, qsl, positions, trees, seen, eps,
                          scale, seconds);
}

int speclab_decoder_layers_bf16(const void* const* kernels, const int64_t* layers, long L, const long* dims, bf16* x,
                                const bf16* cos, const bf16* sin, const int64_t* slots, const long* tables,
                                const long* qsl, const long* positions, const long* trees, const uint8_t* seen,
                                float eps, float scale, double* seconds) {
    return layers_forward(kernels, layers, L, dims, x, cos, sin, slots, tables, qsl, positions, trees, seen, eps,
                          scale, seconds);
}

}  // extern "C"
