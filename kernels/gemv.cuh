// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Decode GEMV bodies (one token), included by gemv.cu (one kernel per op) and dev/cuda/decode_persistent.cu (steps of
// one persistent kernel): weights [N, K] (HF [out, in]) in bf16, fp16 (a bf16 model stored in fp16 for its fp16
// prefill: cuda/act_format.py) or 4-bit (W4A16), fp32 activations, fp32 accumulation. One body per op (q/k/v,
// gate/up, o/down projection); the weight format is a policy (Bf16W, F16W, Q4W):
// how a lane copies its part of a row and how it dots it with x. Built for the fixed cost of small, latency-bound
// launches inside one CUDA graph:
//  - x lives in registers: lane l of a warp needs only x[8c .. 8c+7] for its chunks c = l + 32u (u < KV) of a row
//    (16 bytes of bf16 or 4 bytes of 4-bit weights each), so it loads those 8*KV floats once (from L2) and reuses
//    them for every row; no __syncthreads (each warp works alone).
//  - the RMSNorm factor is computed per warp (the warp holds all of x when K = 256*KV): no block prologue.
//  - the weights go global -> shared memory by cp.async into a ring of F::NS iterations per warp (GvRing below), the
//    first NS - 1 issued BEFORE PDL_WAIT (they do not depend on the previous kernel), so with Programmatic Dependent
//    Launch their HBM latency overlaps the tail of the previous kernel; each iteration issues the one NS - 1 ahead.
//  - a fixed grid (host: SMs x resident blocks per SM from the occupancy API, the ring's shared memory counted) and
//    warps that loop over rows: no partial last wave.
//  - split-K for long rows (o / down projections): warp w takes K segment w % S of rows w / S + j*G, partial dot
//    products are added into y with atomics (the residual add is fused).
// 4-bit layout (model/quant.py QuantTensor, as cuda/backend.w4_device_arrays uploads it):
//   Q  uint32 [N, K/8]   nibble k (bits 4k..4k+3) of word j = element 8j+k, unsigned 0..15;
//   SZ uint32 [N, K/128] bits 0..15 = the group's scale (fp16, or bf16 when sbf != 0), bits 16..19 = its zero z;
// w = (q - z) * s. Per word: s * (sum_k (16 + q_k) x_k - (16 + z) sum_k x_k), q and z small integers (3 ops an
// element).
// Kernel names: gemv_{bf16,f16,w4}_{qkv,gateup,proj}_<KV>, KV = chunks a lane holds per K segment (segment = 256*KV
// elements). q/k/v and gate/up take the whole row in one segment (the norm needs all of x), so hidden sizes up to
// 256*8 = 2048 are supported; the backend refuses larger ones at start-up. K need not fill the segments: any K that is
// a multiple of 128 (hidden 896 = 3.5 x 256, FFN 4864 = 19 x 256) runs, the last segment holding nv = (K - off) / 8
// < 32*KV chunks; a lane's chunks c >= nv are zero-filled in the ring (cp.async with src-size 0) and zero in x, so
// the dot products need no branch. Each op has two instances per KV: gemv_..._<KV> for K that fills its segments
// (FULL: no masking compiled in) and gemv_..._<KV>p for a partial last segment (the launcher picks by K). Twins: ops.rms_norm, ops.linear (+ bias,
// + residual) on the weights (QuantTensor.dequantize() for 4-bit), ops.silu_mul; the q/k/v kernel also writes k/v
// (bf16) into the token's slot of the cache.
#pragma once
#include "common.cuh"
#include "cp_async.cuh"

#define GV_THREADS 256
#define GV_WARPS (GV_THREADS / 32)

// rows (gate/up: row pairs) a warp takes per iteration, per format and op; pipeline stages per format
#ifndef GV_RB_W4_QKV
#define GV_RB_W4_QKV 1
#endif
#ifndef GV_RB_W4_PAIRS
#define GV_RB_W4_PAIRS 1
#endif
#ifndef GV_RB_W4_PROJ
#define GV_RB_W4_PROJ 2
#endif
#ifndef GV_NS_BF16
#define GV_NS_BF16 3
#endif
#ifndef GV_NS_W4
#define GV_NS_W4 4
#endif
#ifndef GV_MINB_BF16_GATEUP
#define GV_MINB_BF16_GATEUP 1  // 3 stages of 2 rows of K = 1536 in bf16 take 147 KB of shared memory a block
#endif

// ---- the weight formats: a row segment of 256*KV elements in a warp's ring slot --------------------------------------
// issue: lane's copies of row m, elements off .. off + 256*KV, into `slot` (chunks c >= nv zero-filled: past the end
// of the row); dot: that slot . x (lane's part).
// 16-bit weights: bf16 (F16 false) or fp16 bits; either becomes a float in one instruction an element (a shift or
// mask for bf16, HADD2.F32 for fp16), so the two run the same instruction count.
template <bool F16>
struct W16 {
    const bf16_t* W;
    static constexpr int NS = GV_NS_BF16, RB_QKV = 1, RB_PAIRS = 1, RB_PROJ = 1;
    // slot: uint4 [KV][32]: lane l's 16-byte chunk l + 32u at [u][l]
    template <int KV>
    static constexpr int row_bytes() { return 512 * KV; }

    __device__ __forceinline__ W16 rows_from(int m0, int K) const { return {W + (size_t)m0 * K}; }

    template <int KV, bool FULL>
    __device__ __forceinline__ void issue(int K, int off, int nv, int m, unsigned char* slot, int lane) const {
        const uint4* p = (const uint4*)(W + (size_t)m * K + off);
        uint4* s = (uint4*)slot + lane;
#pragma unroll
        for (int u = 0; u < KV; ++u) {
            const int c = lane + 32 * u;
            if (FULL || 32 * (u + 1) <= nv) cp_async16(s + 32 * u, p + c);  // warp-uniform: the whole row part is there
            else cp_async16z(s + 32 * u, p + (c < nv ? c : 0), c < nv ? 16 : 0);
        }
    }

    template <int KV>
    __device__ __forceinline__ float dot(const unsigned char* slot, int lane, const float (&xr)[KV][8],
                                         const float (&)[KV]) const {
        const uint4* s = (const uint4*)slot + lane;
        float acc = 0.f;
#pragma unroll
        for (int u = 0; u < KV; ++u) acc += dot8<F16>(s[32 * u], xr[u]);
        return acc;
    }
};
using Bf16W = W16<false>;
using F16W = W16<true>;

// 16 + nibble k of w, as a float, in two integer ops: the nibble placed at bits 19..22 is the mantissa of a float
// in [16, 32) (ulp 2^-19), so 0x41800000 | (n << 19) = 16 + n exactly.
__device__ __forceinline__ float w4_nib16(unsigned w, int k) {
    const unsigned t = (4 * k <= 19) ? (w << (19 - 4 * k)) : (w >> (4 * k - 19));
    return __uint_as_float(0x41800000u | (t & 0x00780000u));
}

struct Q4W {
    const unsigned* Q;
    const unsigned* SZ;
    int sbf;
    static constexpr int NS = GV_NS_W4, RB_QKV = GV_RB_W4_QKV, RB_PAIRS = GV_RB_W4_PAIRS, RB_PROJ = GV_RB_W4_PROJ;
    // slot: unsigned [KV][32] words (lane l's word l + 32u at [u][l]), then the segment's 2*KV scale|zero words
    template <int KV>
    static constexpr int row_bytes() { return 4 * (32 * KV + 2 * KV); }

    __device__ __forceinline__ Q4W rows_from(int m0, int K) const {
        return {Q + (size_t)m0 * (K / 8), SZ + (size_t)m0 * (K / 128), sbf};
    }

    template <int KV, bool FULL>
    __device__ __forceinline__ void issue(int K, int off, int nv, int m, unsigned char* slot, int lane) const {
        const unsigned* q = Q + (size_t)m * (K / 8) + off / 8;
        unsigned* s = (unsigned*)slot;
#pragma unroll
        for (int u = 0; u < KV; ++u) {
            const int c = lane + 32 * u;
            if (FULL || 32 * (u + 1) <= nv) cp_async4(s + c, q + c);  // warp-uniform
            else cp_async4z(s + c, q + (c < nv ? c : 0), c < nv ? 4 : 0);
        }
        if (lane < 2 * KV) {  // the segment's groups of 128 (16 chunks each; nv is a multiple of 16)
            const unsigned* sz = SZ + (size_t)m * (K / 128) + off / 128;
            if (FULL) {
                cp_async4(s + 32 * KV + lane, sz + lane);
            } else {
                const bool ok = 16 * lane < nv;
                cp_async4z(s + 32 * KV + lane, sz + (ok ? lane : 0), ok ? 4 : 0);
            }
        }
    }

    template <int KV>
    __device__ __forceinline__ float dot(const unsigned char* slot, int lane, const float (&xr)[KV][8],
                                         const float (&xs)[KV]) const {
        const unsigned* s = (const unsigned*)slot;
        float acc = 0.f;
#pragma unroll
        for (int u = 0; u < KV; ++u) {
            const unsigned w = s[lane + 32 * u], sz = s[32 * KV + 2 * u + (lane >> 4)];  // word 8(l+32u)/128
            // sum (16 + q_k) x_k - (16 + z) sum x_k = sum (q_k - z) x_k; the offset 16 costs ~5x float rounding at
            // most (|16 + q| <= 31 against |q - z| of a few), far inside the GEMV's fp32 error
            float d = 0.f;
#pragma unroll
            for (int k = 0; k < 8; ++k) d = fmaf(w4_nib16(w, k), xr[u][k], d);
            const float z16 = (float)(16u + ((sz >> 16) & 15u));
            acc = fmaf(w4_scale(sz, sbf), fmaf(-z16, xs[u], d), acc);
        }
        return acc;
    }
};

// ---- x in registers -----------------------------------------------------------------------------------------------
template <int KV, bool FULL, class Ld>
__device__ __forceinline__ void gv_load_x(const float* __restrict__ x, int lane, int nv, float (&xr)[KV][8]) {
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        const int c = lane + 32 * u;
        const bool ok = FULL || c < nv;
        const float4* p = (const float4*)(x + 8 * c);
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 a = ok ? Ld::ld(p) : z, b = ok ? Ld::ld(p + 1) : z;
        xr[u][0] = a.x; xr[u][1] = a.y; xr[u][2] = a.z; xr[u][3] = a.w;
        xr[u][4] = b.x; xr[u][5] = b.y; xr[u][6] = b.z; xr[u][7] = b.w;
    }
}

// per chunk: the sum of its 8 x values (the 4-bit zero-point term; unused by bf16)
template <int KV>
__device__ __forceinline__ void gv_xsum(const float (&xr)[KV][8], float (&xs)[KV]) {
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) t += xr[u][k];
        xs[u] = t;
    }
}

// ---- the three ops ------------------------------------------------------------------------------------------------
// Each warp walks its rows in iterations of RB rows (gate/up: RB row pairs) and owns a ring of F::NS slots of one
// iteration each in shared memory: the first NS - 1 iterations are issued before PDL_WAIT, then every iteration
// issues the one NS - 1 ahead before computing its own, so (NS - 1) * RB rows are in flight per warp without holding
// registers. A lane reads only what it copied itself, except the 4-bit scale words (2*KV lanes copy them):
// cp.async.wait_group + __syncwarp before each iteration's reads. Every iteration commits a group (empty past
// the warp's last row) so that wait_group<NS-2> always means "this iteration's copies have landed".
template <class F, int KV, int ROWS>
struct GvRing {
    static constexpr int kSlot = ROWS * F::template row_bytes<KV>();  // one iteration
    unsigned char* base;
    __device__ __forceinline__ unsigned char* slot(int it) const { return base + (it % F::NS) * kSlot; }
    __device__ __forceinline__ unsigned char* row(int it, int r) const {
        return slot(it) + r * F::template row_bytes<KV>();
    }
};

// dynamic shared memory of a block: GV_WARPS rings (cuda/launch.py gemv_smem_bytes says the same)
template <class F, int KV, int ROWS>
__device__ __forceinline__ GvRing<F, KV, ROWS> gv_ring(unsigned char* smem) {
    return {smem + (size_t)(threadIdx.x >> 5) * F::NS * GvRing<F, KV, ROWS>::kSlot};
}

// q/k/v (+ input RMSNorm, + bias, k/v stored as bf16 into the token's slot). K <= 256*KV (one segment).
template <class F, int KV, int RB, bool FULL, class Wait>
__device__ __forceinline__ void gemv_qkv_body(StepGrid grid, Wait wait, const float* __restrict__ x,
                                              const bf16_t* __restrict__ ln, float eps,
                                              const F W, const float* __restrict__ bias, int K, int NQ, int NKVD,
                                              float* __restrict__ q_out, bf16_t* __restrict__ kc,
                                              bf16_t* __restrict__ vc, const int* __restrict__ order,
                                              const int* __restrict__ params, int q_off, int cap, int D,
                                              unsigned char* smem) {
    const int lane = threadIdx.x & 31;
    const int nw = grid.n * GV_WARPS;
    const int N = NQ + 2 * NKVD;
    const int n0 = grid.b * GV_WARPS + (threadIdx.x >> 5);
    const int nv = K / 8;  // one segment: all of the row
    const auto ring = gv_ring<F, KV, RB>(smem);
    auto issue = [&](int it) {
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int m = n0 + (it * RB + r) * nw;
            if (m < N) W.template issue<KV, FULL>(K, 0, nv, m, ring.row(it, r), lane);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int it = 0; it < F::NS - 1; ++it) issue(it);
    // also constant inside the chunk, so read before the wait: the token's slot (the order table and params[0] come
    // from the chunk's input memcpy, which completes before the first stamp kernel, and that one is always launched
    // without PDL)
    const int slot = __ldg(order + __ldg(params) + q_off);
    wait();
    if (n0 >= N) {
        cp_async_wait<0>();
        return;
    }
    float xr[KV][8], xs[KV];
    const float inv = warp_load_x_norm<KV, FULL, Wait>(x, ln, lane, K, eps, xr);
    gv_xsum<KV>(xr, xs);
    for (int it = 0; n0 + it * RB * nw < N; ++it) {
        cp_async_wait<F::NS - 2>();
        __syncwarp();
        issue(it + F::NS - 1);
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = warp_sum(W.template dot<KV>(ring.row(it, r), lane, xr, xs)) * inv;
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int m = n0 + (it * RB + r) * nw;
                if (m >= N) break;
                const float v = acc[r] + __ldg(bias + m);
                if (m < NQ) {
                    q_out[m] = v;
                } else {
                    const int mm = (m - NQ) % NKVD, g = mm / D, d = mm % D;
                    bf16_t* dst = (m < NQ + NKVD) ? kc : vc;
                    dst[((size_t)g * cap + slot) * D + d] = f2bf(v);
                }
            }
        }
    }
    cp_async_wait<0>();
}

// act[i] = silu(Wg[i] . n(x)) * (Wu[i] . n(x)); W = [gate rows; up rows] ([2I, K]); RB row pairs an iteration
// (ring rows 2r: gate, 2r + 1: up).
template <class F, int KV, int RB, bool FULL, class Wait>
__device__ __forceinline__ void gemv_gateup_body(StepGrid grid, Wait wait, const float* __restrict__ x,
                                                 const bf16_t* __restrict__ ln,
                                                 float eps, const F W, int K, int I, float* __restrict__ act,
                                                 unsigned char* smem) {
    const int lane = threadIdx.x & 31;
    const int nw = grid.n * GV_WARPS;
    const F Wu = W.rows_from(I, K);
    const int i0 = grid.b * GV_WARPS + (threadIdx.x >> 5);
    const int nv = K / 8;  // one segment: all of the row
    const auto ring = gv_ring<F, KV, 2 * RB>(smem);
    auto issue = [&](int it) {
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int m = i0 + (it * RB + r) * nw;
            if (m < I) {
                W.template issue<KV, FULL>(K, 0, nv, m, ring.row(it, 2 * r), lane);
                Wu.template issue<KV, FULL>(K, 0, nv, m, ring.row(it, 2 * r + 1), lane);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int it = 0; it < F::NS - 1; ++it) issue(it);
    wait();
    if (i0 >= I) {
        cp_async_wait<0>();
        return;
    }
    float xr[KV][8], xs[KV];
    const float inv = warp_load_x_norm<KV, FULL, Wait>(x, ln, lane, K, eps, xr);
    gv_xsum<KV>(xr, xs);
    for (int it = 0; i0 + it * RB * nw < I; ++it) {
        cp_async_wait<F::NS - 2>();
        __syncwarp();
        issue(it + F::NS - 1);
        float ag[RB], au[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            ag[r] = warp_sum(W.template dot<KV>(ring.row(it, 2 * r), lane, xr, xs)) * inv;
            au[r] = warp_sum(Wu.template dot<KV>(ring.row(it, 2 * r + 1), lane, xr, xs)) * inv;
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int m = i0 + (it * RB + r) * nw;
                if (m < I) act[m] = ag[r] / (1.f + __expf(-ag[r])) * au[r];
            }
        }
    }
    cp_async_wait<0>();
}

// y[n] += W[n] . a (o / down projection + residual), K split into S = ceil(K / (256*KV)) segments.
template <class F, int KV, int RB, bool FULL, class Wait>
__device__ __forceinline__ void gemv_proj_body(StepGrid grid, Wait wait, const float* __restrict__ a, const F W,
                                               int K, int N,
                                               float* __restrict__ y, int S, unsigned char* smem) {
    const int lane = threadIdx.x & 31;
    const int gw = grid.b * GV_WARPS + (threadIdx.x >> 5);
    const int G = (grid.n * GV_WARPS) / S;  // warps per segment
    const int seg = gw % S, off = seg * 256 * KV;
    const int nv = min(32 * KV, (K - off) / 8);  // chunks of this segment (the last one may be partial)
    const int n0 = gw / S;
    const bool has = n0 < G && n0 < N && nv > 0;  // warp-uniform
    const auto ring = gv_ring<F, KV, RB>(smem);
    auto issue = [&](int it) {
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int m = n0 + (it * RB + r) * G;
            if (has && m < N) W.template issue<KV, FULL>(K, off, nv, m, ring.row(it, r), lane);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int it = 0; it < F::NS - 1; ++it) issue(it);
    wait();
    if (!has) {
        cp_async_wait<0>();
        return;
    }
    float xr[KV][8], xs[KV];
    gv_load_x<KV, FULL, Wait>(a + off, lane, nv, xr);
    gv_xsum<KV>(xr, xs);
    for (int it = 0; n0 + it * RB * G < N; ++it) {
        cp_async_wait<F::NS - 2>();
        __syncwarp();
        issue(it + F::NS - 1);
        float acc[RB];
#pragma unroll
        for (int r = 0; r < RB; ++r) acc[r] = warp_sum(W.template dot<KV>(ring.row(it, r), lane, xr, xs));
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int m = n0 + (it * RB + r) * G;
                if (m >= N) break;
                if (S == 1) y[m] += acc[r];
                else atomicAdd(y + m, acc[r]);
            }
        }
    }
    cp_async_wait<0>();
}

