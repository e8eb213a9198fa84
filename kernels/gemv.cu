// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Decode GEMVs (one token), one kernel per op: the instances of gemv.cuh's bodies (q/k/v + norm + K/V write,
// gate/up + norm + SwiGLU, o / down projection + residual), each on its own grid and waiting for the previous kernel
// through the PDL hooks. dev/cuda/decode_persistent.cu runs the same bodies as the steps of one persistent kernel.
// Twins: ops.rms_norm, ops.linear (+ bias, + residual) on the weights (QuantTensor.dequantize() for 4-bit),
// ops.silu_mul; gemv.cuh describes the layout, the ring and the instances' names.
#include "gemv.cuh"

#define GV_OWN_GRID StepGrid{gridDim.x, blockIdx.x}

// ---- instances: the weight arguments of each format, then the same three bodies -------------------------------------
#define GV_BF16_W const bf16_t* __restrict__ W
#define GV_BF16_REF Bf16W{W}
#define GV_F16_W const bf16_t* __restrict__ W
#define GV_F16_REF F16W{W}
#define GV_W4_W const unsigned* __restrict__ Q, const unsigned* __restrict__ SZ, int sbf
#define GV_W4_REF Q4W{Q, SZ, sbf}

#define GV_INSTANCES(FMT, F, MINB_GATEUP, KV, SUF, FULL)                                                              \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, 2) gemv_##FMT##_qkv_##KV##SUF(                           \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, GV_##F##_W,                            \
        const float* __restrict__ bias, int K, int NQ, int NKVD, float* __restrict__ q_out,                           \
        bf16_t* __restrict__ kc, bf16_t* __restrict__ vc, const int* __restrict__ order,                              \
        const int* __restrict__ params, int q_off, int cap, int D) {                                                  \
        extern __shared__ __align__(16) unsigned char gv_smem[];                                                      \
        gemv_qkv_body<decltype(GV_##F##_REF), KV, decltype(GV_##F##_REF)::RB_QKV, FULL>(                              \
            GV_OWN_GRID, PdlEntry{}, x, ln, eps, GV_##F##_REF, bias, K, NQ, NKVD, q_out, kc, vc, order, params,      \
            q_off, cap, D, gv_smem);                                                                                  \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, MINB_GATEUP) gemv_##FMT##_gateup_##KV##SUF(              \
        const float* __restrict__ x, const bf16_t* __restrict__ ln, float eps, GV_##F##_W, int K, int I,              \
        float* __restrict__ act) {                                                                                    \
        extern __shared__ __align__(16) unsigned char gv_smem[];                                                      \
        gemv_gateup_body<decltype(GV_##F##_REF), KV, decltype(GV_##F##_REF)::RB_PAIRS, FULL>(                         \
            GV_OWN_GRID, PdlEntry{}, x, ln, eps, GV_##F##_REF, K, I, act, gv_smem);                                   \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(GV_THREADS, 2) gemv_##FMT##_proj_##KV##SUF(                          \
        const float* __restrict__ a, GV_##F##_W, int K, int N, float* __restrict__ y, int S) {                        \
        extern __shared__ __align__(16) unsigned char gv_smem[];                                                      \
        gemv_proj_body<decltype(GV_##F##_REF), KV, decltype(GV_##F##_REF)::RB_PROJ, FULL>(GV_OWN_GRID, PdlEntry{},    \
            a, GV_##F##_REF, K, N, y, S, gv_smem);                                                                    \
    }

// per KV: the full instances (K fills the segments) and the partial ones (suffix p)
#define GV_FORMATS(KV)                                                                                                \
    GV_INSTANCES(bf16, BF16, GV_MINB_BF16_GATEUP, KV, , true)                                                         \
    GV_INSTANCES(f16, F16, GV_MINB_BF16_GATEUP, KV, , true)                                                           \
    GV_INSTANCES(w4, W4, 2, KV, , true)                                                                               \
    GV_INSTANCES(bf16, BF16, GV_MINB_BF16_GATEUP, KV, p, false)                                                       \
    GV_INSTANCES(f16, F16, GV_MINB_BF16_GATEUP, KV, p, false)                                                         \
    GV_INSTANCES(w4, W4, 2, KV, p, false)

GV_FORMATS(1)
GV_FORMATS(2)
GV_FORMATS(3)
GV_FORMATS(4)
GV_FORMATS(5)
GV_FORMATS(6)
GV_FORMATS(7)
GV_FORMATS(8)
