// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Vision patch encoder: frame uint8 [64, 128, 3] -> patches [32, 768] (4x8 grid row-major, (row, col,
// channel) inside a patch, x/127.5 - 1) -> x[32, H] = P W^T + b + pos, plus pooled[H] = mean over the
// 32 tokens. One block per 32 hidden features; 32-wide k tiles of P and W staged in shared memory.
// Twins: ops.patchify, ops.vision_encode (pooled: mean over axis 0).
#include "common.cuh"

#define VT 32  // tokens
#define VK 32  // k tile

extern "C" __global__ void __launch_bounds__(256)
vision_encode(const unsigned char* __restrict__ frame, const bf16_t* __restrict__ W, const bf16_t* __restrict__ b,
              const bf16_t* __restrict__ pos, int H, float* __restrict__ x, float* __restrict__ pooled) {
    __shared__ float Ps[VT][VK + 1];
    __shared__ float Ws[32][VK + 1];
    __shared__ float Xs[VT][33];
    PDL_ENTRY();
    const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;  // ty: 8 groups of 4 tokens
    const int h0 = blockIdx.x * 32;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < 768; k0 += VK) {
        for (int e = tid; e < VT * VK; e += 256) {
            const int p = e / VK, kk = e % VK, k = k0 + kk;
            const int py = p >> 3, px = p & 7, i = k / 48, jx = (k % 48) / 3, ch = k % 3;
            const unsigned char v = frame[((py * 16 + i) * 128 + px * 16 + jx) * 3 + ch];
            Ps[p][kk] = (float)v / 127.5f - 1.0f;
            const int hh = e / VK;
            Ws[hh][kk] = (h0 + hh < H) ? bf2f(W[(size_t)(h0 + hh) * 768 + k]) : 0.f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < VK; ++kk) {
            const float w = Ws[tx][kk];
#pragma unroll
            for (int u = 0; u < 4; ++u) acc[u] = fmaf(Ps[ty * 4 + u][kk], w, acc[u]);
        }
        __syncthreads();
    }
    const int h = h0 + tx;
    if (h < H) {
        const float bb = bf2f(b[h]);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int p = ty * 4 + u;
            const float v = acc[u] + bb + bf2f(pos[(size_t)p * H + h]);
            x[(size_t)p * H + h] = v;
            Xs[p][tx] = v;
        }
    }
    __syncthreads();
    if (ty == 0 && h < H) {
        float s = 0.f;
        for (int p = 0; p < VT; ++p) s += Xs[p][tx];
        pooled[h] = s / (float)VT;
    }
}
