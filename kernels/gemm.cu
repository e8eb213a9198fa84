// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Prefill projections on the tensor cores (mma.sync m16n8k16, fp32 accumulation; sm_80-class: runs on an Orin):
//   Y[T, N] (=|+=) X[T, K] . W[N, K]^T       (mode 0: store; mode 1: fp32 atomics, split-K, residual/bias fused)
//   act[T, N/2] = silu(X . Wg^T) * (X . Wu^T) (mode 2: gate/up + SwiGLU fused; W = [gate rows; up rows], no split)
// X bf16 (normalised activations; fp16 for the gemm_f16_* and gemm_w4h_* instances), row stride K. Twins:
// ops.linear, ops.silu_mul for mode 2.
// Two bodies, one a weight format (the format is a policy of the launcher, cuda/launch.py Gemm):
//
// 16-bit W [N, K] (HF [out, in]): gemm_bf16_t32 / _t48 (48 = 32 vision tokens + 8 parallel action queries + zero
// rows) / _t96; gemm_f16_t* the same body on fp16 W and fp16 X (a bf16 model whose weights and activations fit fp16's
// range, stored in fp16 on the device: cuda/act_format.py). X is the MMA's A operand (16-row tiles), W the B
// operand. A block owns NB = 32 * NT W rows (a warp 8 * NT: NT n-tiles of 8) and a K range (grid.y splits K); 4
// warps. Each 64-wide chunk's X tile (T x 64) and W tile (NB rows x 64) are copied global -> shared with cp.async,
// STAGES deep, XOR-swizzled by row (conflict-free 16-byte fragment loads). K is permuted consistently for A and B
// inside each chunk: lane q of a row takes the chunk's elements 16q..16q+15, mma step s uses elements 4s..4s+3 of
// those (a dot product does not depend on the order).
//
// 4-bit W (Q uint32 [N, K/8] nibbles, SZ uint32 [N, K/128] scale bits | zero << 16, as gemv.cu): gemm_w4_t32 / _t40
// (the 48-row buffers of a parallel pass hold 40 real rows: the 8 zero rows are not multiplied) / _t48 (41 or 33 real
// rows: a model with a robot-state token; and each 48-row token slice of a 96-row buffer, grid.z: token_slice).
// Written for the few-SM boards, where this GEMM is bound by issue and latency, not bytes: the **weights are the A
// operand** (16 W rows an m16 tile) and the tokens the B operand (8 a tile), so 40 rows are 5 n-tiles (no padding to
// 48) and each dequantized weight register feeds 5 MMAs. Dequantization in registers (Marlin's way): nibbles i and i
// + 4 of a word become one bf16 pair with one shift and one LOP3 ((w >> 4i) & 0x000F000F | 0x43004300: bf16 of 128 +
// n) and one bf16x2 subtraction of 128 + z: q - z, an exact integer. The tensor cores multiply those; the group
// scale is applied in fp32 to each W tile's partial sums once a 64-wide chunk (one FMA an accumulator), so the
// weights are the file's exactly, as in the GEMV and the NumPy twin (ops.linear on QuantTensor.dequantize()).
// Multiplying the scale into bf16 weights instead (one rounding, 2^-9) cost the 1.5B full-depth chunk 4.0e-2 of its
// largest logit against the golden model, past the 3e-2 bound (issue 41; BENCHMARKS.md, "The 4-bit GEMM's weights").
// The k order inside a chunk follows the nibbles: lane t takes elements 16t..16t+15 as 8 pairs (e, e + 4) of each
// group of 8; the X words (adjacent bf16 pairs) are regrouped to match with one byte permute each, per k-step and W
// tile.
#include "common.cuh"
#include "cp_async.cuh"

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
#ifndef GEMM_NW_W4
#define GEMM_NW_W4 2  // m16 tiles of W rows a warp (a block: 4 warps, 64 * NW W rows)
#endif
#ifndef GEMM_STAGES_W4
#define GEMM_STAGES_W4 4
#endif
#ifndef GEMM_KW_W4
#define GEMM_KW_W4 1  // warp groups of 4 along K (> 1: dev/cuda/gemm_micro.py's w_kw2_* variants, not shipped)
#endif
#ifndef GEMM_MINB_W4_T96
#define GEMM_MINB_W4_T96 2  // the 96-row instance: 12 token tiles hold 96 fp32 accumulators a thread
#endif
#ifndef GEMM_MINB_W4
#define GEMM_MINB_W4 4  // blocks an SM must hold (__launch_bounds__: 128 registers a thread)
#endif

// Word i (0..7) of a lane's 16 k-values held as two uint4: the bf16 pair of elements 2i, 2i+1.
__device__ __forceinline__ unsigned word_of(const uint4& a, const uint4& b, int i) {
    const uint4& v = i < 4 ? a : b;
    const int j = i & 3;
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// ------------------------------------------------------------------------------------------------ bf16 weights
// W_UNITS: 16-byte units of a stage's W tile.
// KW: warp groups along K (4 warps each); a stage holds KW consecutive chunks, group h multiplies chunk h of it, and
// the groups' sums are added in shared memory at the end.
struct FmtBf16 {
    static constexpr int NT = GEMM_NT_BF16, NB = 32 * NT, KW = GEMM_KW_BF16, STAGES = GEMM_STAGES_BF16;
    static constexpr int W_UNITS = NB * 8;  // NB rows x 128 bytes
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

// One chunk (64 k) of X and W into st, by the 128 threads of warp group threadIdx.x / 128.
template <class F, int MT>
__device__ __forceinline__ void load_chunk(uint4* st, const bf16_t* __restrict__ X, const bf16_t* __restrict__ W, int N,
                                           int K, int mode, int c) {
    const int tid = threadIdx.x & 127;
    const int k0 = c * 64;
#pragma unroll
    for (int i = 0; i < (16 * MT * 8) / 128; ++i) {  // X tile, rows x 8 units, swizzled
        const int idx = tid + i * 128, r = idx >> 3, u = idx & 7;
        cp_async16(st + r * 8 + (u ^ (r & 7)), X + (size_t)r * K + k0 + u * 8);
    }
    uint4* ws = st + 16 * MT * 8;
#pragma unroll
    for (int i = 0; i < F::W_UNITS / 128; ++i) {
        const int idx = tid + i * 128, l = idx >> 3, u = idx & 7;
        cp_async16(ws + l * 8 + (u ^ (l & 7)), W + (size_t)w_row<F>(l, mode, N) * K + k0 + u * 8);
    }
}

template <class F, int MT>
constexpr int chunk_units() { return 16 * MT * 8 + F::W_UNITS; }

// Stage cs = chunks cs*KW .. cs*KW+KW-1; warp group h loads chunk cs*KW + h into part h of the stage.
template <class F, int MT>
__device__ __forceinline__ void load_stage(uint4* st, const bf16_t* __restrict__ X, const bf16_t* __restrict__ W, int N,
                                           int K, int mode, int cs) {
    const int h = threadIdx.x >> 7;
    load_chunk<F, MT>(st + h * chunk_units<F, MT>(), X, W, N, K, mode, cs * F::KW + h);
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

// acc += X . W^T over the chunk in stage st (16-bit weights: bf16, or fp16 when F16).
// One m16n8k16 step of a 16-row tile of X (its A fragment a, k-step s of the chunk) on one 8-column B fragment.
template <bool F16>
__device__ __forceinline__ void mma_step(float (&c)[4], const uint4 (&a)[2][2], int s, unsigned b0, unsigned b1) {
    const unsigned a0 = word_of(a[0][0], a[0][1], 2 * s), a1 = word_of(a[1][0], a[1][1], 2 * s);
    const unsigned a2 = word_of(a[0][0], a[0][1], 2 * s + 1), a3 = word_of(a[1][0], a[1][1], 2 * s + 1);
    if (F16) mma_f16_16816(c, a0, a1, a2, a3, b0, b1);
    else mma_bf16_16816(c, a0, a1, a2, a3, b0, b1);
}

template <int MT, bool F16>
__device__ __forceinline__ void mma_stage(const uint4* st, float (&acc)[MT][FmtBf16::NT][4], int warp, int lane) {
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
                mma_step<F16>(acc[mt][j], a[mt], s, word_of(b[j][0], b[j][1], 2 * s),
                              word_of(b[j][0], b[j][1], 2 * s + 1));
        }
}

// v2 reductions on sm_90 (half the atomic operations), scalar below.
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// The epilogue of both bodies, per output element: mode 0 stores Y[tok, n], mode 1 adds into it (split K: each K
// slice's sum), mode 2 writes act[tok, o] = silu(gate) * up (N = 2I: gate rows 0..I-1, up rows I..2I-1; bf16, or fp16
// when F16). The bf16 body holds adjacent columns (put2, swiglu2), the 4-bit body adjacent tokens (put, swiglu). The
// bodies pass Y's element as a pointer: their layouts' constant offsets then fold into the store instructions.
struct GemmOut {
    float* Y;
    bf16_t* act;
    int N, mode;
    __device__ __forceinline__ static float silu_mul(float g, float u) { return g / (1.f + __expf(-g)) * u; }
    __device__ __forceinline__ void put(float* dst, float v) const {
        if (mode == 0) *dst = v;
        else atomicAdd(dst, v);
    }
    __device__ __forceinline__ void put2(float* dst, float v0, float v1) const {
        if (mode == 0) *(float2*)dst = make_float2(v0, v1);
        else red_add2(dst, v0, v1);
    }
    template <bool F16>
    __device__ __forceinline__ void swiglu(int tok, int o, float g, float u) const {
        act[(size_t)tok * (N >> 1) + o] = f2act<F16>(silu_mul(g, u));
    }
    template <bool F16>
    __device__ __forceinline__ void swiglu2(int tok, int o, float g0, float u0, float g1, float u1) const {
        *(unsigned*)(act + (size_t)tok * (N >> 1) + o) = pack_act2<F16>(silu_mul(g0, u0), silu_mul(g1, u1));
    }
};

// KW warp groups of 4 along K: groups 1 .. KW - 1 hand their sums to group 0 through the (now idle) pipeline memory,
// acc[A][B][4] a thread; returns whether this thread's group is group 0, the one that writes the output. Every
// cp.async must have landed (cp_async_wait<0>) and the block must reach here together.
template <int KW, int A, int B>
__device__ __forceinline__ bool k_groups_sum(float (&acc)[A][B][4], uint4* smem) {
    const int h = threadIdx.x >> 7, t = threadIdx.x & 127;
    constexpr int PER = A * B * 4 * 128;
    float* red = (float*)smem;
    __syncthreads();
    if (h > 0) {
#pragma unroll
        for (int i = 0; i < A; ++i)
#pragma unroll
            for (int j = 0; j < B; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) red[(h - 1) * PER + ((i * B + j) * 4 + e) * 128 + t] = acc[i][j][e];
    }
    __syncthreads();
    if (h != 0) return false;
    for (int g = 0; g < KW - 1; ++g)
#pragma unroll
        for (int i = 0; i < A; ++i)
#pragma unroll
            for (int j = 0; j < B; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] += red[g * PER + ((i * B + j) * 4 + e) * 128 + t];
    return true;
}

// grid.z: the token slice of `rows` rows this block multiplies (launch.gemm_token_split: the gate/up of a 96-row
// buffer as two 48-row slices where its grid holds few blocks an SM). Moves X, Y and act to the slice's first row; Y
// or act is null in the mode that does not use it and is then never dereferenced.
__device__ __forceinline__ void token_slice(const bf16_t* __restrict__& X, float* __restrict__& Y,
                                            bf16_t* __restrict__& act, int rows, int N, int K) {
    const size_t t0 = (size_t)blockIdx.z * rows;
    X += t0 * K;
    Y += t0 * N;
    act += t0 * (N >> 1);
}

template <class F, int MT, bool F16>
__device__ __forceinline__ void gemm_body(const bf16_t* __restrict__ X, const bf16_t* __restrict__ W,
                                          float* __restrict__ Y, bf16_t* __restrict__ act, int N, int K, int mode) {
    extern __shared__ uint4 smem[];
    constexpr int NT = F::NT, NB = F::NB, S = F::STAGES;
    constexpr int STAGE = F::KW * chunk_units<F, MT>();  // 16-byte units
    static_assert((F::KW - 1) * MT * NT * 4 * 128 * 4 <= S * STAGE * 16, "K-group sums do not fit the pipeline");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = warp >> 2, wq = warp & 3;  // warp group along K, warp within the group
    token_slice(X, Y, act, 16 * MT, N, K);
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
        if (c0 + s < c1) load_stage<F, MT>(smem + s * STAGE, X, W, N, K, mode, c0 + s);
        cp_async_commit();
    }
    for (int c = c0; c < c1; ++c) {
        cp_async_wait<S - 2>();  // stage c has landed (this thread's copies) ...
        __syncthreads();         // ... everyone's, and the stage refilled below is no longer read
        const int cn = c + S - 1;
        if (cn < c1) load_stage<F, MT>(smem + ((cn - c0) % S) * STAGE, X, W, N, K, mode, cn);
        cp_async_commit();
        mma_stage<MT, F16>(smem + ((c - c0) % S) * STAGE + h * chunk_units<F, MT>(), acc, wq, lane);
    }
    cp_async_wait<0>();
    if (c0 >= c1) return;  // uniform over the block
    if constexpr (F::KW > 1) {  // group 0 writes the output
        if (!k_groups_sum<F::KW>(acc, smem)) return;
    }
    // acc[mt][j][e]: token mt * 16 + r + 8 (e >> 1), columns 2q, 2q + 1 of the warp's n-tile j
    const int r = lane >> 2, q = lane & 3;
    const GemmOut out{Y, act, N, mode};
    if (mode == 2) {
        constexpr int HT = NT / 2;  // n-tiles j < HT: gate columns, j + HT: the up columns of the same outputs
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < HT; ++j)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
                    out.swiglu2<F16>(mt * 16 + r + hh * 8, blockIdx.x * (NB / 2) + wq * (4 * NT) + j * 8 + q * 2,
                                       acc[mt][j][2 * hh], acc[mt][j + HT][2 * hh], acc[mt][j][2 * hh + 1],
                                       acc[mt][j + HT][2 * hh + 1]);
        return;
    }
    const int n0 = blockIdx.x * NB + wq * (8 * NT);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                out.put2(Y + (size_t)(mt * 16 + r + hh * 8) * N + n0 + j * 8 + q * 2, acc[mt][j][2 * hh],
                         acc[mt][j][2 * hh + 1]);
}

#define GEMM_BF16(MT, T)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128 * GEMM_KW_BF16, GEMM_MINB_BF16)                              \
    gemm_bf16_t##T(const bf16_t* __restrict__ X, const bf16_t* __restrict__ W, float* __restrict__ Y,            \
                   bf16_t* __restrict__ act, int N, int K, int mode) {                                           \
        gemm_body<FmtBf16, MT, false>(X, W, Y, act, N, K, mode);                                                  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(128 * GEMM_KW_BF16, GEMM_MINB_BF16)                              \
    gemm_f16_t##T(const bf16_t* __restrict__ X, const bf16_t* __restrict__ W, float* __restrict__ Y,             \
                  bf16_t* __restrict__ act, int N, int K, int mode) {                                            \
        gemm_body<FmtBf16, MT, true>(X, W, Y, act, N, K, mode);                                                   \
    }
// ---------------------------------------------------------------------------------------------- 4-bit weights
// Weights as the MMA's A operand (see the top). A block: 4 warps (times KW), NB = 64 * NW W rows (warp w: m16 tiles
// i of rows w * 16 * NW + 16 i ..), TT token tiles of 8 (T = 8 TT rows), a K range (grid.y splits K in mode 1).
// A chunk (one 64-wide k range, 16-byte units): X tile 8 TT rows x 8 units (XOR-swizzled by row), W tile NB rows x 2
// units of nibbles, NB words of scale|zero. A stage holds KW consecutive chunks; warp group h (4 warps) loads and
// multiplies chunk h of each stage, and the groups' sums are added in shared memory at the end (as FmtBf16's KW):
// more warps a scheduler for the same instructions where a grid holds one block an SM.
struct W4 {
    static constexpr int NW = GEMM_NW_W4, NB = 64 * NW, STAGES = GEMM_STAGES_W4, KW = GEMM_KW_W4;
    static_assert(NW % 2 == 0, "mode 2 pairs gate tile i with up tile i + NW / 2");
};

template <int TT>
constexpr int w4_stage_units() { return TT * 64 + 2 * W4::NB + W4::NB / 4; }

// The W row that block-local row l (warp w, tile i, row rr of the tile) stands for: consecutive rows, or in mode 2
// gate rows for tiles i < NW/2 and the up rows of the same outputs for tiles i >= NW/2 (one lane holds g and u).
__device__ __forceinline__ int w4_row(int l, int mode, int N) {
    if (mode != 2) return blockIdx.x * W4::NB + l;
    constexpr int HW = W4::NW / 2;
    const int w = l / (16 * W4::NW), i = (l >> 4) % W4::NW, rr = l & 15;
    return (i >= HW ? (N >> 1) : 0) + blockIdx.x * (W4::NB / 2) + w * (16 * HW) + (i % HW) * 16 + rr;
}

template <int TT>
__device__ __forceinline__ void w4_load_stage(uint4* st, const bf16_t* __restrict__ X, const unsigned* __restrict__ Q,
                                              const unsigned* __restrict__ SZ, int N, int K, int mode, int c) {
    const int tid = W4::KW > 1 ? (threadIdx.x & 127) : threadIdx.x;  // within the warp group
    const int k0 = c * 64;
#pragma unroll
    for (int i = 0; i < (TT * 64 + 127) / 128; ++i) {  // X tile
        const int idx = tid + i * 128, r = idx >> 3, u = idx & 7;
        if (idx < TT * 64) cp_async16(st + r * 8 + (u ^ (r & 7)), X + (size_t)r * K + k0 + u * 8);
    }
    uint4* ws = st + TT * 64;
#pragma unroll
    for (int i = 0; i < (2 * W4::NB) / 128; ++i) {  // W tile: row l's 32 bytes of nibbles as 2 units
        const int idx = tid + i * 128, l = idx >> 1, u = idx & 1;
        cp_async16(ws + idx, Q + (size_t)w4_row(l, mode, N) * (K >> 3) + (k0 >> 3) + u * 4);
    }
    unsigned* ss = (unsigned*)(ws + 2 * W4::NB);
#pragma unroll
    for (int i = 0; i < W4::NB / 128; ++i) {
        const int l = tid + i * 128;
        cp_async4(ss + l, SZ + (size_t)w4_row(l, mode, N) * (K >> 7) + (k0 >> 7));
    }
}

// Stage cs = chunks cs * KW .. cs * KW + KW - 1: warp group h loads chunk cs * KW + h into part h of the stage.
template <int TT>
__device__ __forceinline__ void w4_load_group_stage(uint4* st, const bf16_t* __restrict__ X,
                                                    const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ,
                                                    int N, int K, int mode, int cs) {
    const int h = W4::KW > 1 ? (int)(threadIdx.x >> 7) : 0;
    w4_load_stage<TT>(st + h * w4_stage_units<TT>(), X, Q, SZ, N, K, mode, cs * W4::KW + h);
}

// q - z as a bf16 pair for nibbles i, i + 4 of w (i = sh / 4), exact (an integer in -15..15): zz = bf16x2(128 + z).
// F16: as an fp16 pair (0x6400 | n is fp16 1024 + n), zz = fp16x2(1024 + z); the integers are exact in both.
template <bool F16>
__device__ __forceinline__ unsigned w4_deq(unsigned w, int sh, unsigned zz) {
    if (F16) {
        const unsigned t = ((w >> sh) & 0x000F000Fu) | 0x64006400u;
        const __half2 d = __hsub2(*(const __half2*)&t, *(const __half2*)&zz);
        return *(const unsigned*)&d;
    }
    const unsigned t = ((w >> sh) & 0x000F000Fu) | 0x43004300u;
    const __nv_bfloat162 d = __hsub2(*(const __nv_bfloat162*)&t, *(const __nv_bfloat162*)&zz);
    return *(const unsigned*)&d;
}

// acc[i][j] += s_i * (Q_i - z_i) . X tile j over the chunk in stage st (warp `warp`, lane (g, t)). A chunk lies in
// one scale group (64 of 128), so W tile i's MMAs go into part[TT][4] and are folded into acc with its two rows'
// scales in fp32: the tensor cores multiply the exact integers, and only one tile's partial sums are live at a time.
template <int TT, bool F16>
__device__ __forceinline__ void w4_mma_stage(const uint4* st, float (&acc)[W4::NW][TT][4], int sbf, int warp,
                                             int lane) {
    constexpr int NW = W4::NW;
    const int g = lane >> 2, t = lane & 3;
    const uint2* ws = (const uint2*)(st + TT * 64);
    const unsigned* ss = (const unsigned*)(st + TT * 64 + 2 * W4::NB);
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        uint2 wq[2];
        unsigned zz[2];
        float sc[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g (h 0) and g + 8 (h 1) of tile i
            const int l = warp * 16 * NW + i * 16 + g + 8 * h;
            wq[h] = ws[l * 4 + t];  // the lane's 16 nibbles of row l: elements 16t..16t+15 of the chunk
            const unsigned sz = ss[l];
            const unsigned z128 = (F16 ? 0x6400u : 0x4300u) | ((sz >> 16) & 15u);
            zz[h] = z128 | (z128 << 16);
            sc[h] = w4_scale(sz, sbf);
        }
        float part[TT][4];
#pragma unroll
        for (int j = 0; j < TT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[j][e] = 0.f;
#pragma unroll
        for (int hk = 0; hk < 2; ++hk) {  // elements 16t + 8hk .. + 7: word hk of each row's uint2
            uint4 xv[TT];
#pragma unroll
            for (int j = 0; j < TT; ++j) {
                const int row = 8 * j + g;  // row & 7 == g
                xv[j] = st[row * 8 + ((2 * t + hk) ^ g)];
            }
            const unsigned w0 = hk ? wq[0].y : wq[0].x, w1 = hk ? wq[1].y : wq[1].x;
#pragma unroll
            for (int s2 = 0; s2 < 2; ++s2) {  // k-step: pairs (2 s2, 2 s2 + 4) and (2 s2 + 1, 2 s2 + 5) of the group
                const int sh = 8 * s2;
                const unsigned a0 = w4_deq<F16>(w0, sh, zz[0]), a1 = w4_deq<F16>(w1, sh, zz[1]);
                const unsigned a2 = w4_deq<F16>(w0, sh + 4, zz[0]), a3 = w4_deq<F16>(w1, sh + 4, zz[1]);
#pragma unroll
                for (int j = 0; j < TT; ++j) {
                    const unsigned x = s2 ? xv[j].y : xv[j].x, y = s2 ? xv[j].w : xv[j].z;
                    const unsigned b0 = __byte_perm(x, y, 0x5410);  // elements (2 s2, 2 s2 + 4)
                    const unsigned b1 = __byte_perm(x, y, 0x7632);  // (2 s2 + 1, 2 s2 + 5)
                    if (F16) mma_f16_16816(part[j], a0, a1, a2, a3, b0, b1);
                    else mma_bf16_16816(part[j], a0, a1, a2, a3, b0, b1);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < TT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = fmaf(part[j][e], sc[e >> 1], acc[i][j][e]);
    }
}

template <int TT, bool F16>
__device__ __forceinline__ void gemm_w4_body(const bf16_t* __restrict__ X, const unsigned* __restrict__ Q,
                                             const unsigned* __restrict__ SZ, int sbf, float* __restrict__ Y,
                                             bf16_t* __restrict__ act, int N, int K, int mode) {
    extern __shared__ uint4 smem[];
    constexpr int NW = W4::NW, S = W4::STAGES, KW = W4::KW, CHUNK = w4_stage_units<TT>(), STAGE = KW * CHUNK;
    static_assert((KW - 1) * NW * TT * 4 * 128 * 4 <= S * STAGE * 16, "K-group sums do not fit the pipeline");
    const int lane = threadIdx.x & 31;
    const int h = KW > 1 ? (int)(threadIdx.x >> 7) : 0;              // warp group along K
    const int warp = KW > 1 ? (int)((threadIdx.x >> 5) & 3) : (int)(threadIdx.x >> 5);  // warp within the group
    token_slice(X, Y, act, 8 * TT, N, K);
    const int nst = (K >> 6) / KW;  // stages of KW chunks
    const int per = (nst + gridDim.y - 1) / gridDim.y;
    const int c0 = blockIdx.y * per;
    const int c1 = min(nst, c0 + per);
    PDL_ENTRY();
    float acc[NW][TT][4];
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int j = 0; j < TT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (c0 + s < c1) w4_load_group_stage<TT>(smem + s * STAGE, X, Q, SZ, N, K, mode, c0 + s);
        cp_async_commit();
    }
    for (int c = c0; c < c1; ++c) {
        cp_async_wait<S - 2>();
        __syncthreads();
        const int cn = c + S - 1;
        if (cn < c1) w4_load_group_stage<TT>(smem + ((cn - c0) % S) * STAGE, X, Q, SZ, N, K, mode, cn);
        cp_async_commit();
        w4_mma_stage<TT, F16>(smem + ((c - c0) % S) * STAGE + h * CHUNK, acc, sbf, warp, lane);
    }
    cp_async_wait<0>();
    if (c0 >= c1) return;
    if constexpr (KW > 1) {  // group 0 writes the output
        if (!k_groups_sum<KW>(acc, smem)) return;
    }
    // acc[i][j][e]: W row (warp, tile i) g + 8 (e >> 1), token 8 j + 2 t + (e & 1)
    const int g = lane >> 2, t = lane & 3;
    const GemmOut out{Y, act, N, mode};
    if (mode == 2) {
        constexpr int HW = NW / 2;  // tiles i < HW: gate rows, i + HW: the up rows of the same outputs
#pragma unroll
        for (int i = 0; i < HW; ++i)
#pragma unroll
            for (int j = 0; j < TT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    out.swiglu<F16>(8 * j + 2 * t + (e & 1),
                                    blockIdx.x * (W4::NB / 2) + warp * (16 * HW) + i * 16 + g + 8 * (e >> 1),
                                    acc[i][j][e], acc[i + HW][j][e]);
        return;
    }
    const int n0 = blockIdx.x * W4::NB + warp * (16 * NW);
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int j = 0; j < TT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                out.put(Y + (size_t)(8 * j + 2 * t + (e & 1)) * N + n0 + i * 16 + g + 8 * (e >> 1), acc[i][j][e]);
}

#define GEMM_W4(TT, T, MINB)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128 * GEMM_KW_W4, MINB)                                          \
    gemm_w4_t##T(const bf16_t* __restrict__ X, const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ,  \
                 int sbf, float* __restrict__ Y, bf16_t* __restrict__ act, int N, int K, int mode) {              \
        gemm_w4_body<TT, false>(X, Q, SZ, sbf, Y, act, N, K, mode);                                               \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(128 * GEMM_KW_W4, MINB)                                          \
    gemm_w4h_t##T(const bf16_t* __restrict__ X, const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, \
                  int sbf, float* __restrict__ Y, bf16_t* __restrict__ act, int N, int K, int mode) {             \
        gemm_w4_body<TT, true>(X, Q, SZ, sbf, Y, act, N, K, mode);                                                \
    }
GEMM_BF16(2, 32)
GEMM_BF16(3, 48)
GEMM_BF16(6, 96)
GEMM_W4(4, 32, GEMM_MINB_W4)
GEMM_W4(5, 40, GEMM_MINB_W4)
GEMM_W4(6, 48, GEMM_MINB_W4)
GEMM_W4(12, 96, GEMM_MINB_W4_T96)
