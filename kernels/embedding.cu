// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Embedding gather: out[h] = float(table[idx][h]); idx < 0 selects `start_row` (the chunk's start token,
// uploaded with the chunk inputs), idx >= 0 an action-token row kept on the device.
// Twin: embed[token] (reference.py).
#include "common.cuh"

extern "C" __global__ void embed_gather(const bf16_t* __restrict__ table, const bf16_t* __restrict__ start_row,
                                        const int* __restrict__ idx, int H, float* __restrict__ out) {
    PDL_ENTRY();
    const int id = idx[0];
    const bf16_t* src = id < 0 ? start_row : table + (size_t)id * H;
    for (int h = blockIdx.x * blockDim.x + threadIdx.x; h < H; h += gridDim.x * blockDim.x) out[h] = bf2f(src[h]);
}
