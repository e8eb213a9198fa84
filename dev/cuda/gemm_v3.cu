// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// SUPERSEDED (2026-12-01, issue 29): kernels/gemm.cu as of commit 9d959f4, kept for its 4-bit body (X the MMA's A
// operand, 48 padded rows, the group scale applied to a second set of fp32 accumulators: 168 registers, 2 warps a
// scheduler). Replaced by the weights-as-A 4-bit body; on 8 SMs of an H200 the four 48-row GEMMs of a 1.5B layer
// took 504.7 us here vs 297.2 us (dev/cuda/gemm_micro.py --sms 8 --rows 48; BENCHMARKS.md, issue 29). Its launcher is
// cuda/launch.py of that commit (GEMM_CFG w4 {"nt": 4, "kw": 2, "stages": 4}, instance gemm_w4_t48): measure it from
// a `git archive 9d959f4` tree.
// Prefill projections on the tensor cores, one body for both weight formats (the format is a policy):
//   Y[T, N] (=|+=) X[T, K] . W[N, K]^T       (mode 0: store; mode 1: fp32 atomics, split-K, residual/bias fused)
//   act[T, N/2] = silu(X . Wg^T) * (X . Wu^T) (mode 2: gate/up + SwiGLU fused; W = [gate rows; up rows], no split)
// T = 32 rows (gemm_<fmt>_t32) or 48 (gemm_<fmt>_t48: 32 vision tokens + 8 parallel action queries + zero rows).
// X bf16 (normalised activations); W bf16 [N, K] (HF [out, in]) or 4-bit (Q uint32 [N, K/8] nibbles, SZ uint32
// [N, K/128] scale bits | zero << 16, as gemv.cu); fp32 accumulation with mma.sync m16n8k16.
// Twins: ops.linear (on QuantTensor.dequantize() for 4-bit), ops.silu_mul for mode 2.
//
// Structure (W4A16 in the Marlin manner: the weights are dequantized inside a pipelined tensor-core loop):
// a block owns NB = 32 * NT W rows (a warp 8 * NT: NT n-tiles of 8; bf16 NT = 2, 4-bit NT = 4) and a K range
// (grid.y splits K); bf16: 4 warps, 4-bit: 8 warps in two groups along K (KW below). Each 64-wide chunk's X tile
// (T x 64 bf16) and W tile (NB rows x 64: 128 B a row bf16, 32 B of nibbles + 4 B of scale|zero) are copied
// global -> shared with cp.async, STAGES stages deep, so a block keeps three stages of weights in flight while it
// multiplies the fourth, and the warps share one copy of X. Fragments are read from shared memory with 16-byte
// loads (X and bf16 W tiles XOR-swizzled by row, conflict-free). K is permuted consistently for A and B inside each chunk:
// lane q of a row takes the chunk's elements 16q..16q+15 (two 16-byte words), mma step s uses elements
// 4s..4s+3 of those (the dot product does not depend on the order of k).
// 4-bit: B = (q - z) converted exactly to bf16 (w4_pair: nibbles i, i+4 of a word as one bf16 pair, the A words
// regrouped to match), the group scale applied to the fp32 accumulators once per chunk (a chunk never straddles a
// 128-group): acc += s[n] * (X . (q - z)).
#include "common.cuh"

// Per-format shape (cuda/launch.py GEMM_CFG mirrors these; dev/cuda/gemm_micro.py sweeps them with -D):
// NT n-tiles of 8 W rows a warp (a block: 4 warps along N, NB = 32 * NT rows), KW warp groups of 4 along K,
// STAGES cp.async stages, MINB the blocks an SM must hold (__launch_bounds__: caps the registers).
#ifndef GEMM_NT_BF16
#define GEMM_NT_BF16 2
#endif
#ifndef GEMM_KW_BF16
#define GEMM_KW_BF16 1
#endif
#ifndef GEMM_STAGES_BF16
#define GEMM_STAGES_BF16 4
#endif
#ifndef GEMM_MINB_BF16
#define GEMM_MINB_BF16 1
#endif
#ifndef GEMM_NT_W4
#define GEMM_NT_W4 4
#endif
#ifndef GEMM_KW_W4
#define GEMM_KW_W4 2
#endif
#ifndef GEMM_STAGES_W4
#define GEMM_STAGES_W4 4
#endif
#ifndef GEMM_MINB_W4_T32
#define GEMM_MINB_W4_T32 2  // 32 rows: two 8-warp blocks an SM (124 registers, no spill) measured faster
#endif
#ifndef GEMM_MINB_W4_T48
#define GEMM_MINB_W4_T48 1  // 48 rows: a cap of 128 registers spills (168 needed)
#endif

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Word i (0..7) of a lane's 16 k-values held as two uint4: the bf16 pair of elements 2i, 2i+1.
__device__ __forceinline__ unsigned word_of(const uint4& a, const uint4& b, int i) {
    const uint4& v = i < 4 ? a : b;
    const int j = i & 3;
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// The weight formats. W_UNITS / S_UNITS: 16-byte units of a stage's W tile / scale|zero tile.
// KW: warp groups along K (4 warps each); a stage holds KW consecutive chunks, group h multiplies chunk h of it, and
// the groups' sums are added in shared memory at the end. The 4-bit body has more ALU work per weight byte (the
// dequantization) and one 4-warp block per SM left one warp per scheduler, stalled on every dependency.
struct FmtBf16 {
    static constexpr int NT = GEMM_NT_BF16, NB = 32 * NT, KW = GEMM_KW_BF16, STAGES = GEMM_STAGES_BF16;
    static constexpr int W_UNITS = NB * 8;  // NB rows x 128 bytes
    static constexpr int S_UNITS = 0;
};
struct FmtW4 {
    static constexpr int NT = GEMM_NT_W4, NB = 32 * NT, KW = GEMM_KW_W4, STAGES = GEMM_STAGES_W4;
    static constexpr int W_UNITS = NB * 2;  // NB rows x 32 bytes of nibbles
    static constexpr int S_UNITS = NB / 4;  // NB words of scale|zero
    static_assert(NT >= 2, "a 4-bit W tile needs 128 threads' worth of 16-byte units");
};

// The W row that block-local row l stands for: consecutive rows, or in mode 2 the warp's n-tiles 0 .. NT/2-1 are
// gate rows and NT/2 .. NT-1 the up rows of the same 4 * NT outputs (so one lane holds g and u of the same element).
template <class F>
__device__ __forceinline__ int w_row(int l, int mode, int N) {
    if (mode != 2) return blockIdx.x * F::NB + l;
    constexpr int HT = F::NT / 2;
    const int w = l / (8 * F::NT), j = (l >> 3) % F::NT, r = l & 7;
    return (j >= HT ? (N >> 1) : 0) + blockIdx.x * (F::NB / 2) + w * (4 * F::NT) + (j % HT) * 8 + r;
}

// One chunk (64 k) of X, W (and scale|zero) into st, by the 128 threads of warp group threadIdx.x / 128.
template <class F, int MT>
__device__ __forceinline__ void load_chunk(uint4* st, const bf16_t* __restrict__ X, const void* __restrict__ W,
                                           const unsigned* __restrict__ SZ, int N, int K, int mode, int c) {
    const int tid = threadIdx.x & 127;
    const int k0 = c * 64;
#pragma unroll
    for (int i = 0; i < (16 * MT * 8) / 128; ++i) {  // X tile, rows x 8 units, swizzled
        const int idx = tid + i * 128, r = idx >> 3, u = idx & 7;
        cp_async16(st + r * 8 + (u ^ (r & 7)), X + (size_t)r * K + k0 + u * 8);
    }
    uint4* ws = st + 16 * MT * 8;
    if (F::S_UNITS == 0) {
        const bf16_t* Wb = (const bf16_t*)W;
#pragma unroll
        for (int i = 0; i < F::W_UNITS / 128; ++i) {
            const int idx = tid + i * 128, l = idx >> 3, u = idx & 7;
            cp_async16(ws + l * 8 + (u ^ (l & 7)), Wb + (size_t)w_row<F>(l, mode, N) * K + k0 + u * 8);
        }
    } else {
        const unsigned* Q = (const unsigned*)W;
#pragma unroll
        for (int i = 0; i < F::W_UNITS / 128; ++i) {
            const int idx = tid + i * 128, l = idx >> 1, u = idx & 1;
            cp_async16(ws + idx, Q + (size_t)w_row<F>(l, mode, N) * (K >> 3) + (k0 >> 3) + u * 4);
        }
        unsigned* ss = (unsigned*)(ws + F::W_UNITS);
        cp_async4(ss + tid, SZ + (size_t)w_row<F>(tid, mode, N) * (K >> 7) + (k0 >> 7));
    }
}

template <class F, int MT>
constexpr int chunk_units() { return 16 * MT * 8 + F::W_UNITS + F::S_UNITS; }

// Stage cs = chunks cs*KW .. cs*KW+KW-1; warp group h loads chunk cs*KW + h into part h of the stage.
template <class F, int MT>
__device__ __forceinline__ void load_stage(uint4* st, const bf16_t* __restrict__ X, const void* __restrict__ W,
                                           const unsigned* __restrict__ SZ, int N, int K, int mode, int cs) {
    const int h = threadIdx.x >> 7;
    load_chunk<F, MT>(st + h * chunk_units<F, MT>(), X, W, SZ, N, K, mode, cs * F::KW + h);
}

template <int MT>
__device__ __forceinline__ void load_a(uint4 (&a)[MT][2][2], const uint4* xs, int r, int q) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = mt * 16 + h * 8 + r;  // row & 7 == r
            a[mt][h][0] = xs[row * 8 + ((2 * q) ^ r)];
            a[mt][h][1] = xs[row * 8 + ((2 * q + 1) ^ r)];
        }
}

// acc += X . W^T over the chunk in stage st (bf16 weights).
// One m16n8k16 step of a 16-row tile of X (its A fragment a, k-step s of the chunk) on one 8-column B fragment:
// the A-fragment words are the same for both weight formats, only how b0/b1 are made differs.
__device__ __forceinline__ void mma_step(float (&c)[4], const uint4 (&a)[2][2], int s, unsigned b0, unsigned b1) {
    mma_bf16_16816(c, word_of(a[0][0], a[0][1], 2 * s), word_of(a[1][0], a[1][1], 2 * s),
                   word_of(a[0][0], a[0][1], 2 * s + 1), word_of(a[1][0], a[1][1], 2 * s + 1), b0, b1);
}

template <int MT>
__device__ __forceinline__ void mma_stage(const uint4* st, float (&acc)[MT][FmtBf16::NT][4], FmtBf16, int, int warp,
                                          int lane) {
    constexpr int NT = FmtBf16::NT;
    const int r = lane >> 2, q = lane & 3;
    uint4 a[MT][2][2];
    load_a<MT>(a, st, r, q);
    const uint4* ws = st + 16 * MT * 8;
    uint4 b[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int l = warp * 8 * NT + j * 8 + r;
        b[j][0] = ws[l * 8 + ((2 * q) ^ r)];
        b[j][1] = ws[l * 8 + ((2 * q + 1) ^ r)];
    }
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int j = 0; j < NT; ++j)
                mma_step(acc[mt][j], a[mt], s, word_of(b[j][0], b[j][1], 2 * s), word_of(b[j][0], b[j][1], 2 * s + 1));
        }
}

// Two nibbles of a word as a bf16 pair minus the zero: nibbles i and i + 4 (bits 4i.. and 16 + 4i..) land in the
// two halves with one shift and one LOP3 ((w >> 4i) & 0x000F000F | 0x43004300: the bf16 of 128 + n, ulp 1 in
// [128, 256)), and one bf16x2 subtraction of 128 + z leaves n - z, exact for these small integers (Marlin's trick).
__device__ __forceinline__ unsigned w4_pair(unsigned w, int sh, unsigned zz) {
    const unsigned t = ((w >> sh) & 0x000F000Fu) | 0x43004300u;
    const __nv_bfloat162 d = __hsub2(*(const __nv_bfloat162*)&t, *(const __nv_bfloat162*)&zz);
    return *(const unsigned*)&d;
}

// acc += s . (X . (q - z)^T) over the chunk in stage st (4-bit weights).
// k order: a lane's 16 elements (16q .. 16q+15 of the chunk) are taken as 8 pairs (e, e + 4) within each group of 8,
// the order the nibbles come out of a word (w4_pair); k-step s uses pairs 2s and 2s + 1. The A words (adjacent
// bf16 pairs) are regrouped the same way with one byte permute each (reused by all NT n-tiles), so the B side costs
// 3 instructions a pair.
template <int MT>
__device__ __forceinline__ void mma_stage(const uint4* st, float (&acc)[MT][FmtW4::NT][4], FmtW4, int sbf, int warp,
                                          int lane) {
    constexpr int NT = FmtW4::NT;
    const int r = lane >> 2, q = lane & 3;
    uint4 a[MT][2][2];
    load_a<MT>(a, st, r, q);
    const uint2* ws = (const uint2*)(st + 16 * MT * 8);
    const unsigned* ss = (const unsigned*)(st + 16 * MT * 8 + FmtW4::W_UNITS);
    uint2 b[NT];
    unsigned zz[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int l = warp * 8 * NT + j * 8 + r;
        b[j] = ws[l * 4 + q];  // the lane's 16 nibbles of row l: elements 16q..16q+15 of the chunk
        const unsigned z128 = 0x4300u | ((ss[l] >> 16) & 15u);  // bf16(128 + z)
        zz[j] = z128 | (z128 << 16);
    }
    float t[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) t[i][j][e] = 0.f;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int sh = 8 * (s & 1);  // pairs 2s, 2s+1 = nibbles (sh/4, +4) and (sh/4 + 1, +4) of word s >> 1
        unsigned b0[NT], b1[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const unsigned w = s < 2 ? b[j].x : b[j].y;
            b0[j] = w4_pair(w, sh, zz[j]);
            b1[j] = w4_pair(w, sh + 4, zz[j]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            // A: rows r (h 0) and r + 8 (h 1); words W0..W3 of group s >> 1; pair (e, e+4) = halves of W_i, W_{i+2}
            unsigned pa[2][2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint4& g = a[mt][h][s >> 1];
                const unsigned x = (s & 1) ? g.y : g.x, y = (s & 1) ? g.w : g.z;
                pa[h][0] = __byte_perm(x, y, 0x5410);  // (lo x, lo y): elements (2i, 2i + 4)
                pa[h][1] = __byte_perm(x, y, 0x7632);  // (hi x, hi y): elements (2i + 1, 2i + 5)
            }
#pragma unroll
            for (int j = 0; j < NT; ++j)
                mma_bf16_16816(t[mt][j], pa[0][0], pa[1][0], pa[0][1], pa[1][1], b0[j], b1[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int l = warp * 8 * NT + j * 8 + q * 2;  // accumulator columns 2q, 2q+1 of n-tile j
        const float s0 = w4_scale(ss[l], sbf), s1 = w4_scale(ss[l + 1], sbf);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            acc[i][j][0] = fmaf(s0, t[i][j][0], acc[i][j][0]);
            acc[i][j][1] = fmaf(s1, t[i][j][1], acc[i][j][1]);
            acc[i][j][2] = fmaf(s0, t[i][j][2], acc[i][j][2]);
            acc[i][j][3] = fmaf(s1, t[i][j][3], acc[i][j][3]);
        }
    }
}

// 16 * MT rows x 8 columns of accumulators a warp, as (mt, n-tile j, e): rows mt*16 + r (+8 for e >= 2),
// columns 2q + (e & 1) of n-tile j. v2 reductions on sm_90 (half the atomic operations), scalar below.
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

template <class F, int MT>
__device__ __forceinline__ void gemm_body(const bf16_t* __restrict__ X, const void* __restrict__ W,
                                          const unsigned* __restrict__ SZ, int sbf, float* __restrict__ Y,
                                          bf16_t* __restrict__ act, int N, int K, int mode) {
    extern __shared__ uint4 smem[];
    constexpr int NT = F::NT, NB = F::NB, S = F::STAGES;
    constexpr int STAGE = F::KW * chunk_units<F, MT>();  // 16-byte units
    static_assert((F::KW - 1) * MT * NT * 4 * 128 * 4 <= S * STAGE * 16, "K-group sums do not fit the pipeline");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = warp >> 2, wq = warp & 3;  // warp group along K, warp within the group
    const int nst = (K >> 6) / F::KW;
    const int per = (nst + gridDim.y - 1) / gridDim.y;
    const int c0 = blockIdx.y * per;
    const int c1 = min(nst, c0 + per);
    PDL_ENTRY();
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (c0 + s < c1) load_stage<F, MT>(smem + s * STAGE, X, W, SZ, N, K, mode, c0 + s);
        cp_async_commit();
    }
    for (int c = c0; c < c1; ++c) {
        cp_async_wait<S - 2>();  // stage c has landed (this thread's copies) ...
        __syncthreads();         // ... everyone's, and the stage refilled below is no longer read
        const int cn = c + S - 1;
        if (cn < c1) load_stage<F, MT>(smem + ((cn - c0) % S) * STAGE, X, W, SZ, N, K, mode, cn);
        cp_async_commit();
        mma_stage<MT>(smem + ((c - c0) % S) * STAGE + h * chunk_units<F, MT>(), acc, F(), sbf, wq, lane);
    }
    cp_async_wait<0>();
    if (c0 >= c1) return;  // uniform over the block
    if (F::KW > 1) {       // warp groups 1.. hand their sums to group 0 through the (now idle) pipeline memory
        __syncthreads();
        float* red = (float*)smem;
        const int t = threadIdx.x & 127;
        constexpr int PER = MT * NT * 4 * 128;
        if (h > 0) {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) red[(h - 1) * PER + ((i * NT + j) * 4 + e) * 128 + t] = acc[i][j][e];
        }
        __syncthreads();
        if (h != 0) return;
        for (int g = 0; g < F::KW - 1; ++g)
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] += red[g * PER + ((i * NT + j) * 4 + e) * 128 + t];
    }
    const int r = lane >> 2, q = lane & 3;
    if (mode == 2) {
        constexpr int HT = NT / 2;
        const int I = N >> 1;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < HT; ++j)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int t = mt * 16 + r + hh * 8;
                    const int i = blockIdx.x * (NB / 2) + wq * (4 * NT) + j * 8 + q * 2;
                    const float g0 = acc[mt][j][2 * hh], g1 = acc[mt][j][2 * hh + 1];
                    const float u0 = acc[mt][j + HT][2 * hh], u1 = acc[mt][j + HT][2 * hh + 1];
                    *(unsigned*)(act + (size_t)t * I + i) =
                        pack_bf2(g0 / (1.f + __expf(-g0)) * u0, g1 / (1.f + __expf(-g1)) * u1);
                }
        return;
    }
    const int n0 = blockIdx.x * NB + wq * (8 * NT);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float* dst = Y + (size_t)(mt * 16 + r + hh * 8) * N + n0 + j * 8 + q * 2;
                if (mode == 0) *(float2*)dst = make_float2(acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1]);
                else red_add2(dst, acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1]);
            }
}

#define GEMM_BF16(MT, T)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128 * GEMM_KW_BF16, GEMM_MINB_BF16)                              \
    gemm_bf16_t##T(const bf16_t* __restrict__ X, const bf16_t* __restrict__ W, float* __restrict__ Y,            \
                   bf16_t* __restrict__ act, int N, int K, int mode) {                                           \
        gemm_body<FmtBf16, MT>(X, W, nullptr, 0, Y, act, N, K, mode);                                             \
    }
#define GEMM_W4(MT, T, MINB)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128 * GEMM_KW_W4, MINB)                                          \
    gemm_w4_t##T(const bf16_t* __restrict__ X, const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ,  \
                 int sbf, float* __restrict__ Y, bf16_t* __restrict__ act, int N, int K, int mode) {              \
        gemm_body<FmtW4, MT>(X, Q, SZ, sbf, Y, act, N, K, mode);                                                  \
    }
GEMM_BF16(2, 32)
GEMM_BF16(3, 48)
GEMM_W4(2, 32, GEMM_MINB_W4_T32)
GEMM_W4(3, 48, GEMM_MINB_W4_T48)
