// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Decode projections (one token): bf16 weights [N, K] (HF [out, in]), fp32 activations, fp32 accumulation.
// Memory-bound GEMV: each warp streams whole rows with 16-byte loads, x sits in shared memory.
// Twins: ops.rms_norm + ops.linear (+ bias), ops.silu_mul; KV write into the slot cache.
#include "common.cuh"

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)

// q/k/v projection of the decode token with the input RMSNorm fused in (every block normalises x
// itself: 6 KB from L2), bias added; q goes to q_out (fp32), k and v are written as bf16 into the
// token's slot (un-rotated keys: RoPE is applied inside attention from the position).
// W = [wq; wk; wv] rows (NQ + 2*NKVD), K = hidden.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
dec_qkv(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, const bf16_t* __restrict__ W,
        const float* __restrict__ bias, int K, int NQ, int NKVD, float* __restrict__ q_out,
        bf16_t* __restrict__ kc, bf16_t* __restrict__ vc, const int* __restrict__ order,
        const int* __restrict__ params, int q_off, int cap, int D) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    const int N = NQ + 2 * NKVD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rows[2];
    rows[0] = (blockIdx.x * GEMV_WARPS + warp) * 2;
    rows[1] = rows[0] + 1;
    warp_prefetch_rows<2>(W, K, rows, N);
    PDL_ENTRY();
    norm_to_smem(x, ln, eps, K, xs, red);
    if (rows[0] >= N) return;
    if (rows[1] >= N) rows[1] = rows[0];
    float acc[2];
    warp_rows<2, 6>(W, K, rows, xs, acc);
    if (lane < 2) {
        const int n = rows[lane];
        if (lane == 1 && rows[1] == rows[0]) return;
        const float v = acc[lane] + bias[n];
        if (n < NQ) {
            q_out[n] = v;
        } else {
            const int slot = order[params[0] + q_off];
            const int m = (n - NQ) % NKVD, g = m / D, d = m % D;
            bf16_t* dst = (n < NQ + NKVD) ? kc : vc;
            dst[((size_t)g * cap + slot) * D + d] = f2bf(v);
        }
    }
}

// y[n] += W[n] . a   (o projection / down projection fused with the residual add)
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
dec_proj_residual(const float* __restrict__ a, const bf16_t* __restrict__ W, int K, int N, float* __restrict__ y) {
    extern __shared__ float xs[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rows[1];
    rows[0] = blockIdx.x * GEMV_WARPS + warp;
    warp_prefetch_rows<1>(W, K, rows, N);
    PDL_ENTRY();
    copy_to_smem(a, K, xs);
    if (rows[0] >= N) return;
    float acc[1];
    if (K > 4096) warp_rows<1, 7>(W, K, rows, xs, acc);
    else warp_rows<1, 6>(W, K, rows, xs, acc);
    if (lane == 0) y[rows[0]] += acc[0];
}

// act[i] = silu(Wg[i] . n(x)) * (Wu[i] . n(x)), n = post-attention RMSNorm, fused.
// W = [wg; wu] ([2I, K]); each warp computes two outputs (4 rows).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
dec_gateup(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, const bf16_t* __restrict__ W,
           int K, int I, float* __restrict__ act) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i0 = (blockIdx.x * GEMV_WARPS + warp) * 2;
    const int i1 = (i0 + 1 < I) ? i0 + 1 : i0;
    int rows[4] = {i0, I + i0, i1, I + i1};
    if (i0 < I) warp_prefetch_rows<4>(W, K, rows, 2 * I);
    PDL_ENTRY();
    norm_to_smem(x, ln, eps, K, xs, red);
    if (i0 >= I) return;
    float acc[4];
    warp_rows<4, 3>(W, K, rows, xs, acc);
    if (lane == 0) {
        act[i0] = acc[0] / (1.f + __expf(-acc[0])) * acc[1];
        if (i1 != i0) act[i1] = acc[2] / (1.f + __expf(-acc[2])) * acc[3];
    }
}
