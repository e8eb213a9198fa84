// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Decode GEMVs (one token): bf16 weights [N, K] (HF [out, in]), fp32 activations, fp32 accumulation.
// Built for the fixed cost of small, latency-bound launches inside one CUDA graph:
//  - x lives in registers: lane l of a warp needs only x[8c .. 8c+7] for its 16-byte weight chunks
//    c = l + 32u (u < KV), so it loads those 8*KV floats once (from L2) and reuses them for every row;
//    no shared memory, no __syncthreads.
//  - the RMSNorm factor is computed per warp (the warp holds all of x when K = 256*KV): no block prologue.
//  - the weights of the warp's first RB rows are loaded into registers BEFORE PDL_WAIT (they do not depend
//    on the previous kernel), so with Programmatic Dependent Launch the HBM latency of the first loads
//    overlaps the tail of the previous kernel; the next batch is loaded before the reductions of this one.
//  - a fixed grid (host: SMs x resident blocks per SM from the occupancy API) and warps that loop over rows:
//    no partial last wave. gate/up is bounded to 1 block/SM (x + 2 rows in flight need ~150 registers).
//  - split-K for long rows (down projection, K = 8960): warp w takes K segment w % S of rows w / S + j*G,
//    partial dot products are added into y with atomics (the residual add is fused).
// Kernel names: g4_{qkv,gateup,proj}_<KV>x<RB>, KV = 16-byte chunks per lane per segment (segment =
// 256*KV elements), RB = rows (gate/up: row pairs) in flight per warp. q/k/v and gate/up take the whole row in
// one segment (the norm needs all of x), so hidden sizes up to 256*8 = 2048 are supported; the backend refuses
// larger ones at start-up. Twins: ops.rms_norm, ops.linear (+ bias, + residual), ops.silu_mul; the q/k/v kernel
// also writes k/v (bf16) into the token's slot of the cache.
#include "common.cuh"

#define G4_THREADS 256
#define G4_WARPS (G4_THREADS / 32)

template <int KV>
__device__ __forceinline__ void g4_load_row(const bf16_t* __restrict__ row, int lane, uint4 (&w)[KV]) {
    const uint4* p = (const uint4*)row + lane;
#pragma unroll
    for (int u = 0; u < KV; ++u) w[u] = ldg_stream(p + 32 * u);
}

// rows n + r*stride (r < RB) of W (row length K elements, segment offset `off` elements); zeros past N
template <int KV, int RB>
__device__ __forceinline__ void g4_load_rows(const bf16_t* __restrict__ W, int K, int off, int n, int stride, int N,
                                             int lane, uint4 (&w)[RB][KV]) {
#pragma unroll
    for (int r = 0; r < RB; ++r) {
        const int m = n + r * stride;
        if (m < N) {
            g4_load_row<KV>(W + (size_t)m * K + off, lane, w[r]);
        } else {
#pragma unroll
            for (int u = 0; u < KV; ++u) w[r][u] = make_uint4(0, 0, 0, 0);
        }
    }
}

template <int KV>
__device__ __forceinline__ void g4_load_x(const float* __restrict__ x, int lane, float (&xr)[KV][8]) {
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        const float4* p = (const float4*)(x + 8 * (lane + 32 * u));
        const float4 a = __ldg(p), b = __ldg(p + 1);
        xr[u][0] = a.x; xr[u][1] = a.y; xr[u][2] = a.z; xr[u][3] = a.w;
        xr[u][4] = b.x; xr[u][5] = b.y; xr[u][6] = b.z; xr[u][7] = b.w;
    }
}

template <int KV>
__device__ __forceinline__ float g4_dot(const uint4 (&w)[KV], const float (&xr)[KV][8]) {
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < KV; ++u) s += dot8(w[u], xr[u]);
    return s;
}

// q/k/v (+ input RMSNorm, + bias, k/v stored as bf16 into the token's slot). K = 256*KV (one segment).
template <int KV, int RB>
__device__ __forceinline__ void g4_qkv_body(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps,
                                            const bf16_t* __restrict__ W, const float* __restrict__ bias, int K,
                                            int NQ, int NKVD, float* __restrict__ q_out, bf16_t* __restrict__ kc,
                                            bf16_t* __restrict__ vc, const int* __restrict__ order,
                                            const int* __restrict__ params, int q_off, int cap, int D) {
    const int lane = threadIdx.x & 31;
    const int nw = gridDim.x * G4_WARPS;
    const int N = NQ + 2 * NKVD;
    int n = blockIdx.x * G4_WARPS + (threadIdx.x >> 5);
    uint4 w[RB][KV];
    g4_load_rows<KV, RB>(W, K, 0, n, nw, N, lane, w);
    // also constant inside the chunk, so read before the wait: the bias (a weight), and the token's slot (the order
    // table and params[0] come from the chunk's input memcpy, which completes before the first stamp kernel, and
    // that one is always launched without PDL)
    float bv[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) bv[r] = (n + r * nw < N) ? __ldg(bias + n + r * nw) : 0.f;
    const int slot = __ldg(order + __ldg(params) + q_off);
    PDL_ENTRY();
    if (n >= N) return;
    float xr[KV][8];
    const float inv = warp_load_x_norm<KV>(x, ln, lane, K, eps, xr);
    for (; n < N; n += RB * nw) {
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = g4_dot<KV>(w[r], xr) * inv;
        if (n + RB * nw < N) g4_load_rows<KV, RB>(W, K, 0, n + RB * nw, nw, N, lane, w);
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

// act[i] = silu(Wg[i] . n(x)) * (Wu[i] . n(x)); W = [wg; wu] ([2I, K]); RB row pairs in flight.
template <int KV, int RB>
__device__ __forceinline__ void g4_gateup_body(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps,
                                               const bf16_t* __restrict__ W, int K, int I, float* __restrict__ act) {
    const int lane = threadIdx.x & 31;
    const int nw = gridDim.x * G4_WARPS;
    int i = blockIdx.x * G4_WARPS + (threadIdx.x >> 5);
    uint4 wg[RB][KV], wu[RB][KV];
    g4_load_rows<KV, RB>(W, K, 0, i, nw, I, lane, wg);
    g4_load_rows<KV, RB>(W + (size_t)I * K, K, 0, i, nw, I, lane, wu);
    PDL_ENTRY();
    if (i >= I) return;
    float xr[KV][8];
    const float inv = warp_load_x_norm<KV>(x, ln, lane, K, eps, xr);
    for (; i < I; i += RB * nw) {
        float ag[RB], au[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            ag[r] = g4_dot<KV>(wg[r], xr);
            au[r] = g4_dot<KV>(wu[r], xr);
        }
        if (i + RB * nw < I) {
            g4_load_rows<KV, RB>(W, K, 0, i + RB * nw, nw, I, lane, wg);
            g4_load_rows<KV, RB>(W + (size_t)I * K, K, 0, i + RB * nw, nw, I, lane, wu);
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
__device__ __forceinline__ void g4_proj_body(const float* __restrict__ a, const bf16_t* __restrict__ W, int K, int N,
                                             float* __restrict__ y, int S) {
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * G4_WARPS + (threadIdx.x >> 5);
    const int G = (gridDim.x * G4_WARPS) / S;  // warps per segment
    const int seg = gw % S, off = seg * 256 * KV;
    int n = gw / S;
    uint4 w[RB][KV];
    if (n < G) g4_load_rows<KV, RB>(W, K, off, n, G, N, lane, w);
    PDL_ENTRY();
    if (n >= G || n >= N) return;
    float xr[KV][8];
    g4_load_x<KV>(a + off, lane, xr);
    for (; n < N; n += RB * G) {
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = g4_dot<KV>(w[r], xr);
        if (n + RB * G < N) g4_load_rows<KV, RB>(W, K, off, n + RB * G, G, N, lane, w);
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

#define G4_INSTANCES(KV, RB)                                                                                      \
    extern "C" __global__ void __launch_bounds__(G4_THREADS, 2) g4_qkv_##KV##x##RB(                               \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, const bf16_t* __restrict__ W,      \
        const float* __restrict__ bias, int K, int NQ, int NKVD, float* __restrict__ q_out,                      \
        bf16_t* __restrict__ kc, bf16_t* __restrict__ vc, const int* __restrict__ order,                         \
        const int* __restrict__ params, int q_off, int cap, int D) {                                              \
        g4_qkv_body<KV, RB>(x, ln, eps, W, bias, K, NQ, NKVD, q_out, kc, vc, order, params, q_off, cap, D);      \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(G4_THREADS, 1) g4_gateup_##KV##x##RB(                            \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, const bf16_t* __restrict__ W,      \
        int K, int I, float* __restrict__ act) {                                                                  \
        g4_gateup_body<KV, RB>(x, ln, eps, W, K, I, act);                                                         \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(G4_THREADS, 2) g4_proj_##KV##x##RB(                              \
        const float* __restrict__ a, const bf16_t* __restrict__ W, int K, int N, float* __restrict__ y, int S) {  \
        g4_proj_body<KV, RB>(a, W, K, N, y, S);                                                                   \
    }

G4_INSTANCES(1, 1)
G4_INSTANCES(2, 1)
G4_INSTANCES(3, 1)
G4_INSTANCES(4, 1)
G4_INSTANCES(5, 1)
G4_INSTANCES(6, 1)
G4_INSTANCES(7, 1)
G4_INSTANCES(8, 1)
