// Prefill SwiGLU: gu [T, 2I] fp32 (gate | up) -> act bf16 [T, I] = silu(g) * u. Twin: ops.silu_mul.
#include "common.cuh"

extern "C" __global__ void silu_mul_bf16(const float* __restrict__ gu, int T, int I, bf16_t* __restrict__ act) {
    PDL_ENTRY();
    const int n = T * I;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const int t = e / I, i = e - t * I;
        const float g = gu[(size_t)t * 2 * I + i], u = gu[(size_t)t * 2 * I + I + i];
        act[e] = f2bf(g / (1.f + __expf(-g)) * u);
    }
}
