// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Attention bodies, included by attention.cu (their own kernels) and dev/cuda/decode_persistent.cu (steps of one
// persistent kernel).
// GQA attention over the slot-addressed KV cache, RoPE applied inside from the position table (split-K
// flash-decoding on the tensor cores). Twin: ops.cache_attention (ops.apply_rope + ops.attention).
//
// Keys are stored un-rotated per slot; the key at index j of `order` has position j; query token t of this call
// has position q_start + t (q_start = params[0] + q_off, read on the device, so one CUDA graph serves every
// chunk). Query t sees keys j <= q_start + t (causal by index), except query rows t >= bidir_from, which see every
// key of this call (j < q_start + T): the parallel action queries attend to the whole frame and to each other.
// bidir_from = T gives the plain causal mask.
//
// attn_partial: a fixed grid (NKV, row blocks, splits); each block of NW warps (16 query rows a warp) takes a
// contiguous range of key indices, loads 32-key tiles of K (rotated on the fly) and V into shared memory and runs
// S = Q K^T and O += P V with mma.sync m16n8k16 bf16 (fp32 accumulate, online softmax in base 2), fragments by
// ldmatrix, Q held in registers. Software pipeline: while a tile is computed, the next tile's V lands in the other V
// buffer (cp.async) and its K and cos/sin in registers (rotated into Ks after the tile), and the order entries of the
// tile after it load. Rows = (token, head in group): the query heads of a KV head share every K/V load, and so do the
// rows of a block: the prefill's 8-warp blocks (128 rows) load and rotate each tile once for two of the partials' 64-row
// groups. Decode is T = 1 (4 warps), prefill T = 32, 40 (one parallel action) or 32 + 8 K (K actions). A tile whose
// keys every row of a warp sees (below each row's limit and k_end) skips the mask.
// Launched with Programmatic Dependent Launch in the decode passes, so the block's first tile of OLD keys
// (j < q_start) is staged into shared memory before PDL_WAIT: those keys were written before the last full
// barrier (the backend launches the stamp after the prefill and after each decode pass without PDL), and the
// order table and RoPE tables are constant inside the chunk. Keys j >= q_start and Q are read after the wait.
// attn_combine merges up to 128 split partials (log-sum-exp) into the [T, NH*D] output (fp32 and bf16).
#pragma once
#include "common.cuh"
#include "cp_async.cuh"

#define ATT_TILE 32
#define ATT_ROWS 64  // the partials' row group (attn_combine's unit); a block of NW warps computes 16 NW rows
#define NEG_BIG (-1e30f)
#define MAX_SPLITS 128

// What an attn_partial body works on: KV head g, row block rb (rows 16 NW rb .. of the call's T x group), split sp of
// nsplit; tid: its thread (0..32 NW - 1).
struct AttItem {
    int g, rb, sp, nsplit, tid;
};
// A partial body's shared memory: Q's rows, a K tile, two V tiles (double-buffered: the next tile's V lands by
// cp.async); rows of DH + 8 bf16 (16 bytes of padding: conflict-free ldmatrix). ATT_SMEM_BYTES(DH, NW) in all.
template <int DH>
struct AttTiles {
    bf16_t (*Qs)[DH + 8];
    bf16_t (*Ks)[DH + 8];
    bf16_t (*Vs)[ATT_TILE][DH + 8];
};
#define ATT_SMEM_BYTES(DH, NW) ((16 * (NW) + 3 * ATT_TILE) * ((DH) + 8) * 2)
// A combine body's shared memory: each split's max, sum and weight (MAX_SPLITS floats each).
struct AttCombineSmem {
    float *m, *l, *w;
};
// A body as its own kernel: the PDL hooks, the block barrier, and ld: how it loads what an earlier step wrote (q, the
// newest keys and values, the partials; a plain load here, __ldcg inside one persistent kernel: common.cuh PdlEntry).
struct AttOwnKernel {
    __device__ __forceinline__ void trigger() const { PDL_TRIGGER(); }
    __device__ __forceinline__ void wait() const { PDL_WAIT(); }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
    template <class T>
    __device__ __forceinline__ static T ld(const T* p) { return *p; }
    __device__ __forceinline__ static unsigned row_threads() { return blockDim.x; }  // a combine block is one row
};

// 2^x by the SFU alone (ex2.approx.ftz: exp2f adds a range fix-up for results below 2^-126, whose flush to zero
// changes nothing here: a weight under 2^-126 of the row's largest).
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// ldmatrix (8x8 b16 matrices, one row address a lane).
__device__ __forceinline__ void ldsm_x4(unsigned* d, const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(unsigned* d, const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a) : "memory");
}
// Head dim DH (64 or 128: the instances at the end), NW warps a block (THREADS threads, ROWS = 16 NW query rows):
// HALF = DH / 2 rotates against the other half, a shared-memory row is LDS = DH + 8 bf16 (16 bytes of padding:
// conflict-free ldmatrix). A 32-key K tile is 32 x HALF/8 chunk pairs (KU a thread; at DH 64 and 8 warps only the
// first half of the threads hold one: KROWS), its V tile 32 x DH/8 chunks (VU a thread); Q's ROWS rows are loaded
// QIT rows a thread.
template <int DH, int NW>
struct AttShape {
    static constexpr int THREADS = 32 * NW, ROWS = 16 * NW;
    static constexpr int HALF = DH / 2, LDS = DH + 8;
    static constexpr int CPH = HALF / 8;                                // 16-byte chunks a half-row
    static constexpr int KSTEP = THREADS / CPH;                         // rows between a thread's K pairs
    static constexpr int KU = (ATT_TILE + KSTEP - 1) / KSTEP;           // K chunk pairs a thread per tile
    static constexpr bool KROWS = KSTEP > ATT_TILE;                     // threads past the tile's rows hold none
    static constexpr int VCH = DH / 8;                                  // 16-byte chunks a V row
    static constexpr int VU = ATT_TILE * VCH / THREADS;                 // V chunks a thread per tile
    static constexpr int VSTEP = THREADS / VCH;
    static constexpr int QIT = ROWS / KSTEP;                            // Q rows a thread
    static_assert(DH == 64 || DH == 128, "head_dim 64 or 128");
    static_assert(NW == 4 || NW == 8, "4 or 8 warps");
    static_assert(VU >= 1 && QIT >= 1, "a V chunk and a Q row for every thread");
};

// One K row chunk pair (dims c*8..c*8+7 and HALF+c*8..) with its cos/sin, in registers until rotated into Ks.
struct KPre {
    uint4 lo, hi;
    float4 c0, c1, s0, s1;
};

template <int DH, class Ld>
__device__ __forceinline__ void load_k(KPre& p, const bf16_t* __restrict__ kc, const float* __restrict__ cosT,
                                       const float* __restrict__ sinT, size_t row, int j, int c) {
    constexpr int HALF = DH / 2;
    const uint4* kp = (const uint4*)(kc + row * DH);
    p.lo = Ld::ld(kp + c);
    p.hi = Ld::ld(kp + HALF / 8 + c);
    const float4* cp = (const float4*)(cosT + (size_t)j * HALF + c * 8);
    const float4* sn = (const float4*)(sinT + (size_t)j * HALF + c * 8);
    p.c0 = cp[0]; p.c1 = cp[1]; p.s0 = sn[0]; p.s1 = sn[1];
}

// Rotate (RoPE at the key's position) and store one prefetched K chunk pair into the Ks row.
template <int DH>
__device__ __forceinline__ void rope_store_k(bf16_t* krow, const KPre& p, int c) {
    constexpr int HALF = DH / 2;
    const float x1[8] = {bflo(p.lo.x), bfhi(p.lo.x), bflo(p.lo.y), bfhi(p.lo.y),
                         bflo(p.lo.z), bfhi(p.lo.z), bflo(p.lo.w), bfhi(p.lo.w)};
    const float x2[8] = {bflo(p.hi.x), bfhi(p.hi.x), bflo(p.hi.y), bfhi(p.hi.y),
                         bflo(p.hi.z), bfhi(p.hi.z), bflo(p.hi.w), bfhi(p.hi.w)};
    const float cc[8] = {p.c0.x, p.c0.y, p.c0.z, p.c0.w, p.c1.x, p.c1.y, p.c1.z, p.c1.w};
    const float ss[8] = {p.s0.x, p.s0.y, p.s0.z, p.s0.w, p.s1.x, p.s1.y, p.s1.z, p.s1.w};
    float o1[8], o2[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        o1[i] = x1[i] * cc[i] - x2[i] * ss[i];
        o2[i] = x2[i] * cc[i] + x1[i] * ss[i];
    }
    *(uint4*)&krow[c * 8] = make_uint4(pack_bf2(o1[0], o1[1]), pack_bf2(o1[2], o1[3]), pack_bf2(o1[4], o1[5]), pack_bf2(o1[6], o1[7]));
    *(uint4*)&krow[HALF + c * 8] = make_uint4(pack_bf2(o2[0], o2[1]), pack_bf2(o2[2], o2[3]), pack_bf2(o2[4], o2[5]), pack_bf2(o2[6], o2[7]));
}

// Stage the keys j of the tile [j0, j0+32) into Ks (rotated) / Vs: keys in [lo, hi) are loaded; keys >= k_end are
// zero-filled (they are masked, and V must stay finite); others are left untouched (filled by another call).
// Used for a block's first tile only (split around PDL_WAIT); later tiles are prefetched one tile ahead.
template <int DH, int NW, class Ld>
__device__ __forceinline__ void stage_tile(bf16_t (*Ks)[DH + 8], bf16_t (*Vs)[DH + 8], const bf16_t* __restrict__ kc,
                                           const bf16_t* __restrict__ vc, const int* __restrict__ order,
                                           const float* __restrict__ cosT, const float* __restrict__ sinT, int g,
                                           int cap, int j0, int lo, int hi, int k_end, int tid) {
    using A = AttShape<DH, NW>;
    constexpr int HALF = A::HALF;
    KPre kp[A::KU];
    uint4 vv[A::VU];
#pragma unroll
    for (int u = 0; u < A::KU; ++u) {
        const int e = tid + u * A::THREADS, kr = e / A::CPH, c = e % A::CPH, j = j0 + kr;
        if (kr < ATT_TILE && j >= lo && j < hi) load_k<DH, Ld>(kp[u], kc, cosT, sinT, (size_t)g * cap + order[j], j, c);
    }
#pragma unroll
    for (int u = 0; u < A::VU; ++u) {
        const int e = tid + u * A::THREADS, kr = e / A::VCH, c = e % A::VCH, j = j0 + kr;
        if (j >= lo && j < hi) vv[u] = Ld::ld((const uint4*)(vc + ((size_t)g * cap + order[j]) * DH) + c);
    }
#pragma unroll
    for (int u = 0; u < A::KU; ++u) {
        const int e = tid + u * A::THREADS, kr = e / A::CPH, c = e % A::CPH, j = j0 + kr;
        if (kr >= ATT_TILE) continue;
        if (j >= lo && j < hi) {
            rope_store_k<DH>(Ks[kr], kp[u], c);
        } else if (j >= k_end) {
            *(uint4*)&Ks[kr][c * 8] = make_uint4(0, 0, 0, 0);
            *(uint4*)&Ks[kr][HALF + c * 8] = make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int u = 0; u < A::VU; ++u) {
        const int e = tid + u * A::THREADS, kr = e / A::VCH, c = e % A::VCH, j = j0 + kr;
        if (j >= lo && j < hi) *(uint4*)&Vs[kr][c * 8] = vv[u];
        else if (j >= k_end) *(uint4*)&Vs[kr][c * 8] = make_uint4(0, 0, 0, 0);
    }
}

template <int DH, int NW, class Hooks>
__device__ __forceinline__ void attn_partial_body(
    AttItem it, Hooks hk, AttTiles<DH> sm, const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ kc,
    const bf16_t* __restrict__ vc,
    const int* __restrict__ order, const int* __restrict__ params, int q_off, int T, int group, int cap,
    const float* __restrict__ cosT, const float* __restrict__ sinT, float scale_log2, int bidir_from,
    float* __restrict__ part_o, float* __restrict__ part_ml) {
    using A = AttShape<DH, NW>;
    constexpr int HALF = A::HALF, LDS = A::LDS;
    bf16_t (*Qs)[LDS] = sm.Qs;
    bf16_t (*Ks)[LDS] = sm.Ks;
    bf16_t (*Vs)[ATT_TILE][LDS] = sm.Vs;
    hk.trigger();
    const int g = it.g, rb = it.rb, sp = it.sp;
    const int nsplit = it.nsplit;
    const int tid = it.tid, warp = tid >> 5, lane = tid & 31, r = lane >> 2, qd = lane & 3;
    const int lrow = lane & 7, lsel = lane >> 3;  // ldmatrix: this lane's row in its 8x8 matrix, and which matrix
    const int q_start = params[0] + q_off;  // params[0]: n_prefix, constant inside the chunk
    const int n_keys = q_start + T;
    const int R = T * group;
    const int nrg = (R + ATT_ROWS - 1) / ATT_ROWS;  // the partials' row groups (of the call, not of the block)

    // ---- this block's key range
    const int ntiles = (n_keys + ATT_TILE - 1) / ATT_TILE;
    const int tps = (ntiles + nsplit - 1) / nsplit;
    const int k_begin = sp * tps * ATT_TILE;
    const int k_end = min(n_keys, k_begin + tps * ATT_TILE);

    // ---- before the dependency wait: the first tile's old keys (complete before this pass began)
    if (k_begin < k_end)
        stage_tile<DH, NW, Hooks>(Ks, Vs[0], kc, vc, order, cosT, sinT, g, cap, k_begin, k_begin, min(k_end, q_start),
                              k_end,
                       tid);
    // the order entries of the second tile (order is constant inside the chunk): K rows kr0 + KSTEP u (16-byte
    // chunks ck and CPH + ck), V rows vr0 + VSTEP u (chunk cv)
    const int ck = tid % A::CPH, kr0 = tid / A::CPH, cv = tid % A::VCH, vr0 = tid / A::VCH;
    int oK[A::KU], oV[A::VU];
    {
        const int jt = k_begin + ATT_TILE;
#pragma unroll
        for (int u = 0; u < A::KU; ++u)
            oK[u] = (kr0 + A::KSTEP * u < ATT_TILE && jt + kr0 + A::KSTEP * u < k_end) ? order[jt + kr0 + A::KSTEP * u] : 0;
#pragma unroll
        for (int u = 0; u < A::VU; ++u)
            oV[u] = (jt + vr0 + A::VSTEP * u < k_end) ? order[jt + vr0 + A::VSTEP * u] : 0;
    }
    hk.wait();

    // ---- Q: rotate by the query position, scale by log2(e)/sqrt(D), to bf16 in shared memory (every load of a
    // thread issued before the first use: a thread's 4 rows share the column chunk ck)
    {
        float4 xv[A::QIT][4], cs[A::QIT][4];
#pragma unroll
        for (int it = 0; it < A::QIT; ++it) {
            const int rl = kr0 + A::KSTEP * it, rr = rb * A::ROWS + rl;
            if (rr < R) {
                const int t = rr / group, hh = rr - t * group;
                const float4* qp = (const float4*)(q + (size_t)t * q_stride + (size_t)(g * group + hh) * DH + ck * 8);
                const float4* cp = (const float4*)(cosT + (size_t)(q_start + t) * HALF + ck * 8);
                const float4* sn = (const float4*)(sinT + (size_t)(q_start + t) * HALF + ck * 8);
                xv[it][0] = hk.ld(qp); xv[it][1] = hk.ld(qp + 1);
                xv[it][2] = hk.ld(qp + HALF / 4); xv[it][3] = hk.ld(qp + HALF / 4 + 1);
                cs[it][0] = cp[0]; cs[it][1] = cp[1]; cs[it][2] = sn[0]; cs[it][3] = sn[1];
            }
        }
#pragma unroll
        for (int it = 0; it < A::QIT; ++it) {
            const int rl = kr0 + A::KSTEP * it, rr = rb * A::ROWS + rl;
            float o1[8], o2[8];
            if (rr < R) {
                const float x1[8] = {xv[it][0].x, xv[it][0].y, xv[it][0].z, xv[it][0].w,
                                     xv[it][1].x, xv[it][1].y, xv[it][1].z, xv[it][1].w};
                const float x2[8] = {xv[it][2].x, xv[it][2].y, xv[it][2].z, xv[it][2].w,
                                     xv[it][3].x, xv[it][3].y, xv[it][3].z, xv[it][3].w};
                const float cc[8] = {cs[it][0].x, cs[it][0].y, cs[it][0].z, cs[it][0].w,
                                     cs[it][1].x, cs[it][1].y, cs[it][1].z, cs[it][1].w};
                const float ss[8] = {cs[it][2].x, cs[it][2].y, cs[it][2].z, cs[it][2].w,
                                     cs[it][3].x, cs[it][3].y, cs[it][3].z, cs[it][3].w};
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    o1[i] = (x1[i] * cc[i] - x2[i] * ss[i]) * scale_log2;
                    o2[i] = (x2[i] * cc[i] + x1[i] * ss[i]) * scale_log2;
                }
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) o1[i] = o2[i] = 0.f;
            }
            *(uint4*)&Qs[rl][ck * 8] = make_uint4(pack_bf2(o1[0], o1[1]), pack_bf2(o1[2], o1[3]), pack_bf2(o1[4], o1[5]), pack_bf2(o1[6], o1[7]));
            *(uint4*)&Qs[rl][HALF + ck * 8] = make_uint4(pack_bf2(o2[0], o2[1]), pack_bf2(o2[2], o2[3]), pack_bf2(o2[4], o2[5]), pack_bf2(o2[6], o2[7]));
        }
    }
    // ---- after the wait: the first tile's new keys (j >= q_start), written by the previous kernel
    if (k_begin < k_end && k_begin + ATT_TILE > q_start && k_end > q_start)
        stage_tile<DH, NW, Hooks>(Ks, Vs[0], kc, vc, order, cosT, sinT, g, cap, k_begin, max(k_begin, q_start), k_end,
                              k_end,
                       tid);
    hk.sync();

    const bool active = (rb * A::ROWS + warp * 16) < R;
    // the warp's Q as A fragments, held in registers for every tile
    unsigned qf[DH / 16][4];
    if (active) {
#pragma unroll
        for (int ks = 0; ks < DH / 16; ++ks) ldsm_x4(qf[ks], &Qs[warp * 16 + lrow + (lsel & 1) * 8][ks * 16 + (lsel >> 1) * 8]);
    }
    float m0 = NEG_BIG, m1 = NEG_BIG, l0 = 0.f, l1 = 0.f;
    float O[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.f;
    const int rowA = rb * A::ROWS + warp * 16 + r, rowB = rowA + 8;
    const int tA = rowA / group, tB = rowB / group;
    const int limA = rowA < R ? (tA >= bidir_from ? n_keys - 1 : q_start + tA) : -1;
    const int limB = rowB < R ? (tB >= bidir_from ? n_keys - 1 : q_start + tB) : -1;
    const int wlim = __reduce_min_sync(0xffffffffu, min(limA, limB));  // the warp's lowest key limit

    int buf = 0;
    for (int j0 = k_begin; j0 < k_end; j0 += ATT_TILE, buf ^= 1) {
        // ---- issue the next tile's loads (V by cp.async into the other buffer, K + cos/sin into registers) and
        // the order entries of the tile after it; they land while this tile is computed
        const int jn = j0 + ATT_TILE;
        const bool nxt = jn < k_end;  // block-uniform
        KPre kp[A::KU];
        if (nxt) {
#pragma unroll
            for (int u = 0; u < A::VU; ++u) {
                const int j = jn + vr0 + A::VSTEP * u;
                bf16_t* dst = &Vs[buf ^ 1][vr0 + A::VSTEP * u][cv * 8];
                if (j < k_end) cp_async16z(dst, vc + ((size_t)g * cap + oV[u]) * DH + cv * 8, 16);
                else cp_async16z(dst, vc, 0);
            }
            cp_async_commit();
#pragma unroll
            for (int u = 0; u < A::KU; ++u) {
                const int j = jn + kr0 + A::KSTEP * u;
                if ((!A::KROWS || kr0 < ATT_TILE) && j < k_end)
                    load_k<DH, Hooks>(kp[u], kc, cosT, sinT, (size_t)g * cap + oK[u], j, ck);
            }
            const int jt = jn + ATT_TILE;
#pragma unroll
            for (int u = 0; u < A::KU; ++u)
                oK[u] = (kr0 + A::KSTEP * u < ATT_TILE && jt + kr0 + A::KSTEP * u < k_end) ? order[jt + kr0 + A::KSTEP * u] : 0;
#pragma unroll
            for (int u = 0; u < A::VU; ++u)
                oV[u] = (jt + vr0 + A::VSTEP * u < k_end) ? order[jt + vr0 + A::VSTEP * u] : 0;
        }

        if (active) {
            const bf16_t (*Vb)[LDS] = Vs[buf];
            float S[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < DH / 16; ++ks) {
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    unsigned b[4];
                    ldsm_x4(b, &Ks[(2 * p + (lsel >> 1)) * 8 + lrow][ks * 16 + (lsel & 1) * 8]);
                    mma_bf16_16816(S[2 * p], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[0], b[1]);
                    mma_bf16_16816(S[2 * p + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[2], b[3]);
                }
            }
            float mx0 = NEG_BIG, mx1 = NEG_BIG;
            if (j0 + ATT_TILE <= k_end && j0 + ATT_TILE - 1 <= wlim) {  // warp-uniform: every key of the tile is seen
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    mx0 = fmaxf(mx0, fmaxf(S[nt][0], S[nt][1]));
                    mx1 = fmaxf(mx1, fmaxf(S[nt][2], S[nt][3]));
                }
            } else {
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
            }
#pragma unroll
            for (int o = 1; o <= 2; o <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
            }
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            // O is rescaled every tile: skipping it when no row's max grew (a warp vote and a branch) measured 5-7 %
            // slower at head dim 128 (the FMULs no longer fill the exponentials' latency; BENCHMARKS.md, issue 41)
            const float cr0 = exp2_approx(m0 - mn0), cr1 = exp2_approx(m1 - mn1);
            m0 = mn0;
            m1 = mn1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                S[nt][0] = exp2_approx(S[nt][0] - mn0);
                S[nt][1] = exp2_approx(S[nt][1] - mn0);
                S[nt][2] = exp2_approx(S[nt][2] - mn1);
                S[nt][3] = exp2_approx(S[nt][3] - mn1);
                ps0 += S[nt][0] + S[nt][1];
                ps1 += S[nt][2] + S[nt][3];
            }
            l0 = l0 * cr0 + ps0;
            l1 = l1 * cr1 + ps1;
#pragma unroll
            for (int nd = 0; nd < DH / 8; ++nd) {
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
#pragma unroll
                for (int p = 0; p < DH / 16; ++p) {
                    unsigned b[4];
                    ldsm_x4_t(b, &Vb[kk * 16 + (lsel & 1) * 8 + lrow][(2 * p + (lsel >> 1)) * 8]);
                    mma_bf16_16816(O[2 * p], a0, a1, a2, a3, b[0], b[1]);
                    mma_bf16_16816(O[2 * p + 1], a0, a1, a2, a3, b[2], b[3]);
                }
            }
        }
        hk.sync();  // every warp is done with Ks and Vs[buf]
        if (nxt) {
            // ---- the next tile's K: rotate and store (zeros past k_end); its V has landed once the group is waited
#pragma unroll
            for (int u = 0; u < A::KU; ++u) {
                const int kr = kr0 + A::KSTEP * u, j = jn + kr;
                if (A::KROWS && kr0 >= ATT_TILE) continue;
                if (j < k_end) {
                    rope_store_k<DH>(Ks[kr], kp[u], ck);
                } else {
                    *(uint4*)&Ks[kr][ck * 8] = make_uint4(0, 0, 0, 0);
                    *(uint4*)&Ks[kr][HALF + ck * 8] = make_uint4(0, 0, 0, 0);
                }
            }
            cp_async_wait<0>();
            hk.sync();
        }
    }

    if (!active) return;
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    }
    const int w0 = rb * A::ROWS + warp * 16;  // the warp's first row: partial row group w0 / 64, row w0 % 64 + r
    const size_t pb = ((size_t)(g * nrg + w0 / ATT_ROWS) * nsplit + sp) * ATT_ROWS + w0 % ATT_ROWS + r;
    if (qd == 0) {
        part_ml[pb * 2] = m0;
        part_ml[pb * 2 + 1] = l0;
        part_ml[(pb + 8) * 2] = m1;
        part_ml[(pb + 8) * 2 + 1] = l1;
    }
#pragma unroll
    for (int nd = 0; nd < DH / 8; ++nd) {
        *(float2*)&part_o[pb * DH + nd * 8 + qd * 2] = make_float2(O[nd][0], O[nd][1]);
        *(float2*)&part_o[(pb + 8) * DH + nd * 8 + qd * 2] = make_float2(O[nd][2], O[nd][3]);
    }
}

// One row (query head) per DH threads (d: this thread's head dim; hk.row_threads(): the row's threads, DH).
// out_bf (the o GEMM's input) as bf16, or fp16 when F16 (attn_combine_h_<D>: the 4-bit GEMM's fp16 instances; the
// output is a convex combination of the cached V rows, so it fits fp16 wherever they do).
template <int DH, class Hooks, bool F16 = false>
__device__ __forceinline__ void attn_combine_body(int rowid, int d, Hooks hk, AttCombineSmem cs,
                                                  const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                                  int nrg, int nsplit, int T, int group, int out_stride,
                                                  float* __restrict__ out, bf16_t* __restrict__ out_bf) {
    float* sm = cs.m;
    float* sl = cs.l;
    float* sw = cs.w;
    hk.trigger();
    hk.wait();
    const int rl = rowid % ATT_ROWS, grg = rowid / ATT_ROWS;
    const int g = grg / nrg, rg = grg - g * nrg;
    const int rr = rg * ATT_ROWS + rl;
    if (rr >= T * group) return;
    const int t = rr / group, hh = rr - t * group;
    const size_t base = (size_t)grg * nsplit * ATT_ROWS + rl;
    for (int s = d; s < nsplit; s += hk.row_threads()) {
        const size_t pi = base + (size_t)s * ATT_ROWS;
        sm[s] = hk.ld(part_ml + pi * 2);
        sl[s] = hk.ld(part_ml + pi * 2 + 1);
    }
    hk.sync();
    float M = NEG_BIG;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, sm[s]);
    for (int s = d; s < nsplit; s += hk.row_threads()) sw[s] = exp2f(sm[s] - M);
    hk.sync();
    float L = 0.f, acc = 0.f;
#pragma unroll 16
    for (int s = 0; s < nsplit; ++s) {
        const float w = sw[s];
        L = fmaf(w, sl[s], L);
        acc = fmaf(w, hk.ld(part_o + (base + (size_t)s * ATT_ROWS) * DH + d), acc);
    }
    const float v = acc / L;
    const size_t oi = (size_t)t * out_stride + (size_t)(g * group + hh) * DH + d;
    out[oi] = v;
    if (out_bf != nullptr) out_bf[oi] = f2act<F16>(v);
}

