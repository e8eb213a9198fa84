// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// The robot state's token (DESIGN.md §17): s (float32 [S], normalized on the host) -> x = fc2(GELU(fc1 s)) (float32
// [H]), written as one prefill input row (OpenVLA-OFT's ProprioProjector). Two small kernels: state_fc1 one thread a
// hidden unit over its S weights (S <= 64), GELU exact (erff, as PyTorch's nn.GELU()); state_fc2 one warp an output
// row, 16-byte streaming loads of its bf16 row against the hidden vector staged in shared memory. fc2 (H x H bf16:
// 1.6 MB at 0.5B, 4.7 MB at 1.5B) is the only traffic that counts: at the H200's ~4 TB/s, 0.4 / 1.2 us.
// Twin: ops.state_project.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
state_fc1(const float* __restrict__ s, const bf16_t* __restrict__ W1, const bf16_t* __restrict__ b1, int S, int H,
          float* __restrict__ g) {
    PDL_ENTRY();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= H) return;
    float acc = bf2f(b1[j]);
    for (int i = 0; i < S; ++i) acc = fmaf(bf2f(W1[(size_t)j * S + i]), s[i], acc);
    g[j] = 0.5f * acc * (1.0f + erff(acc * 0.70710678118654752f));
}

// H % 8 == 0 (cuda_shape_problems): every row starts 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256)
state_fc2(const float* __restrict__ g, const bf16_t* __restrict__ W2, const bf16_t* __restrict__ b2, int H,
          float* __restrict__ x) {
    extern __shared__ float gs[];
    PDL_ENTRY();
    for (int k = threadIdx.x; k < H; k += blockDim.x) gs[k] = g[k];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= H) return;
    const uint4* w = reinterpret_cast<const uint4*>(W2 + (size_t)row * H);
    float acc = 0.f;
    for (int c = lane; c < H / 8; c += 32) acc += dot8(ldg_stream(w + c), gs + 8 * c);
    acc = warp_sum(acc);
    if (lane == 0) x[row] = acc + bf2f(b2[row]);
}
