// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Decode GEMVs (one token): weights [N, K] (HF [out, in]) in bf16 or 4-bit (W4A16), fp32 activations, fp32
// accumulation. One body per op (q/k/v, gate/up, o/down projection); the weight format is a policy (Bf16W, Q4W):
// how a lane loads its part of a row and how it dots it with x. Built for the fixed cost of small, latency-bound
// launches inside one CUDA graph:
//  - x lives in registers: lane l of a warp needs only x[8c .. 8c+7] for its chunks c = l + 32u (u < KV) of a row
//    (16 bytes of bf16 or 4 bytes of 4-bit weights each), so it loads those 8*KV floats once (from L2) and reuses
//    them for every row; no shared memory, no __syncthreads.
//  - the RMSNorm factor is computed per warp (the warp holds all of x when K = 256*KV): no block prologue.
//  - the weights of the warp's first RB rows are loaded into registers BEFORE PDL_WAIT (they do not depend on the
//    previous kernel), so with Programmatic Dependent Launch the HBM latency of the first loads overlaps the tail of
//    the previous kernel; the next batch is loaded before the reductions of this one.
//  - a fixed grid (host: SMs x resident blocks per SM from the occupancy API) and warps that loop over rows: no
//    partial last wave.
//  - split-K for long rows (o / down projections): warp w takes K segment w % S of rows w / S + j*G, partial dot
//    products are added into y with atomics (the residual add is fused).
// 4-bit layout (model/quant.py QuantTensor, as cuda/backend.w4_device_arrays uploads it):
//   Q  uint32 [N, K/8]   nibble k (bits 4k..4k+3) of word j = element 8j+k, unsigned 0..15;
//   SZ uint32 [N, K/128] bits 0..15 = the group's scale (fp16, or bf16 when sbf != 0), bits 16..19 = its zero z;
// w = (q - z) * s. Per word: s * (sum_k (16 + q_k) x_k - (16 + z) sum_k x_k), q and z small integers (3 ops an
// element). With a quarter of the bytes a row, 4-bit warps keep more rows in flight (RB) for the same bytes.
// Kernel names: gemv_{bf16,w4}_{qkv,gateup,proj}_<KV>, KV = chunks a lane holds per K segment (segment = 256*KV
// elements). q/k/v and gate/up take the whole row in one segment (the norm needs all of x), so hidden sizes up to
// 256*8 = 2048 are supported; the backend refuses larger ones at start-up. Twins: ops.rms_norm, ops.linear (+ bias,
// + residual) on the weights (QuantTensor.dequantize() for 4-bit), ops.silu_mul; the q/k/v kernel also writes k/v
// (bf16) into the token's slot of the cache.
#include "common.cuh"

#define GV_THREADS 256
#define GV_WARPS (GV_THREADS / 32)

// rows (gate/up: row pairs) in flight per warp, per format and op; resident blocks an SM the register budget allows
#ifndef GV_RB_W4_QKV
#define GV_RB_W4_QKV 2  // 4 rows of K = 1536 spill at the 128 registers that 2 blocks/SM allow
#endif
#ifndef GV_RB_W4_PAIRS
#define GV_RB_W4_PAIRS 1
#endif
#ifndef GV_RB_W4_PROJ
#define GV_RB_W4_PROJ 4
#endif
#ifndef GV_MINB_BF16_GATEUP
#define GV_MINB_BF16_GATEUP 1  // x + 2 bf16 rows in flight need ~150 registers
#endif

// ---- the weight formats -----------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned ldg_stream32(const unsigned* p) {
    unsigned r;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}

// 16 + nibble k of w, as a float, in two integer ops: the nibble placed at bits 19..22 is the mantissa of a float
// in [16, 32) (ulp 2^-19), so 0x41800000 | (n << 19) = 16 + n exactly.
__device__ __forceinline__ float w4_nib16(unsigned w, int k) {
    const unsigned t = (4 * k <= 19) ? (w << (19 - 4 * k)) : (w >> (4 * k - 19));
    return __uint_as_float(0x41800000u | (t & 0x00780000u));
}

template <int KV>
struct Bf16Frag {
    uint4 w[KV];
};

struct Bf16W {
    const bf16_t* W;
    template <int KV>
    using Frag = Bf16Frag<KV>;
    static constexpr int RB_QKV = 1, RB_PAIRS = 1, RB_PROJ = 1;

    // rows m0.. of this matrix (the up half of gate/up)
    __device__ __forceinline__ Bf16W rows_from(int m0, int K) const { return {W + (size_t)m0 * K}; }

    // lane's chunks of row m from element `off`; zeros past N
    template <int KV>
    __device__ __forceinline__ void load(int K, int off, int m, int N, int lane, Frag<KV>& f) const {
        if (m < N) {
            const uint4* p = (const uint4*)(W + (size_t)m * K + off) + lane;
#pragma unroll
            for (int u = 0; u < KV; ++u) f.w[u] = ldg_stream(p + 32 * u);
        } else {
#pragma unroll
            for (int u = 0; u < KV; ++u) f.w[u] = make_uint4(0, 0, 0, 0);
        }
    }

    template <int KV>
    __device__ __forceinline__ float dot(const Frag<KV>& f, const float (&xr)[KV][8], const float (&)[KV]) const {
        float s = 0.f;
#pragma unroll
        for (int u = 0; u < KV; ++u) s += dot8(f.w[u], xr[u]);
        return s;
    }
};

template <int KV>
struct Q4Frag {
    unsigned w[KV], sz[KV];
};

struct Q4W {
    const unsigned* Q;
    const unsigned* SZ;
    int sbf;
    template <int KV>
    using Frag = Q4Frag<KV>;
    static constexpr int RB_QKV = GV_RB_W4_QKV, RB_PAIRS = GV_RB_W4_PAIRS, RB_PROJ = GV_RB_W4_PROJ;

    __device__ __forceinline__ Q4W rows_from(int m0, int K) const {
        return {Q + (size_t)m0 * (K / 8), SZ + (size_t)m0 * (K / 128), sbf};
    }

    // word off/8 + lane + 32u (u < KV) of row m, and its group's scale|zero word; zeros past N
    template <int KV>
    __device__ __forceinline__ void load(int K, int off, int m, int N, int lane, Frag<KV>& f) const {
        if (m < N) {
            const int wo = off / 8 + lane;
            const unsigned* q = Q + (size_t)m * (K / 8) + wo;
            const unsigned* g = SZ + (size_t)m * (K / 128);
#pragma unroll
            for (int u = 0; u < KV; ++u) {
                f.w[u] = ldg_stream32(q + 32 * u);
                f.sz[u] = __ldg(g + ((wo + 32 * u) >> 4));
            }
        } else {
#pragma unroll
            for (int u = 0; u < KV; ++u) f.w[u] = f.sz[u] = 0u;
        }
    }

    template <int KV>
    __device__ __forceinline__ float dot(const Frag<KV>& f, const float (&xr)[KV][8], const float (&xs)[KV]) const {
        float s = 0.f;
#pragma unroll
        for (int u = 0; u < KV; ++u) {
            // sum (16 + q_k) x_k - (16 + z) sum x_k = sum (q_k - z) x_k; the offset 16 costs ~5x float rounding at
            // most (|16 + q| <= 31 against |q - z| of a few), far inside the GEMV's fp32 error
            float d = 0.f;
#pragma unroll
            for (int k = 0; k < 8; ++k) d = fmaf(w4_nib16(f.w[u], k), xr[u][k], d);
            const float z16 = (float)(16u + ((f.sz[u] >> 16) & 15u));
            s = fmaf(w4_scale(f.sz[u], sbf), fmaf(-z16, xs[u], d), s);
        }
        return s;
    }
};

// ---- x in registers -----------------------------------------------------------------------------------------------
template <int KV>
__device__ __forceinline__ void gv_load_x(const float* __restrict__ x, int lane, float (&xr)[KV][8]) {
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        const float4* p = (const float4*)(x + 8 * (lane + 32 * u));
        const float4 a = __ldg(p), b = __ldg(p + 1);
        xr[u][0] = a.x; xr[u][1] = a.y; xr[u][2] = a.z; xr[u][3] = a.w;
        xr[u][4] = b.x; xr[u][5] = b.y; xr[u][6] = b.z; xr[u][7] = b.w;
    }
}

// per chunk: the sum of its 8 x values (the 4-bit zero-point term; unused by bf16)
template <int KV>
__device__ __forceinline__ void gv_xsum(const float (&xr)[KV][8], float (&xs)[KV]) {
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) t += xr[u][k];
        xs[u] = t;
    }
}

// ---- the three ops ------------------------------------------------------------------------------------------------
// q/k/v (+ input RMSNorm, + bias, k/v stored as bf16 into the token's slot). K = 256*KV (one segment).
template <class F, int KV, int RB>
__device__ __forceinline__ void gemv_qkv_body(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps,
                                              const F W, const float* __restrict__ bias, int K, int NQ, int NKVD,
                                              float* __restrict__ q_out, bf16_t* __restrict__ kc,
                                              bf16_t* __restrict__ vc, const int* __restrict__ order,
                                              const int* __restrict__ params, int q_off, int cap, int D) {
    const int lane = threadIdx.x & 31;
    const int nw = gridDim.x * GV_WARPS;
    const int N = NQ + 2 * NKVD;
    int n = blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
    typename F::template Frag<KV> w[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) W.template load<KV>(K, 0, n + r * nw, N, lane, w[r]);
    // also constant inside the chunk, so read before the wait: the bias (a weight), and the token's slot (the order
    // table and params[0] come from the chunk's input memcpy, which completes before the first stamp kernel, and
    // that one is always launched without PDL)
    float bv[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) bv[r] = (n + r * nw < N) ? __ldg(bias + n + r * nw) : 0.f;
    const int slot = __ldg(order + __ldg(params) + q_off);
    PDL_ENTRY();
    if (n >= N) return;
    float xr[KV][8], xs[KV];
    const float inv = warp_load_x_norm<KV>(x, ln, lane, K, eps, xr);
    gv_xsum<KV>(xr, xs);
    for (; n < N; n += RB * nw) {
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = W.template dot<KV>(w[r], xr, xs) * inv;
        if (n + RB * nw < N) {
#pragma unroll
            for (int r = 0; r < RB; ++r) W.template load<KV>(K, 0, n + RB * nw + r * nw, N, lane, w[r]);
        }
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = warp_sum(acc[r]);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int m = n + r * nw;
                if (m >= N) break;
                const float v = acc[r] + bv[r];
                if (m < NQ) {
                    q_out[m] = v;
                } else {
                    const int mm = (m - NQ) % NKVD, g = mm / D, d = mm % D;
                    bf16_t* dst = (m < NQ + NKVD) ? kc : vc;
                    dst[((size_t)g * cap + slot) * D + d] = f2bf(v);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int m = n + RB * nw + r * nw;
            bv[r] = (m < N) ? __ldg(bias + m) : 0.f;
        }
    }
}

// act[i] = silu(Wg[i] . n(x)) * (Wu[i] . n(x)); W = [gate rows; up rows] ([2I, K]); RB row pairs in flight.
template <class F, int KV, int RB>
__device__ __forceinline__ void gemv_gateup_body(const float* __restrict__ x, const bf16_t* __restrict__ ln,
                                                 float eps, const F W, int K, int I, float* __restrict__ act) {
    const int lane = threadIdx.x & 31;
    const int nw = gridDim.x * GV_WARPS;
    const F Wu = W.rows_from(I, K);
    int i = blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
    typename F::template Frag<KV> wg[RB], wu[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) {
        W.template load<KV>(K, 0, i + r * nw, I, lane, wg[r]);
        Wu.template load<KV>(K, 0, i + r * nw, I, lane, wu[r]);
    }
    PDL_ENTRY();
    if (i >= I) return;
    float xr[KV][8], xs[KV];
    const float inv = warp_load_x_norm<KV>(x, ln, lane, K, eps, xr);
    gv_xsum<KV>(xr, xs);
    for (; i < I; i += RB * nw) {
        float ag[RB], au[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            ag[r] = W.template dot<KV>(wg[r], xr, xs);
            au[r] = Wu.template dot<KV>(wu[r], xr, xs);
        }
        if (i + RB * nw < I) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                W.template load<KV>(K, 0, i + RB * nw + r * nw, I, lane, wg[r]);
                Wu.template load<KV>(K, 0, i + RB * nw + r * nw, I, lane, wu[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            ag[r] = warp_sum(ag[r]) * inv;
            au[r] = warp_sum(au[r]) * inv;
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int m = i + r * nw;
                if (m < I) act[m] = ag[r] / (1.f + __expf(-ag[r])) * au[r];
            }
        }
    }
}

// y[n] += W[n] . a (o / down projection + residual), K split into S = K / (256*KV) segments.
template <class F, int KV, int RB>
__device__ __forceinline__ void gemv_proj_body(const float* __restrict__ a, const F W, int K, int N,
                                               float* __restrict__ y, int S) {
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
    const int G = (gridDim.x * GV_WARPS) / S;  // warps per segment
    const int seg = gw % S, off = seg * 256 * KV;
    int n = gw / S;
    typename F::template Frag<KV> w[RB];
    if (n < G) {
#pragma unroll
        for (int r = 0; r < RB; ++r) W.template load<KV>(K, off, n + r * G, N, lane, w[r]);
    }
    PDL_ENTRY();
    if (n >= G || n >= N) return;
    float xr[KV][8], xs[KV];
    gv_load_x<KV>(a + off, lane, xr);
    gv_xsum<KV>(xr, xs);
    for (; n < N; n += RB * G) {
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = W.template dot<KV>(w[r], xr, xs);
        if (n + RB * G < N) {
#pragma unroll
            for (int r = 0; r < RB; ++r) W.template load<KV>(K, off, n + RB * G + r * G, N, lane, w[r]);
        }
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = warp_sum(acc[r]);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int m = n + r * G;
                if (m >= N) break;
                if (S == 1) y[m] += acc[r];
                else atomicAdd(y + m, acc[r]);
            }
        }
    }
}

// ---- instances: the weight arguments of each format, then the same three bodies -------------------------------------
#define GV_BF16_W const bf16_t* __restrict__ W
#define GV_BF16_REF Bf16W{W}
#define GV_W4_W const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int sbf
#define GV_W4_REF Q4W{Q, SZ, sbf}

#define GV_INSTANCES(FMT, F, MINB_GATEUP, KV)                                                                     \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, 2) gemv_##FMT##_qkv_##KV(                            \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, GV_##F##_W,                        \
        const float* __restrict__ bias, int K, int NQ, int NKVD, float* __restrict__ q_out,                      \
        bf16_t* __restrict__ kc, bf16_t* __restrict__ vc, const int* __restrict__ order,                         \
        const int* __restrict__ params, int q_off, int cap, int D) {                                              \
        gemv_qkv_body<decltype(GV_##F##_REF), KV, decltype(GV_##F##_REF)::RB_QKV>(                                \
            x, ln, eps, GV_##F##_REF, bias, K, NQ, NKVD, q_out, kc, vc, order, params, q_off, cap, D);            \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, MINB_GATEUP) gemv_##FMT##_gateup_##KV(               \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, GV_##F##_W, int K, int I,          \
        float* __restrict__ act) {                                                                                \
        gemv_gateup_body<decltype(GV_##F##_REF), KV, decltype(GV_##F##_REF)::RB_PAIRS>(x, ln, eps, GV_##F##_REF,  \
                                                                                       K, I, act);               \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, 2) gemv_##FMT##_proj_##KV(                           \
        const float* __restrict__ a, GV_##F##_W, int K, int N, float* __restrict__ y, int S) {                    \
        gemv_proj_body<decltype(GV_##F##_REF), KV, decltype(GV_##F##_REF)::RB_PROJ>(a, GV_##F##_REF, K, N, y, S); \
    }

#define GV_FORMATS(KV)                                      \
    GV_INSTANCES(bf16, BF16, GV_MINB_BF16_GATEUP, KV)       \
    GV_INSTANCES(w4, W4, 2, KV)

GV_FORMATS(1)
GV_FORMATS(2)
GV_FORMATS(3)
GV_FORMATS(4)
GV_FORMATS(5)
GV_FORMATS(6)
GV_FORMATS(7)
GV_FORMATS(8)
