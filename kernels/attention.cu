// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// GQA attention over the slot-addressed KV cache (split-K flash-decoding on the tensor cores, RoPE applied inside):
// attn_partial_<D> (4 warps, 64 query rows a block: the decode passes' T = 1), attn_partial_w8_<D> (8 warps, 128
// rows: the prefill, whose row groups of a KV head then share each K/V tile load and its rotation two by two) and
// attn_combine_<D> (attn_combine_h_<D>: its bf16 output as fp16), the instances of attention.cuh's bodies as kernels
// of their own. dev/cuda/decode_persistent.cu
// runs the same bodies as two steps of one persistent kernel.
// Twin: ops.cache_attention (ops.apply_rope + ops.attention); attention.cuh describes the algorithm.
#include "attention.cuh"

// ATT_MINB (undefined here): a minimum of resident partial blocks an SM (__launch_bounds__'s second argument), the
// register cap that dev/cuda/attn_micro.py --variant measures (BENCHMARKS.md, issue 29's last call).
#ifdef ATT_MINB
#define ATT_PARTIAL_BOUNDS __launch_bounds__(128, ATT_MINB)
#else
#define ATT_PARTIAL_BOUNDS __launch_bounds__(128)
#endif

#define ATT_INSTANCES(D)                                                                                              \
    extern "C" __global__ void ATT_PARTIAL_BOUNDS attn_partial_##D(                                                   \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ kc, const bf16_t* __restrict__ vc,      \
        const int* __restrict__ order, const int* __restrict__ params, int q_off, int T, int group, int cap,          \
        const float* __restrict__ cosT, const float* __restrict__ sinT, float scale_log2, int bidir_from,             \
        float* __restrict__ part_o, float* __restrict__ part_ml) {                                                    \
        __shared__ __align__(16) bf16_t Qs[ATT_ROWS][D + 8];                                                          \
        __shared__ __align__(16) bf16_t Ks[ATT_TILE][D + 8];                                                          \
        __shared__ __align__(16) bf16_t Vs[2][ATT_TILE][D + 8];                                                       \
        const AttItem it{(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)gridDim.z, (int)threadIdx.x};        \
        attn_partial_body<D, 4>(it, AttOwnKernel{}, AttTiles<D>{Qs, Ks, Vs}, q, q_stride, kc, vc, order, params,      \
                                q_off, T, group, cap, cosT, sinT, scale_log2, bidir_from, part_o, part_ml);           \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(256) attn_partial_w8_##D(                                            \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ kc, const bf16_t* __restrict__ vc,      \
        const int* __restrict__ order, const int* __restrict__ params, int q_off, int T, int group, int cap,          \
        const float* __restrict__ cosT, const float* __restrict__ sinT, float scale_log2, int bidir_from,             \
        float* __restrict__ part_o, float* __restrict__ part_ml) {                                                    \
        extern __shared__ __align__(16) unsigned char att_smem[]; /* ATT_SMEM_BYTES(D, 8): over 48 KB at D 128 */     \
        bf16_t* t = (bf16_t*)att_smem;                                                                                \
        const AttTiles<D> tiles{(bf16_t(*)[D + 8])t, (bf16_t(*)[D + 8])(t + 128 * (D + 8)),                           \
                                (bf16_t(*)[ATT_TILE][D + 8])(t + (128 + ATT_TILE) * (D + 8))};                        \
        const AttItem it{(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z, (int)gridDim.z, (int)threadIdx.x};        \
        attn_partial_body<D, 8>(it, AttOwnKernel{}, tiles, q, q_stride, kc, vc, order, params, q_off, T, group, cap,  \
                                cosT, sinT, scale_log2, bidir_from, part_o, part_ml);                                 \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(D) attn_combine_##D(                                                 \
        const float* __restrict__ part_o, const float* __restrict__ part_ml, int nrg, int nsplit, int T,              \
        int group, int out_stride, float* __restrict__ out, bf16_t* __restrict__ out_bf) {                            \
        __shared__ float sm[MAX_SPLITS], sl[MAX_SPLITS], sw[MAX_SPLITS];                                              \
        attn_combine_body<D>((int)blockIdx.x, (int)threadIdx.x, AttOwnKernel{}, AttCombineSmem{sm, sl, sw}, part_o,   \
                             part_ml, nrg, nsplit, T, group, out_stride, out, out_bf);                                \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(D) attn_combine_h_##D(                                               \
        const float* __restrict__ part_o, const float* __restrict__ part_ml, int nrg, int nsplit, int T,              \
        int group, int out_stride, float* __restrict__ out, bf16_t* __restrict__ out_h) {                             \
        __shared__ float sm[MAX_SPLITS], sl[MAX_SPLITS], sw[MAX_SPLITS];                                              \
        attn_combine_body<D, AttOwnKernel, true>((int)blockIdx.x, (int)threadIdx.x, AttOwnKernel{},                   \
                                                 AttCombineSmem{sm, sl, sw}, part_o, part_ml, nrg, nsplit, T, group,  \
                                                 out_stride, out, out_h);                                             \
    }

ATT_INSTANCES(64)
ATT_INSTANCES(128)
