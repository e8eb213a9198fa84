// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Prefill RMSNorm: one block of 256 threads per token (H <= 2048, H % 4 == 0, N % 4 == 0); writes the normalised row as bf16 (the A operand of the
// tensor-core GEMM) and, optionally, initialises the GEMM output rows with the bias (q/k/v bias add
// fused: the split-K GEMM then accumulates on top). Twin: ops.rms_norm (+ bias of ops.linear).
// rmsnorm_f16: the same row as fp16, for the 4-bit GEMM's fp16 instances (gemm_w4h_*) where the row provably fits
// fp16 (|x_i| / rms(x) <= sqrt(H), so |out| <= sqrt(H) max |w|: cuda/backend.py fp16_activations_fit checks it).
#include "common.cuh"

// Latency: every load of a thread is issued before the first use (x and w as 16- / 8-byte vectors, at most
// RMS_V4 of each a thread: H <= 256 * 4 * RMS_V4), so a row costs one round trip to L2, not one per loop trip.
#define RMS_V4 2
template <bool F16>
__device__ __forceinline__ void rmsnorm_body(const float* __restrict__ x, const bf16_t* __restrict__ w, float eps,
                                             int H, bf16_t* __restrict__ out, const float* __restrict__ bias, int N,
                                             float* __restrict__ y_init) {
    __shared__ float red[32];
    PDL_ENTRY();
    const int t = blockIdx.x, n4 = H >> 2;
    const float4* xr = (const float4*)(x + (size_t)t * H);
    float4 v[RMS_V4];
    uint2 wv[RMS_V4];
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < RMS_V4; ++u) {
        const int i = threadIdx.x + u * 256;
        if (i < n4) {
            v[u] = xr[i];
            wv[u] = __ldg((const uint2*)w + i);
        }
    }
    if (y_init != nullptr) {  // the bias rows: independent of the norm, stored while the loads above fly
        const float4* b4 = (const float4*)bias;
        float4* y4 = (float4*)(y_init + (size_t)t * N);
        for (int n = threadIdx.x; n < (N >> 2); n += 256) y4[n] = __ldg(b4 + n);
    }
#pragma unroll
    for (int u = 0; u < RMS_V4; ++u)
        if (threadIdx.x + u * 256 < n4)
            ss = fmaf(v[u].x, v[u].x, fmaf(v[u].y, v[u].y, fmaf(v[u].z, v[u].z, fmaf(v[u].w, v[u].w, ss))));
    const float inv = rms_inv(block_sum(ss, red) / (float)H, eps);
    uint2* o2 = (uint2*)(out + (size_t)t * H);
#pragma unroll
    for (int u = 0; u < RMS_V4; ++u) {
        const int i = threadIdx.x + u * 256;
        if (i < n4)
            o2[i] = make_uint2(pack_act2<F16>(v[u].x * inv * bflo(wv[u].x), v[u].y * inv * bfhi(wv[u].x)),
                               pack_act2<F16>(v[u].z * inv * bflo(wv[u].y), v[u].w * inv * bfhi(wv[u].y)));
    }
}

#define RMSNORM(NAME, F16)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
    NAME(const float* __restrict__ x, const bf16_t* __restrict__ w, float eps, int H, bf16_t* __restrict__ out,   \
         const float* __restrict__ bias, int N, float* __restrict__ y_init) {                                     \
        rmsnorm_body<F16>(x, w, eps, H, out, bias, N, y_init);                                                    \
    }
RMSNORM(rmsnorm_bf16, false)
RMSNORM(rmsnorm_f16, true)
