// Prefill RMSNorm: one block per token; writes the normalised row as bf16 (the A operand of the
// tensor-core GEMM) and, optionally, initialises the GEMM output rows with the bias (q/k/v bias add
// fused: the split-K GEMM then accumulates on top). Twin: ops.rms_norm (+ bias of ops.linear).
#include "common.cuh"

extern "C" __global__ void rmsnorm_bf16(const float* __restrict__ x, const bf16_t* __restrict__ w, float eps, int H,
                                        bf16_t* __restrict__ out, const float* __restrict__ bias, int N,
                                        float* __restrict__ y_init) {
    __shared__ float red[32];
    PDL_ENTRY();
    const int t = blockIdx.x;
    const float* xr = x + (size_t)t * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    const float inv = rsqrtf(block_sum(ss, red) / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[(size_t)t * H + i] = f2bf(xr[i] * inv * bf2f(w[i]));
    if (y_init != nullptr)
        for (int n = threadIdx.x; n < N; n += blockDim.x) y_init[(size_t)t * N + n] = bias[n];
}

// Final RMSNorm to fp32 (used by tests and the prompt path).
extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const bf16_t* __restrict__ w, float eps, int H,
                                       float* __restrict__ out) {
    __shared__ float red[32];
    PDL_ENTRY();
    const int t = blockIdx.x;
    const float* xr = x + (size_t)t * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    const float inv = rsqrtf(block_sum(ss, red) / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[(size_t)t * H + i] = xr[i] * inv * bf2f(w[i]);
}
