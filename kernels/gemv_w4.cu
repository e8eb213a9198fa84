// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Decode GEMVs (one token) on 4-bit weights (W4A16): the weight W [N, K] (HF [out, in]) is stored as
//   Q  uint32 [N, K/8]   nibble k (bits 4k..4k+3) of word j = element 8j+k, unsigned 0..15;
//   SZ uint32 [N, K/128] bits 0..15 = the group's scale (fp16, or bf16 when sbf != 0), bits 16..19 = its zero z;
// w = (q - z) * s. Activations, accumulation and outputs are fp32, as in gemv.cu, whose structure this follows
// (x in registers, per-warp RMSNorm, the first rows' weights loaded before PDL_WAIT, fixed grids, split-K with
// atomics for long rows). Lane l of a warp reads word c = l + 32u (u < KV) of a row: 4-byte coalesced loads,
// 8 elements each, so a segment is 256*KV elements as in gemv.cu; RB rows (gate/up: row pairs) are in flight per
// warp to keep as many bytes in flight as the bf16 kernels with a quarter of the bytes per row.
// Per word: s * (sum_k (16 + q_k) x_k - (16 + z) sum_k x_k), q and z small integers (3 ops an element).
// Kernel names: w4_{qkv,gateup,proj}_<KV>. Twins: ops.rms_norm, ops.linear on QuantTensor.dequantize()
// (+ bias, + residual), ops.silu_mul; the q/k/v kernel also writes k/v (bf16) into the token's slot.
#include "common.cuh"

#define W4_THREADS 256
#define W4_WARPS (W4_THREADS / 32)

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

// word `wo + lane + 32u` (u < KV) of row m, and its group's scale/zero word; zeros past N
template <int KV>
__device__ __forceinline__ void w4_load_row(const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int KW,
                                            int KG, int m, int N, int wo, int lane, unsigned (&w)[KV],
                                            unsigned (&sz)[KV]) {
    if (m < N) {
        const unsigned* q = Q + (size_t)m * KW + wo + lane;
        const unsigned* g = SZ + (size_t)m * KG;
#pragma unroll
        for (int u = 0; u < KV; ++u) {
            w[u] = ldg_stream32(q + 32 * u);
            sz[u] = __ldg(g + ((wo + lane + 32 * u) >> 4));
        }
    } else {
#pragma unroll
        for (int u = 0; u < KV; ++u) w[u] = sz[u] = 0u;
    }
}

template <int KV>
__device__ __forceinline__ float w4_dot(const unsigned (&w)[KV], const unsigned (&sz)[KV], const float (&xr)[KV][8],
                                        const float (&xs)[KV], int sbf) {
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        // sum (16 + q_k) x_k - (16 + z) sum x_k = sum (q_k - z) x_k; the offset 16 costs ~5x float rounding at
        // most (|16 + q| <= 31 against |q - z| of a few), far inside the GEMV's fp32 error
        float d = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) d = fmaf(w4_nib16(w[u], k), xr[u][k], d);
        const float z16 = (float)(16u + ((sz[u] >> 16) & 15u));
        s = fmaf(w4_scale(sz[u], sbf), fmaf(-z16, xs[u], d), s);
    }
    return s;
}

template <int KV>
__device__ __forceinline__ void w4_xsum(const float (&xr)[KV][8], float (&xs)[KV]) {
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) t += xr[u][k];
        xs[u] = t;
    }
}

// q/k/v (+ input RMSNorm, + bias, k/v stored as bf16 into the token's slot). K = 256*KV (one segment).
template <int KV, int RB>
__device__ __forceinline__ void w4_qkv_body(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps,
                                            const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int sbf,
                                            const float* __restrict__ bias, int K, int NQ, int NKVD,
                                            float* __restrict__ q_out, bf16_t* __restrict__ kc,
                                            bf16_t* __restrict__ vc, const int* __restrict__ order,
                                            const int* __restrict__ params, int q_off, int cap, int D) {
    const int lane = threadIdx.x & 31;
    const int nw = gridDim.x * W4_WARPS;
    const int N = NQ + 2 * NKVD, KW = K / 8, KG = K / 128;
    int n = blockIdx.x * W4_WARPS + (threadIdx.x >> 5);
    unsigned w[RB][KV], sz[RB][KV];
#pragma unroll
    for (int r = 0; r < RB; ++r) w4_load_row<KV>(Q, SZ, KW, KG, n + r * nw, N, 0, lane, w[r], sz[r]);
    // the token's slot: the order table and params[0] come from the chunk's input copy, complete before the first
    // stamp kernel, which is launched without PDL
    const int slot = __ldg(order + __ldg(params) + q_off);
    PDL_ENTRY();
    if (n >= N) return;
    float xr[KV][8], xs[KV];
    const float inv = warp_load_x_norm<KV>(x, ln, lane, K, eps, xr);
    w4_xsum<KV>(xr, xs);
    for (; n < N; n += RB * nw) {
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = w4_dot<KV>(w[r], sz[r], xr, xs, sbf) * inv;
        if (n + RB * nw < N) {
#pragma unroll
            for (int r = 0; r < RB; ++r)
                w4_load_row<KV>(Q, SZ, KW, KG, n + RB * nw + r * nw, N, 0, lane, w[r], sz[r]);
        }
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = warp_sum(acc[r]);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int m = n + r * nw;
                if (m >= N) break;
                const float v = acc[r] + __ldg(bias + m);
                if (m < NQ) {
                    q_out[m] = v;
                } else {
                    const int mm = (m - NQ) % NKVD, g = mm / D, d = mm % D;
                    bf16_t* dst = (m < NQ + NKVD) ? kc : vc;
                    dst[((size_t)g * cap + slot) * D + d] = f2bf(v);
                }
            }
        }
    }
}

// act[i] = silu(Wg[i] . n(x)) * (Wu[i] . n(x)); Wg, Wu separate [I, K] weights; RB row pairs in flight.
template <int KV, int RB>
__device__ __forceinline__ void w4_gateup_body(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps,
                                               const unsigned* __restrict__ Qg, const unsigned* __restrict__ SZg,
                                               const unsigned* __restrict__ Qu, const unsigned* __restrict__ SZu,
                                               int sbf, int K, int I, float* __restrict__ act) {
    const int lane = threadIdx.x & 31;
    const int nw = gridDim.x * W4_WARPS;
    const int KW = K / 8, KG = K / 128;
    int i = blockIdx.x * W4_WARPS + (threadIdx.x >> 5);
    unsigned wg[RB][KV], sg[RB][KV], wu[RB][KV], su[RB][KV];
#pragma unroll
    for (int r = 0; r < RB; ++r) {
        w4_load_row<KV>(Qg, SZg, KW, KG, i + r * nw, I, 0, lane, wg[r], sg[r]);
        w4_load_row<KV>(Qu, SZu, KW, KG, i + r * nw, I, 0, lane, wu[r], su[r]);
    }
    PDL_ENTRY();
    if (i >= I) return;
    float xr[KV][8], xs[KV];
    const float inv = warp_load_x_norm<KV>(x, ln, lane, K, eps, xr);
    w4_xsum<KV>(xr, xs);
    for (; i < I; i += RB * nw) {
        float ag[RB], au[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            ag[r] = w4_dot<KV>(wg[r], sg[r], xr, xs, sbf);
            au[r] = w4_dot<KV>(wu[r], su[r], xr, xs, sbf);
        }
        if (i + RB * nw < I) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                w4_load_row<KV>(Qg, SZg, KW, KG, i + RB * nw + r * nw, I, 0, lane, wg[r], sg[r]);
                w4_load_row<KV>(Qu, SZu, KW, KG, i + RB * nw + r * nw, I, 0, lane, wu[r], su[r]);
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
template <int KV, int RB>
__device__ __forceinline__ void w4_proj_body(const float* __restrict__ a, const unsigned* __restrict__ Q,
                                             const unsigned* __restrict__ SZ, int sbf, int K, int N,
                                             float* __restrict__ y, int S) {
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * W4_WARPS + (threadIdx.x >> 5);
    const int G = (gridDim.x * W4_WARPS) / S;  // warps per segment
    const int seg = gw % S, wo = seg * 32 * KV;
    const int KW = K / 8, KG = K / 128;
    int n = gw / S;
    unsigned w[RB][KV], sz[RB][KV];
    if (n < G) {
#pragma unroll
        for (int r = 0; r < RB; ++r) w4_load_row<KV>(Q, SZ, KW, KG, n + r * G, N, wo, lane, w[r], sz[r]);
    }
    PDL_ENTRY();
    if (n >= G || n >= N) return;
    float xr[KV][8], xs[KV];
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        const float4* p = (const float4*)(a + 8 * (wo + lane + 32 * u));
        const float4 f = __ldg(p), g = __ldg(p + 1);
        xr[u][0] = f.x; xr[u][1] = f.y; xr[u][2] = f.z; xr[u][3] = f.w;
        xr[u][4] = g.x; xr[u][5] = g.y; xr[u][6] = g.z; xr[u][7] = g.w;
    }
    w4_xsum<KV>(xr, xs);
    for (; n < N; n += RB * G) {
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = w4_dot<KV>(w[r], sz[r], xr, xs, sbf);
        if (n + RB * G < N) {
#pragma unroll
            for (int r = 0; r < RB; ++r) w4_load_row<KV>(Q, SZ, KW, KG, n + RB * G + r * G, N, wo, lane, w[r], sz[r]);
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

#define W4_RB 4
#define W4_RB_QKV 2  // 4 rows of K = 1536 spill at the 128 registers that 2 blocks/SM allow
#define W4_RB_PAIRS 1

#define W4_INSTANCES(KV)                                                                                          \
    extern "C" __global__ void __launch_bounds__(W4_THREADS, 2) w4_qkv_##KV(                                      \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, const unsigned* __restrict__ Q,    \
        const unsigned* __restrict__ SZ, int sbf, const float* __restrict__ bias, int K, int NQ, int NKVD,       \
        float* __restrict__ q_out, bf16_t* __restrict__ kc, bf16_t* __restrict__ vc,                             \
        const int* __restrict__ order, const int* __restrict__ params, int q_off, int cap, int D) {               \
        w4_qkv_body<KV, W4_RB_QKV>(x, ln, eps, Q, SZ, sbf, bias, K, NQ, NKVD, q_out, kc, vc, order, params, q_off,   \
                               cap, D);                                                                           \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(W4_THREADS, 2) w4_gateup_##KV(                                   \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, const unsigned* __restrict__ Qg,   \
        const unsigned* __restrict__ SZg, const unsigned* __restrict__ Qu, const unsigned* __restrict__ SZu,     \
        int sbf, int K, int I, float* __restrict__ act) {                                                         \
        w4_gateup_body<KV, W4_RB_PAIRS>(x, ln, eps, Qg, SZg, Qu, SZu, sbf, K, I, act);                            \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(W4_THREADS, 2) w4_proj_##KV(                                     \
        const float* __restrict__ a, const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int sbf,    \
        int K, int N, float* __restrict__ y, int S) {                                                             \
        w4_proj_body<KV, W4_RB>(a, Q, SZ, sbf, K, N, y, S);                                                       \
    }

W4_INSTANCES(1)
W4_INSTANCES(2)
W4_INSTANCES(3)
W4_INSTANCES(4)
W4_INSTANCES(5)
W4_INSTANCES(6)
W4_INSTANCES(7)
W4_INSTANCES(8)
