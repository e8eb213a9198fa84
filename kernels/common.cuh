// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Shared helpers for the vla_edge_ros kernels (included by every kernels/*.cu).
// Compiled at run time by NVRTC through cupy.RawModule; no host code here.
#pragma once
#include <cuda_bf16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
typedef unsigned short bf16_t;  // raw bf16 bits, as the weights are stored

// Programmatic Dependent Launch (Hopper, sm_90+). cuda/kernels.py compiles every file with -DVLA_PDL; the decode
// kernels are launched with cuLaunchKernelEx + CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda/launch.py).
// PDL_TRIGGER lets the next kernel in the stream start its blocks (they run up to their own PDL_WAIT); PDL_WAIT
// blocks until every grid this one depends on has completed and its memory is visible. Rule kept by every kernel:
// only reads of constant data (weights) before PDL_WAIT, no write and no return before it. Without the launch
// attribute (plain launches, e.g. the prefill) and below sm_90 both are no-ops.
#if defined(VLA_PDL) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define PDL_TRIGGER() do { } while (0)
#define PDL_WAIT() do { } while (0)
#endif
#define PDL_ENTRY() do { PDL_TRIGGER(); PDL_WAIT(); } while (0)

// Where a kernel body runs: as its own kernel (n = gridDim.x, b = blockIdx.x), or as one step of a persistent kernel
// (dev/cuda/decode_persistent.cu), whose grid it shares with the other steps. How it waits for what the step before
// it wrote is the body's Wait argument: PdlEntry as its own kernel, a grid barrier in decode_persistent.cu.
struct StepGrid {
    unsigned n, b;  // unsigned, as gridDim.x / blockIdx.x: the same index arithmetic either way
};
// The Wait type also says how a body loads activations (data an earlier step wrote): ld. As its own kernel that data
// comes from an earlier kernel, so the read-only path (__ldg) is safe; inside one persistent kernel it is not (the
// read-only cache is not kept coherent with writes of the same kernel: dev/cuda/decode_persistent.cu loads with
// __ldcg).
struct PdlEntry {
    __device__ __forceinline__ void operator()() const { PDL_ENTRY(); }
    template <class T>
    __device__ __forceinline__ static T ld(const T* p) { return __ldg(p); }
};

__device__ __forceinline__ float bf2f(bf16_t b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ float bflo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bfhi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ bf16_t f2bf(float f) {  // round to nearest even, as numpy f32_to_bf16
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) {
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
}
// fp16 bits (round to nearest even, as numpy astype(float16)): the prefill GEMMs' activations where they provably
// fit fp16's range (cuda/act_format.py; 3 more mantissa bits than bf16, issue 41).
__device__ __forceinline__ unsigned short f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ unsigned pack_h2(float lo, float hi) {
    return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
}
// A 16-bit activation element in format F16 (fp16 when true, bf16 otherwise) and a pair of them.
template <bool F16>
__device__ __forceinline__ unsigned short f2act(float f) { return F16 ? f2h(f) : f2bf(f); }
template <bool F16>
__device__ __forceinline__ unsigned pack_act2(float lo, float hi) { return F16 ? pack_h2(lo, hi) : pack_bf2(lo, hi); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum; every thread gets the result. `red` needs blockDim.x/32 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; ++i) s += red[i];
    return s;
}

// The low / high value of a word of two 16-bit values, as a float: bf16, or fp16 when F16.
template <bool F16>
__device__ __forceinline__ float lo16(unsigned u) { return F16 ? __low2float(*(const __half2*)&u) : bflo(u); }
template <bool F16>
__device__ __forceinline__ float hi16(unsigned u) { return F16 ? __high2float(*(const __half2*)&u) : bfhi(u); }

// dot of 8 16-bit values (one uint4: bf16, or fp16 when F16) with 8 floats
template <bool F16 = false>
__device__ __forceinline__ float dot8(uint4 w, const float* x) {
    float s = lo16<F16>(w.x) * x[0];
    s = fmaf(hi16<F16>(w.x), x[1], s);
    s = fmaf(lo16<F16>(w.y), x[2], s);
    s = fmaf(hi16<F16>(w.y), x[3], s);
    s = fmaf(lo16<F16>(w.z), x[4], s);
    s = fmaf(hi16<F16>(w.z), x[5], s);
    s = fmaf(lo16<F16>(w.w), x[6], s);
    s = fmaf(hi16<F16>(w.w), x[7], s);
    return s;
}

// Streaming 16-byte load of weights (read once per pass: do not keep in L1).
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// D = A(16x16 bf16, row) * B(16x8 bf16, col) + D, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with fp16 operands (fp32 accumulators).
__device__ __forceinline__ void mma_f16_16816(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                              unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 1/sqrt(mean square + eps) of an RMSNorm, NaN when the mean square overflowed float32 (|x| beyond ~1e19: the forward
// pass blew up). rsqrtf(inf) is 0, which would make the row all zeros, a finite meaningless action (bin 0 after the
// argmax); NaN reaches the head's non-finite check instead. Twin: ops.rms_norm.
__device__ __forceinline__ float rms_inv(float mean_sq, float eps) {
    return isfinite(mean_sq) ? rsqrtf(mean_sq + eps) : __int_as_float(0x7fc00000);
}

// RMSNorm prologue used by the decode GEMVs: xs[i] = x[i] * rsqrt(mean(x^2)+eps) * w[i] for i < n.
__device__ __forceinline__ void norm_to_smem(const float* __restrict__ x, const bf16_t* __restrict__ w, float eps,
                                             int n, float* xs, float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        xs[i] = v;
        ss = fmaf(v, v, ss);
    }
    float tot = block_sum(ss, red);
    float inv = rms_inv(tot / (float)n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xs[i] = xs[i] * inv * bf2f(w[i]);
    __syncthreads();
}

// R rows (given by row index array) of W dotted with xs (K floats in smem). K % 256 == 0.
template <int R, int U>
__device__ __forceinline__ void warp_rows(const bf16_t* __restrict__ W, int K, const int* rows, const float* xs,
                                          float* acc) {
    const int lane = threadIdx.x & 31;
    const int nvec = K >> 3;  // uint4 per row
    const uint4* base[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        base[r] = (const uint4*)(W + (size_t)rows[r] * K);
        acc[r] = 0.f;
    }
    int i = lane;
    for (; i + 32 * (U - 1) < nvec; i += 32 * U) {
        uint4 w[R][U];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) w[r][u] = ldg_stream(base[r] + i + 32 * u);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const float* xp = xs + (size_t)(i + 32 * u) * 8;
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] += dot8(w[r][u], xp);
        }
    }
    for (; i < nvec; i += 32) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += dot8(ldg_stream(base[r] + i), xs + (size_t)i * 8);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
}


// Fire-and-forget L2 prefetch of R whole weight rows (one per 128-byte line), issued at kernel entry so
// the HBM reads overlap the RMSNorm prologue and run with full memory-level parallelism.
template <int R>
__device__ __forceinline__ void warp_prefetch_rows(const bf16_t* __restrict__ W, int K, const int* rows, int N) {
    const int lane = threadIdx.x & 31;
    const int lines = K >> 6;  // 128-byte lines per row
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (rows[r] >= N) continue;
        const char* base = (const char*)(W + (size_t)rows[r] * K);
        for (int i = lane; i < lines; i += 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + (size_t)i * 128));
    }
}

// Decode GEMVs (gemv.cu): lane l of a warp holds x[8c .. 8c+7] for c = l + 32u (u < KV).
// Loads x and ln (after PDL_WAIT; both L2 hits) and leaves xr = x * ln; returns inv = rsqrt(mean(x^2) + eps), which
// the caller applies to each finished dot product: rms_norm(x) . w = inv * ((x * ln) . w). ln is consumed chunk by
// chunk, so it never occupies registers next to the weights in flight. The warp holds all K <= 256*KV values of x
// (K a multiple of 8; chunks c >= K/8 are zero). FULL: K == 256*KV, no chunk to mask (the instances for sizes that
// fill their segments compile without the checks: measured 2-4 % of a decode pass at 1.5B).
template <int KV, bool FULL = true, class Ld = PdlEntry>
__device__ __forceinline__ float warp_load_x_norm(const float* __restrict__ x, const bf16_t* __restrict__ ln,
                                                  int lane, int K, float eps, float (&xr)[KV][8]) {
    float ss = 0.f;
    const int nv = K >> 3;
#pragma unroll
    for (int u = 0; u < KV; ++u) {
        const int c = lane + 32 * u;
        const bool ok = FULL || c < nv;
        const float4* p = (const float4*)(x + 8 * c);
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 a = ok ? Ld::ld(p) : z, b = ok ? Ld::ld(p + 1) : z;
        const uint4 l = ok ? __ldg((const uint4*)ln + c) : make_uint4(0, 0, 0, 0);
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const float lf[8] = {bflo(l.x), bfhi(l.x), bflo(l.y), bfhi(l.y), bflo(l.z), bfhi(l.z), bflo(l.w), bfhi(l.w)};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            ss = fmaf(v[e], v[e], ss);
            xr[u][e] = v[e] * lf[e];
        }
    }
    return rms_inv(warp_sum(ss) / (float)K, eps);
}


// --- 4-bit weights (gemv.cu, gemm.cu) ----- -------------------------------------------------------------------------
// A group's scale from its scale|zero word: the low 16 bits are fp16, or bf16 when sbf != 0.
__device__ __forceinline__ float w4_scale(unsigned sz, int sbf) {
    const unsigned b = sz & 0xffffu;
    return sbf ? __uint_as_float(b << 16) : __half2float(__ushort_as_half((unsigned short)b));
}
