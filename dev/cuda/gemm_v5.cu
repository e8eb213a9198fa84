// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// dev/: the previous (v5, 2026-11-30) prefill GEMM, kept to be timed against kernels/gemm.cu (dev/cuda/gemm_micro.py).
// Prefill projections on the tensor cores: Y[T, N] (=|+=) X[T, K] . W[N, K]^T for T = 32 rows (gemm_bf16_t32)
// or 48 rows (gemm_bf16_t48: 32 vision tokens + 8 parallel action queries, padded with zero rows),
// X bf16 (normalised activations), W bf16 (HF [out, in]), fp32 accumulation with mma.sync m16n8k16.
// Memory-bound on W (read once): grid (N/64, ksplit), 4 warps, each warp owns 16 W rows and streams
// them with 16-byte loads; split-K partial sums are added with atomics (mode 1), which also fuses
// the residual add (Y = x) and the q/k/v bias (Y pre-initialised with the bias by rmsnorm_bf16).
// K is permuted consistently inside each 64-wide chunk for A and B so every lane loads 2 x 16 bytes
// of a W row (the dot product does not depend on the order of k). Twin: ops.linear.
#include "common.cuh"
#ifndef VLA_V5_HELPERS
#define VLA_V5_HELPERS
// --- prefill GEMMs (gemm.cu, gemm_w4.cu): mma.sync m16n8k16 fragments over 64-wide k chunks -------------------
// Word i (0..7) of a lane's 16 k-values held as two uint4: the bf16 pair of elements 2i, 2i+1.
__device__ __forceinline__ unsigned word_of(const uint4& a, const uint4& b, int i) {
    const uint4& v = i < 4 ? a : b;
    const int j = i & 3;
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// The A operand (X, bf16 [16*MT rows, K]) of one 64-wide k chunk: m-tile mt, rows r / r+8, the lane's 16 k-values.
template <int MT>
__device__ __forceinline__ void load_a_chunk(uint4 (&a)[MT][2][2], const bf16_t* __restrict__ X, int K, int k0,
                                             int lane) {
    const int r = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4* p = (const uint4*)(X + (size_t)(mt * 16 + r + h * 8) * K + k0 + q * 16);
            a[mt][h][0] = p[0];
            a[mt][h][1] = p[1];
        }
}

// Y[t, n] = acc (mode 0) or += acc with atomics (mode 1, split-K), for the warp's NT n-tiles of 8 from column n0.
template <int MT, int NT>
__device__ __forceinline__ void store_acc(const float (&acc)[MT][NT][4], float* __restrict__ Y, int N, int n0,
                                          int lane, int mode) {
    const int r = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = mt * 16 + r + (e >> 1) * 8;
                const int n = n0 + j * 8 + q * 2 + (e & 1);
                float* dst = Y + (size_t)t * N + n;
                if (mode == 0) *dst = acc[mt][j][e];
                else atomicAdd(dst, acc[mt][j][e]);
            }
}

#endif

template <int MT>
struct Chunk {
    uint4 b[2][2];      // [n-tile][half]
    uint4 a[MT][2][2];  // [m-tile][row r / r+8][half]
};

template <int MT>
__device__ __forceinline__ void load_chunk(Chunk<MT>& c, const bf16_t* __restrict__ X, const bf16_t* __restrict__ W,
                                           int K, int n0, int k0, int lane) {
    const int r = lane >> 2, q = lane & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const uint4* p = (const uint4*)(W + (size_t)(n0 + j * 8 + r) * K + k0 + q * 16);
        c.b[j][0] = ldg_stream(p);
        c.b[j][1] = ldg_stream(p + 1);
    }
    load_a_chunk<MT>(c.a, X, K, k0, lane);
}

template <int MT>
__device__ __forceinline__ void mma_chunk(const Chunk<MT>& c, float (*acc)[2][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const unsigned a0 = word_of(c.a[mt][0][0], c.a[mt][0][1], 2 * s);
            const unsigned a1 = word_of(c.a[mt][1][0], c.a[mt][1][1], 2 * s);
            const unsigned a2 = word_of(c.a[mt][0][0], c.a[mt][0][1], 2 * s + 1);
            const unsigned a3 = word_of(c.a[mt][1][0], c.a[mt][1][1], 2 * s + 1);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const unsigned b0 = word_of(c.b[j][0], c.b[j][1], 2 * s);
                const unsigned b1 = word_of(c.b[j][0], c.b[j][1], 2 * s + 1);
                mma_bf16_16816(acc[mt][j], a0, a1, a2, a3, b0, b1);
            }
        }
    }
}

// mode 0: Y = X W^T (ksplit must be 1); mode 1: Y += X W^T (atomics). T = 16*MT rows; K % 64 == 0; N % 64 == 0.
template <int MT>
__device__ __forceinline__ void gemm_body(const bf16_t* __restrict__ X, const bf16_t* __restrict__ W,
                                          float* __restrict__ Y, int N, int K, int mode) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = blockIdx.x * 64 + warp * 16;
    const int nch = K >> 6;
    const int per = (nch + gridDim.y - 1) / gridDim.y;
    const int c0 = blockIdx.y * per;
    const int c1 = min(nch, c0 + per);
    // L2 prefetch of this warp's 16 W rows over its k range (one line = one 64-wide chunk of a row).
    for (int e = lane; e < 16 * (c1 - c0); e += 32) {
        const int rr = e / (c1 - c0), cc = c0 + e % (c1 - c0);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(W + (size_t)(n0 + rr) * K + cc * 64));
    }
    PDL_ENTRY();
    float acc[MT][2][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    int c = c0;
    for (; c + 1 < c1; c += 2) {
        Chunk<MT> ch[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) load_chunk(ch[u], X, W, K, n0, (c + u) * 64, lane);
#pragma unroll
        for (int u = 0; u < 2; ++u) mma_chunk(ch[u], acc);
    }
    for (; c < c1; ++c) {
        Chunk<MT> ch;
        load_chunk(ch, X, W, K, n0, c * 64, lane);
        mma_chunk(ch, acc);
    }
    if (c0 >= c1) return;
    store_acc<MT, 2>(acc, Y, N, n0, lane, mode);
}

extern "C" __global__ void __launch_bounds__(128)
v5_gemm_bf16_t32(const bf16_t* __restrict__ X, const bf16_t* __restrict__ W, float* __restrict__ Y, int N, int K,
              int mode) {
    gemm_body<2>(X, W, Y, N, K, mode);
}

extern "C" __global__ void __launch_bounds__(128)
v5_gemm_bf16_t48(const bf16_t* __restrict__ X, const bf16_t* __restrict__ W, float* __restrict__ Y, int N, int K,
              int mode) {
    gemm_body<3>(X, W, Y, N, K, mode);
}
