// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// GQA attention over the slot-addressed KV cache, RoPE applied inside from the position table (split-K
// flash-decoding on the tensor cores). Twins: ops.apply_rope + ops.attention.
//
// Keys are stored un-rotated per slot; the key at index j of `order` has position j; query token t of this call
// has position q_start + t (q_start = params[0] + q_off, read on the device, so one CUDA graph serves every
// chunk). Query t sees keys j <= q_start + t (causal by index), except query rows t >= bidir_from, which see every
// key of this call (j < q_start + T): the parallel action queries attend to the whole frame and to each other.
// bidir_from = T gives the plain causal mask.
//
// attn_partial: a fixed grid (NKV, row groups, splits); each block takes a contiguous range of key indices, loads
// 32-key tiles of K (rotated on the fly) and V into shared memory and runs S = Q K^T and O += P V with
// mma.sync m16n8k16 bf16 (fp32 accumulate, online softmax in base 2). Rows = (token, head in group): the query
// heads of a KV head share every K/V load. Decode is T = 1, prefill T = 32 (40 with parallel action queries).
// Launched with Programmatic Dependent Launch in the decode passes, so the block's first tile of OLD keys
// (j < q_start) is staged into shared memory before PDL_WAIT: those keys were written before the last full
// barrier (the backend launches the stamp after the prefill and after each decode pass without PDL), and the
// order table and RoPE tables are constant inside the chunk. Keys j >= q_start and Q are read after the wait.
// attn_combine merges up to 128 split partials (log-sum-exp) into the [T, NH*D] output (fp32 and bf16).
#include "common.cuh"

#define DH 128
#define HALF 64
#define LDS (DH + 8)
#define ATT_TILE 32
#define ATT_ROWS 64
#define NEG_BIG (-1e30f)
#define MAX_SPLITS 128

__device__ __forceinline__ unsigned ld_u32(const bf16_t* p) { return *(const unsigned*)p; }

// Stage the keys j of the tile [j0, j0+32) into Ks (rotated) / Vs: keys in [lo, hi) are loaded; keys >= k_end are
// zero-filled (they are masked, and V must stay finite); others are left untouched (filled by another call).
__device__ __forceinline__ void stage_tile(bf16_t (*Ks)[LDS], bf16_t (*Vs)[LDS], const bf16_t* __restrict__ kc,
                                           const bf16_t* __restrict__ vc, const int* __restrict__ order,
                                           const float* __restrict__ cosT, const float* __restrict__ sinT, int g,
                                           int cap, int j0, int lo, int hi, int k_end, int tid) {
    uint4 klo[2], khi[2], vv[4];
    float4 cs[2][4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int e = tid + u * 128, kr = e >> 3, c = e & 7, j = j0 + kr;
        if (j >= lo && j < hi) {
            const uint4* kp = (const uint4*)(kc + ((size_t)g * cap + order[j]) * DH);
            klo[u] = kp[c];
            khi[u] = kp[8 + c];
            const float4* cp = (const float4*)(cosT + (size_t)j * HALF + c * 8);
            const float4* sn = (const float4*)(sinT + (size_t)j * HALF + c * 8);
            cs[u][0] = cp[0]; cs[u][1] = cp[1]; cs[u][2] = sn[0]; cs[u][3] = sn[1];
        }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int e = tid + u * 128, kr = e >> 4, c = e & 15, j = j0 + kr;
        if (j >= lo && j < hi) vv[u] = ((const uint4*)(vc + ((size_t)g * cap + order[j]) * DH))[c];
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int e = tid + u * 128, kr = e >> 3, c = e & 7, j = j0 + kr;
        if (j >= lo && j < hi) {
            const float x1[8] = {bflo(klo[u].x), bfhi(klo[u].x), bflo(klo[u].y), bfhi(klo[u].y),
                                 bflo(klo[u].z), bfhi(klo[u].z), bflo(klo[u].w), bfhi(klo[u].w)};
            const float x2[8] = {bflo(khi[u].x), bfhi(khi[u].x), bflo(khi[u].y), bfhi(khi[u].y),
                                 bflo(khi[u].z), bfhi(khi[u].z), bflo(khi[u].w), bfhi(khi[u].w)};
            const float cc[8] = {cs[u][0].x, cs[u][0].y, cs[u][0].z, cs[u][0].w, cs[u][1].x, cs[u][1].y, cs[u][1].z, cs[u][1].w};
            const float ss[8] = {cs[u][2].x, cs[u][2].y, cs[u][2].z, cs[u][2].w, cs[u][3].x, cs[u][3].y, cs[u][3].z, cs[u][3].w};
            float o1[8], o2[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                o1[i] = x1[i] * cc[i] - x2[i] * ss[i];
                o2[i] = x2[i] * cc[i] + x1[i] * ss[i];
            }
            *(uint4*)&Ks[kr][c * 8] = make_uint4(pack_bf2(o1[0], o1[1]), pack_bf2(o1[2], o1[3]), pack_bf2(o1[4], o1[5]), pack_bf2(o1[6], o1[7]));
            *(uint4*)&Ks[kr][HALF + c * 8] = make_uint4(pack_bf2(o2[0], o2[1]), pack_bf2(o2[2], o2[3]), pack_bf2(o2[4], o2[5]), pack_bf2(o2[6], o2[7]));
        } else if (j >= k_end) {
            *(uint4*)&Ks[kr][c * 8] = make_uint4(0, 0, 0, 0);
            *(uint4*)&Ks[kr][HALF + c * 8] = make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int e = tid + u * 128, kr = e >> 4, c = e & 15, j = j0 + kr;
        if (j >= lo && j < hi) *(uint4*)&Vs[kr][c * 8] = vv[u];
        else if (j >= k_end) *(uint4*)&Vs[kr][c * 8] = make_uint4(0, 0, 0, 0);
    }
}

extern "C" __global__ void __launch_bounds__(128)
attn_partial(const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ kc,
                const bf16_t* __restrict__ vc, const int* __restrict__ order, const int* __restrict__ params, int q_off,
                int T, int group, int cap, const float* __restrict__ cosT, const float* __restrict__ sinT,
                float scale_log2, int bidir_from, float* __restrict__ part_o, float* __restrict__ part_ml) {
    __shared__ __align__(16) bf16_t Qs[ATT_ROWS][LDS];
    __shared__ __align__(16) bf16_t Ks[ATT_TILE][LDS];
    __shared__ __align__(16) bf16_t Vs[ATT_TILE][LDS];
    PDL_TRIGGER();
    const int g = blockIdx.x, rg = blockIdx.y, sp = blockIdx.z;
    const int nrg = gridDim.y, nsplit = gridDim.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r = lane >> 2, qd = lane & 3;
    const int q_start = params[0] + q_off;  // params[0]: n_prefix, constant inside the chunk
    const int n_keys = q_start + T;
    const int R = T * group;

    // ---- this block's key range
    const int ntiles = (n_keys + ATT_TILE - 1) / ATT_TILE;
    const int tps = (ntiles + nsplit - 1) / nsplit;
    const int k_begin = sp * tps * ATT_TILE;
    const int k_end = min(n_keys, k_begin + tps * ATT_TILE);

    // ---- before the dependency wait: the first tile's old keys (complete before this pass began)
    if (k_begin < k_end)
        stage_tile(Ks, Vs, kc, vc, order, cosT, sinT, g, cap, k_begin, k_begin, min(k_end, q_start), k_end, tid);
    PDL_WAIT();

    // ---- Q: rotate by the query position, scale by log2(e)/sqrt(D), to bf16 in shared memory
    for (int e = tid; e < ATT_ROWS * 8; e += 128) {
        const int rl = e >> 3, c = e & 7, rr = rg * ATT_ROWS + rl;
        float o1[8], o2[8];
        if (rr < R) {
            const int t = rr / group, hh = rr - t * group;
            const float* qp = q + (size_t)t * q_stride + (size_t)(g * group + hh) * DH + c * 8;
            const float* cp = cosT + (size_t)(q_start + t) * HALF + c * 8;
            const float* sn = sinT + (size_t)(q_start + t) * HALF + c * 8;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float x1 = qp[i], x2 = qp[HALF + i], cc = cp[i], ss = sn[i];
                o1[i] = (x1 * cc - x2 * ss) * scale_log2;
                o2[i] = (x2 * cc + x1 * ss) * scale_log2;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) o1[i] = o2[i] = 0.f;
        }
        uint4 u1 = make_uint4(pack_bf2(o1[0], o1[1]), pack_bf2(o1[2], o1[3]), pack_bf2(o1[4], o1[5]), pack_bf2(o1[6], o1[7]));
        uint4 u2 = make_uint4(pack_bf2(o2[0], o2[1]), pack_bf2(o2[2], o2[3]), pack_bf2(o2[4], o2[5]), pack_bf2(o2[6], o2[7]));
        *(uint4*)&Qs[rl][c * 8] = u1;
        *(uint4*)&Qs[rl][HALF + c * 8] = u2;
    }
    // ---- after the wait: the first tile's new keys (j >= q_start), written by the previous kernel
    if (k_begin < k_end && k_begin + ATT_TILE > q_start && k_end > q_start)
        stage_tile(Ks, Vs, kc, vc, order, cosT, sinT, g, cap, k_begin, max(k_begin, q_start), k_end, k_end, tid);

    const bool active = (rg * ATT_ROWS + warp * 16) < R;
    float m0 = NEG_BIG, m1 = NEG_BIG, l0 = 0.f, l1 = 0.f;
    float O[16][4];
#pragma unroll
    for (int i = 0; i < 16; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.f;
    const int rowA = rg * ATT_ROWS + warp * 16 + r, rowB = rowA + 8;
    const int tA = rowA / group, tB = rowB / group;
    const int limA = rowA < R ? (tA >= bidir_from ? n_keys - 1 : q_start + tA) : -1;
    const int limB = rowB < R ? (tB >= bidir_from ? n_keys - 1 : q_start + tB) : -1;

    for (int j0 = k_begin; j0 < k_end; j0 += ATT_TILE) {
        if (j0 != k_begin) stage_tile(Ks, Vs, kc, vc, order, cosT, sinT, g, cap, j0, j0, k_end, k_end, tid);
        __syncthreads();

        if (active) {
            float S[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.f;
            const int qr = warp * 16 + r;
#pragma unroll
            for (int ks = 0; ks < DH / 16; ++ks) {
                const int kc0 = ks * 16 + qd * 2;
                const unsigned a0 = ld_u32(&Qs[qr][kc0]), a1 = ld_u32(&Qs[qr + 8][kc0]);
                const unsigned a2 = ld_u32(&Qs[qr][kc0 + 8]), a3 = ld_u32(&Qs[qr + 8][kc0 + 8]);
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const unsigned b0 = ld_u32(&Ks[nt * 8 + r][kc0]), b1 = ld_u32(&Ks[nt * 8 + r][kc0 + 8]);
                    mma_bf16_16816(S[nt], a0, a1, a2, a3, b0, b1);
                }
            }
            float mx0 = NEG_BIG, mx1 = NEG_BIG;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = j0 + nt * 8 + qd * 2 + (e & 1);
                    const int lim = (e < 2) ? limA : limB;
                    const bool ok = (j < k_end) && (j <= lim);
                    S[nt][e] = ok ? S[nt][e] : -INFINITY;
                    if (e < 2) mx0 = fmaxf(mx0, S[nt][e]);
                    else mx1 = fmaxf(mx1, S[nt][e]);
                }
#pragma unroll
            for (int o = 1; o <= 2; o <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
            }
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            const float cr0 = exp2f(m0 - mn0), cr1 = exp2f(m1 - mn1);
            m0 = mn0;
            m1 = mn1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                S[nt][0] = exp2f(S[nt][0] - mn0);
                S[nt][1] = exp2f(S[nt][1] - mn0);
                S[nt][2] = exp2f(S[nt][2] - mn1);
                S[nt][3] = exp2f(S[nt][3] - mn1);
                ps0 += S[nt][0] + S[nt][1];
                ps1 += S[nt][2] + S[nt][3];
            }
            l0 = l0 * cr0 + ps0;
            l1 = l1 * cr1 + ps1;
#pragma unroll
            for (int nd = 0; nd < 16; ++nd) {
                O[nd][0] *= cr0;
                O[nd][1] *= cr0;
                O[nd][2] *= cr1;
                O[nd][3] *= cr1;
            }
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                const unsigned a0 = pack_bf2(S[2 * kk][0], S[2 * kk][1]);
                const unsigned a1 = pack_bf2(S[2 * kk][2], S[2 * kk][3]);
                const unsigned a2 = pack_bf2(S[2 * kk + 1][0], S[2 * kk + 1][1]);
                const unsigned a3 = pack_bf2(S[2 * kk + 1][2], S[2 * kk + 1][3]);
                const int kr0 = kk * 16 + qd * 2;
#pragma unroll
                for (int nd = 0; nd < 16; ++nd) {
                    const int col = nd * 8 + r;
                    const unsigned b0 = (unsigned)Vs[kr0][col] | ((unsigned)Vs[kr0 + 1][col] << 16);
                    const unsigned b1 = (unsigned)Vs[kr0 + 8][col] | ((unsigned)Vs[kr0 + 9][col] << 16);
                    mma_bf16_16816(O[nd], a0, a1, a2, a3, b0, b1);
                }
            }
        }
        __syncthreads();
    }
    if (k_begin >= k_end) __syncthreads();  // (no tile) Qs writes done before exit: nothing else to order

    if (!active) return;
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    }
    const size_t pb = ((size_t)(g * nrg + rg) * nsplit + sp) * ATT_ROWS + warp * 16 + r;
    if (qd == 0) {
        part_ml[pb * 2] = m0;
        part_ml[pb * 2 + 1] = l0;
        part_ml[(pb + 8) * 2] = m1;
        part_ml[(pb + 8) * 2 + 1] = l1;
    }
#pragma unroll
    for (int nd = 0; nd < 16; ++nd) {
        *(float2*)&part_o[pb * DH + nd * 8 + qd * 2] = make_float2(O[nd][0], O[nd][1]);
        *(float2*)&part_o[(pb + 8) * DH + nd * 8 + qd * 2] = make_float2(O[nd][2], O[nd][3]);
    }
}

// One block per row (128 threads = head dims).
extern "C" __global__ void __launch_bounds__(128)
attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, int nrg, int nsplit, int T,
                int group, int out_stride, float* __restrict__ out, bf16_t* __restrict__ out_bf) {
    __shared__ float sm[MAX_SPLITS], sl[MAX_SPLITS], sw[MAX_SPLITS];
    PDL_ENTRY();
    const int rowid = blockIdx.x, d = threadIdx.x;
    const int rl = rowid % ATT_ROWS, grg = rowid / ATT_ROWS;
    const int g = grg / nrg, rg = grg - g * nrg;
    const int rr = rg * ATT_ROWS + rl;
    if (rr >= T * group) return;
    const int t = rr / group, hh = rr - t * group;
    const size_t base = (size_t)grg * nsplit * ATT_ROWS + rl;
    for (int s = d; s < nsplit; s += blockDim.x) {
        const size_t pi = base + (size_t)s * ATT_ROWS;
        sm[s] = part_ml[pi * 2];
        sl[s] = part_ml[pi * 2 + 1];
    }
    __syncthreads();
    float M = NEG_BIG;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, sm[s]);
    for (int s = d; s < nsplit; s += blockDim.x) sw[s] = exp2f(sm[s] - M);
    __syncthreads();
    float L = 0.f, acc = 0.f;
#pragma unroll 16
    for (int s = 0; s < nsplit; ++s) {
        const float w = sw[s];
        L = fmaf(w, sl[s], L);
        acc = fmaf(w, part_o[(base + (size_t)s * ATT_ROWS) * DH + d], acc);
    }
    const float v = acc / L;
    const size_t oi = (size_t)t * out_stride + (size_t)(g * group + hh) * DH + d;
    out[oi] = v;
    if (out_bf != nullptr) out_bf[oi] = f2bf(v);
}
