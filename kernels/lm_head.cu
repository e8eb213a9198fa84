// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Constrained LM head + on-device argmax: final RMSNorm fused, logits over the 256 action rows only
// (the last 256 vocabulary rows of the tied embedding), then the last block to finish (atomic ticket)
// takes the argmax (first index on ties), writes the token id (vocab0 + index) and the row index that
// the next decode pass gathers its embedding from. A row holding any non-finite logit (NaN, +-inf: a forward
// pass that overflowed) gives token -1 and row index 0 (so a following decode pass still gathers a valid row);
// the flag rides on the reduction's existing barrier (__syncthreads_or). Twins: ops.rms_norm, x @ head.T,
// ops.argmax_rows.
// grid.y > 1: row y of x (stride H) in one launch, its logits at logits + y * nrows, its own ticket[y], its token in
// tokens_out[step + y]; tok_idx from row 0 only (a parallel chunk's K x 8 action rows: nothing gathers from it).
#include "common.cuh"

#define HEAD_THREADS 256

extern "C" __global__ void __launch_bounds__(HEAD_THREADS)
lm_head_argmax(const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, int H,
               const bf16_t* __restrict__ head, int nrows, float* __restrict__ logits, int* __restrict__ ticket,
               int* __restrict__ tok_idx, int* __restrict__ tokens_out, int step, int vocab0) {
    extern __shared__ float xs[];
    __shared__ float red[32];
    __shared__ float bv[HEAD_THREADS / 32];
    __shared__ int bi[HEAD_THREADS / 32];
    __shared__ int last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    x += (size_t)blockIdx.y * H;
    logits += (size_t)blockIdx.y * nrows;
    ticket += blockIdx.y;
    int rows[1];
    rows[0] = blockIdx.x * (HEAD_THREADS / 32) + warp;
    warp_prefetch_rows<1>(head, H, rows, nrows);
    PDL_ENTRY();
    norm_to_smem(x, ln, eps, H, xs, red);
    if (rows[0] < nrows) {
        float acc[1];
        warp_rows<1, 6>(head, H, rows, xs, acc);
        if (lane == 0) logits[rows[0]] = acc[0];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = (atomicAdd(ticket, 1) == (int)gridDim.x - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    float best = -INFINITY;
    int bidx = 0x7fffffff;
    int bad = 0;  // this thread saw a NaN or an inf (exponent bits all ones)
    for (int i = threadIdx.x; i < nrows; i += blockDim.x) {
        const float v = __ldcg(logits + i);
        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
        if (v > best || (v == best && i < bidx)) { best = v; bidx = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bidx, o);
        if (ov > best || (ov == best && oi < bidx)) { best = ov; bidx = oi; }
    }
    if (lane == 0) { bv[warp] = best; bi[warp] = bidx; }
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        best = bv[0]; bidx = bi[0];
        for (int w = 1; w < HEAD_THREADS / 32; ++w)
            if (bv[w] > best || (bv[w] == best && bi[w] < bidx)) { best = bv[w]; bidx = bi[w]; }
        tokens_out[step + blockIdx.y] = bad ? -1 : vocab0 + bidx;
        if (blockIdx.y == 0) tok_idx[0] = bad ? 0 : bidx;
        *ticket = 0;
    }
}
