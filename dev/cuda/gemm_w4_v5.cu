// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// dev/: the previous (v5, 2026-11-30) prefill GEMM, kept to be timed against kernels/gemm.cu (dev/cuda/gemm_micro.py).
// Prefill projections on 4-bit weights (W4A16), tensor cores: Y[T, N] (=|+=) X[T, K] . W[N, K]^T, T = 32 rows
// (gemm_w4_t32) or 48 (gemm_w4_t48: 32 vision tokens + 8 parallel action queries + zero padding). X bf16; W as
// in gemv_w4.cu (Q uint32 [N, K/8] nibbles, SZ uint32 [N, K/128] scale bits | zero << 16); fp32 accumulation.
// Structure as gemm.cu (64-wide k chunks, split-K with atomics in mode 1, which also fuses the residual add and the
// q/k/v bias), except that a warp owns 8*W4_NT = 32 W rows (grid (N/128, ksplit), 4 warps): a 4-bit row chunk is a
// quarter of a bf16 one, so the X fragments a warp loads from L2 for every chunk would otherwise outweigh the
// weights it streams; 32 rows a warp halve those loads per weight byte. A lane's 16 k-values of a W row are one
// 8-byte load of nibbles; the B operand is (q - z) converted to bf16, which is exact for these small
// integers, and the group scale is applied to the fp32 accumulators once per 64-wide chunk (a chunk never
// straddles a 128-group): acc += s[n] * (X . (q - z)). Twin: ops.linear on QuantTensor.dequantize().
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

// Elements 2p, 2p+1 of a word (the two nibbles of byte p) minus the zero, as a bf16 pair: the byte is copied into
// both halves, each half's nibble OR 0x4300 is the bf16 of 128 + n (ulp 1 in [128, 256)), and one bf16x2
// subtraction of 128 + z leaves n - z, exact for these small integers. zz = bf16x2 bits of (128 + z, 128 + z).
__device__ __forceinline__ unsigned v5_w4_bfpair(unsigned w, int p, unsigned zz) {
    const unsigned v = __byte_perm(w, 0u, 0x4040u | (unsigned)p | ((unsigned)p << 8));  // 0x00bb00bb
    const unsigned t = (v & 0x0000000Fu) | ((v >> 4) & 0x000F0000u) | 0x43004300u;
    const __nv_bfloat162 d = __hsub2(*(const __nv_bfloat162*)&t, *(const __nv_bfloat162*)&zz);
    return *(const unsigned*)&d;
}

#define W4_NT 4  // n-tiles of 8 rows per warp

template <int MT>
struct W4Chunk {
    uint2 b[W4_NT];      // [n-tile]: 16 nibbles of row n0 + j*8 + r at k0 + q*16
    unsigned zz[W4_NT];  // bf16x2 bits of (128 + z, 128 + z) for that row's group
    uint4 a[MT][2][2];   // [m-tile][row r / r+8][half]
};

template <int MT>
__device__ __forceinline__ void w4_load_chunk(W4Chunk<MT>& c, const bf16_t* __restrict__ X,
                                              const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int K,
                                              int n0, int k0, int lane) {
    const int r = lane >> 2, q = lane & 3;
#pragma unroll
    for (int j = 0; j < W4_NT; ++j) {
        const size_t row = (size_t)(n0 + j * 8 + r);
        const unsigned* p = Q + row * (K >> 3) + (k0 >> 3) + q * 2;
        asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(c.b[j].x), "=r"(c.b[j].y) : "l"(p));
        const unsigned z128 = 0x4300u | ((__ldg(SZ + row * (K >> 7) + (k0 >> 7)) >> 16) & 15u);  // bf16(128 + z)
        c.zz[j] = z128 | (z128 << 16);
    }
    load_a_chunk<MT>(c.a, X, K, k0, lane);
}

// t = X . (q - z) over the chunk (same k permutation for A and B as gemm.cu: word i of a lane = elements 2i, 2i+1)
template <int MT>
__device__ __forceinline__ void w4_mma_chunk(const W4Chunk<MT>& c, float (*t)[W4_NT][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        unsigned b0[W4_NT], b1[W4_NT];
#pragma unroll
        for (int j = 0; j < W4_NT; ++j) {
            // bf16 pair i (elements 2i, 2i+1 of the lane's 16) = nibbles 2(i&3), 2(i&3)+1 of word i>>2
            const int i0 = 2 * s, i1 = 2 * s + 1;
            b0[j] = v5_w4_bfpair(i0 < 4 ? c.b[j].x : c.b[j].y, i0 & 3, c.zz[j]);
            b1[j] = v5_w4_bfpair(i1 < 4 ? c.b[j].x : c.b[j].y, i1 & 3, c.zz[j]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const unsigned a0 = word_of(c.a[mt][0][0], c.a[mt][0][1], 2 * s);
            const unsigned a1 = word_of(c.a[mt][1][0], c.a[mt][1][1], 2 * s);
            const unsigned a2 = word_of(c.a[mt][0][0], c.a[mt][0][1], 2 * s + 1);
            const unsigned a3 = word_of(c.a[mt][1][0], c.a[mt][1][1], 2 * s + 1);
#pragma unroll
            for (int j = 0; j < W4_NT; ++j) mma_bf16_16816(t[mt][j], a0, a1, a2, a3, b0[j], b1[j]);
        }
    }
}

template <int MT>
__device__ __forceinline__ void w4_gemm_body(const bf16_t* __restrict__ X, const unsigned* __restrict__ Q,
                                             const unsigned* __restrict__ SZ, int sbf, float* __restrict__ Y, int N,
                                             int K, int mode) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = blockIdx.x * (32 * W4_NT) + warp * (8 * W4_NT);
    const int nch = K >> 6;
    const int per = (nch + gridDim.y - 1) / gridDim.y;
    const int c0 = blockIdx.y * per;
    const int c1 = min(nch, c0 + per);
    // L2 prefetch of this warp's rows of nibbles over its k range (a 64-wide chunk of a row is 32 bytes)
    for (int e = lane; e < 8 * W4_NT * (c1 - c0); e += 32) {
        const int rr = e / (c1 - c0), cc = c0 + e % (c1 - c0);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(Q + (size_t)(n0 + rr) * (K >> 3) + cc * 8));
    }
    PDL_ENTRY();
    const int q = lane & 3;
    float acc[MT][W4_NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < W4_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    for (int c = c0; c < c1; c += 2) {
        W4Chunk<MT> ch[2];
#pragma unroll
        for (int u = 0; u < 2; ++u)
            if (c + u < c1) w4_load_chunk(ch[u], X, Q, SZ, K, n0, (c + u) * 64, lane);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            if (c + u >= c1) break;
            float t[MT][W4_NT][4];
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < W4_NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) t[i][j][e] = 0.f;
            w4_mma_chunk(ch[u], t);
            const int g = ((c + u) * 64) >> 7;
            float s[W4_NT][2];
#pragma unroll
            for (int j = 0; j < W4_NT; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    s[j][h] = w4_scale(__ldg(SZ + (size_t)(n0 + j * 8 + q * 2 + h) * (K >> 7) + g), sbf);
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < W4_NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] = fmaf(s[j][e & 1], t[i][j][e], acc[i][j][e]);
        }
    }
    if (c0 >= c1) return;
    store_acc<MT, W4_NT>(acc, Y, N, n0, lane, mode);
}

extern "C" __global__ void __launch_bounds__(128)
v5_gemm_w4_t32(const bf16_t* __restrict__ X, const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int sbf,
            float* __restrict__ Y, int N, int K, int mode) {
    w4_gemm_body<2>(X, Q, SZ, sbf, Y, N, K, mode);
}

extern "C" __global__ void __launch_bounds__(128)
v5_gemm_w4_t48(const bf16_t* __restrict__ X, const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int sbf,
            float* __restrict__ Y, int N, int K, int mode) {
    w4_gemm_body<3>(X, Q, SZ, sbf, Y, N, K, mode);
}
