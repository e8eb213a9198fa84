// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Prefill KV write: the T new tokens' k and v (columns NQ.. of the fused q/k/v output, fp32) are stored
// as bf16, un-rotated, into their slots order[n_prefix + q_off + t]. Cache layout [NKV, cap, D].
// Twin: the slot write of ReferenceModel.forward (k, v rounded to bf16 into order[n_prefix + t]).
#include "common.cuh"

extern "C" __global__ void kv_write(const float* __restrict__ qkv, int T, int NQ, int NKVD, int D,
                                    bf16_t* __restrict__ kc, bf16_t* __restrict__ vc, const int* __restrict__ order,
                                    const int* __restrict__ params, int q_off, int cap) {
    PDL_ENTRY();
    const int stride = NQ + 2 * NKVD;
    const int n = T * 2 * NKVD;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const int t = e / (2 * NKVD), m = e - t * 2 * NKVD;
        const int isv = m >= NKVD, mm = isv ? m - NKVD : m;
        const int g = mm / D, d = mm - g * D;
        const int slot = order[params[0] + q_off + t];
        bf16_t* dst = isv ? vc : kc;
        dst[((size_t)g * cap + slot) * D + d] = f2bf(qkv[(size_t)t * stride + NQ + m]);
    }
}
