// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// EXPLORATION (not shipped; BENCHMARKS.md "The persistent decode pass"): the decode pass as one persistent kernel that
// walks every layer of one decode token. Measured on the H200 (2026-12-02) it was 1.8x SLOWER than the shipped
// kernel-per-op pass (4-bit 1.5B: 57.3 vs 32.1 us a layer). A grid barrier costs ~1 us, as predicted; the steps got
// slower: 255 registers (the attention body alone takes 245) leave 8 warps an SM, and the GEMV steps take ~39 us a
// layer (35 even at 16 warps an SM) against 22.4 as kernels of their own, attention + combine ~12 against 8.8. Kept,
// with dev/cuda/decode_micro.py, as the harness for the next attempt.
// Its blocks (one an SM, all resident: a cooperative launch) run the same bodies the per-op kernels run (gemv.cuh,
// attention.cuh), six steps a layer:
//   q/k/v (+ norm, bias, K/V write) | attention partials | combine | o projection (+ residual) | gate/up (+ norm,
//   SwiGLU) | down projection (+ residual),
// separated by grid barriers instead of kernel boundaries. A barrier is split in two: a block ARRIVES as soon as it is
// done with a step (its threads synchronised, then one release-add on the step's counter), then issues the next step's
// weight loads into its shared-memory ring (they depend on nothing), and only then WAITS for the counter to reach the
// grid size (an acquire spin). Each step has its own counter (6 a layer, zeroed by the host before the pass), so a
// block that skips a step (no attention item) can never be mistaken for one that finished it.
// Data written inside the pass is read with __ldcg (the hooks' ld), never the read-only path.
// Attention runs on warps 0-3 of a block (the body's 128 threads; items (KV head g, split sp) dealt round-robin over
// the blocks: one each when NKV x nsplit <= blocks, as decode_micro.py picks nsplit), the combine
// on groups of DH threads (one query head's row each); the other warps go straight to the next step.
// Twin: the per-op kernels it is built from (kernels/gemv.cu, kernels/attention.cu); decode_micro.py compares x after
// one pass of each variant with the shipped kernels' chain.
// Instances: decode_pass<F, DH, KVH, FH, KVO, FO, KVD, FD> (NVRTC name expressions), F = Bf16W | F16W | Q4W,
// DH = head_dim, KV*/F* the GEMV instances of the hidden (q/k/v, gate/up), o and down rows (cuda/launch.py
// gemv_plan's choice).
#include "attention.cuh"
#include "gemv.cuh"

#define DEC_THREADS 256
#define DEC_STEPS 6  // grid barriers a layer
// decode_micro.py variants (the defaults are the measured kernel): DEC_SKIP leaves steps out (bit s: step s + 1) but
// keeps their barriers; DEC_FENCE 0 drops the __threadfence() around the release/acquire pair; DEC_MINB: blocks an SM
#ifndef DEC_SKIP
#define DEC_SKIP 0
#endif
#ifndef DEC_FENCE
#define DEC_FENCE 1
#endif
#ifndef DEC_MINB
#define DEC_MINB 1
#endif

// One layer's weights and cache (decode_micro.py's layer_table, from the backend's arrays): for bf16 the
// w* pointers are the weights and the s* pointers null; for 4-bit w* = Q, s* = SZ.
struct DecLayer {
    const bf16_t* ln1;
    const bf16_t* ln2;
    const float* bqkv;
    const void* wqkv;
    const unsigned* sqkv;
    const void* wo;
    const unsigned* so;
    const void* wgu;
    const unsigned* sgu;
    const void* wd;
    const unsigned* sd;
    bf16_t* kc;
    bf16_t* vc;
};

template <bool F16>
__device__ __forceinline__ W16<F16> dec_weights(W16<F16>*, const void* w, const unsigned*, int) {
    return W16<F16>{(const bf16_t*)w};
}
__device__ __forceinline__ Q4W dec_weights(Q4W*, const void* w, const unsigned* s, int sbf) {
    return Q4W{(const unsigned*)w, s, sbf};
}

// ---- the grid barrier: arrive (release) and wait (acquire), on one counter a step ----------------------------------
__device__ __forceinline__ void dec_arrive(unsigned* c) {
    __syncthreads();  // every thread of the block is done with the step (its writes ordered before the release)
    if (threadIdx.x == 0) {
        if (DEC_FENCE) __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    }
}
__device__ __forceinline__ void dec_spin(const unsigned* c, unsigned n) {
    unsigned v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
    } while (v < n);
    if (DEC_FENCE) __threadfence();
}
// The whole block waits (a GEMV or combine step); c null: nothing to wait for inside the pass.
struct DecWait {
    const unsigned* c;
    unsigned n;
    __device__ __forceinline__ void operator()() const {
        if (threadIdx.x == 0 && c != nullptr) dec_spin(c, n);
        __syncthreads();
    }
    template <class T>
    __device__ __forceinline__ static T ld(const T* p) { return __ldcg(p); }
};
// Warps 0-3 wait / synchronise among themselves (an attention item; named barrier 1).
struct DecAttHooks {
    const unsigned* c;
    unsigned n;
    __device__ __forceinline__ void trigger() const {}
    __device__ __forceinline__ void wait() const {
        if (threadIdx.x == 0) dec_spin(c, n);
        asm volatile("bar.sync 1, 128;" ::: "memory");
    }
    __device__ __forceinline__ void sync() const { asm volatile("bar.sync 1, 128;" ::: "memory"); }
    template <class T>
    __device__ __forceinline__ static T ld(const T* p) { return __ldcg(p); }
};
// A group of DH threads synchronises among themselves (one combine row; named barriers 2..).
template <int DH>
struct DecCombineHooks {
    int group;
    __device__ __forceinline__ void trigger() const {}
    __device__ __forceinline__ void wait() const {}
    __device__ __forceinline__ void sync() const {
        asm volatile("bar.sync %0, %1;" ::"r"(2 + group), "n"(DH) : "memory");
    }
    template <class T>
    __device__ __forceinline__ static T ld(const T* p) { return __ldcg(p); }
    __device__ __forceinline__ static unsigned row_threads() { return DH; }
};

// One attention item, not inlined: the partial body needs ~245 registers of its own, and as a call it does not add
// the pass's live state to them (inlined, the pass spilled ~650 bytes a thread for head_dim 128).
template <int DH>
__device__ __noinline__ void dec_attention_item(AttItem ai, DecAttHooks hk, unsigned char* smem, const float* q, int NQ,
                                                const bf16_t* kc, const bf16_t* vc, const int* order,
                                                const int* params, int q_off, int group, int cap, const float* cosT,
                                                const float* sinT, float scale_log2, float* part_o, float* part_ml) {
    bf16_t* t = (bf16_t*)smem;
    const AttTiles<DH> tiles{(bf16_t(*)[DH + 8])t, (bf16_t(*)[DH + 8])(t + ATT_ROWS * (DH + 8)),
                             (bf16_t(*)[ATT_TILE][DH + 8])(t + (ATT_ROWS + ATT_TILE) * (DH + 8))};
    attn_partial_body<DH, 4>(ai, hk, tiles, q, NQ, kc, vc, order, params, q_off, 1, group, cap, cosT, sinT, scale_log2, 1,
                          part_o, part_ml);
}

template <class F, int DH, int KVH, bool FH, int KVO, bool FO, int KVD, bool FD>
__global__ void __launch_bounds__(DEC_THREADS, DEC_MINB) decode_pass(
    const DecLayer* __restrict__ layers, int n_layers, int sbf, float* x, float* q, float* att, float* act,
    float* part_o, float* part_ml, const int* __restrict__ order, const int* __restrict__ params, int q_off, int cap,
    const float* __restrict__ cosT, const float* __restrict__ sinT, float scale_log2, int nsplit, int H, int I,
    int NQ, int NKVD, int nkv, int group, float eps, int s_o, int s_d, unsigned* bar) {
    extern __shared__ __align__(16) unsigned char dec_smem[];
    const StepGrid grid{gridDim.x, blockIdx.x};
    const unsigned nb = gridDim.x;
    constexpr int ROWS_A_BLOCK = DEC_THREADS / DH;  // combine rows a block
    const int items = nkv * nsplit, rows = nkv * group;
    for (int l = 0; l < n_layers; ++l) {
        const DecLayer& ly = layers[l];  // fields read where used: fewer live registers
        unsigned* b = bar + DEC_STEPS * l;
        const unsigned* prev = l > 0 ? b - 1 : nullptr;  // the layer before: its down projection
        F* tag = nullptr;
        // 1. q/k/v: waits for the previous layer (the first layer's x comes from the kernel before this one)
        if (DEC_SKIP & 1)
            DecWait{prev, nb}();
        else
            gemv_qkv_body<F, KVH, F::RB_QKV, FH>(grid, DecWait{prev, nb}, x, ly.ln1, eps,
                                                 dec_weights(tag, ly.wqkv, ly.sqkv, sbf), ly.bqkv, H, NQ, NKVD, q,
                                                 ly.kc, ly.vc, order, params, q_off, cap, DH, dec_smem);
        dec_arrive(b + 0);
        // 2. attention partials, one (KV head, split) item at a time on warps 0-3
        if (!(DEC_SKIP & 2) && threadIdx.x < 128) {
            for (int it = blockIdx.x; it < items; it += gridDim.x) {
                const AttItem ai{it % nkv, 0, it / nkv, nsplit, (int)threadIdx.x};
                dec_attention_item<DH>(ai, DecAttHooks{b + 0, nb}, dec_smem, q, NQ, ly.kc, ly.vc, order,
                                       params, q_off, group, cap, cosT, sinT, scale_log2, part_o, part_ml);
                asm volatile("bar.sync 1, 128;" ::: "memory");  // the next item's staging reuses the tiles
            }
        }
        dec_arrive(b + 1);
        // 3. combine: a row (query head) per DH threads
        {
            const int sub = threadIdx.x / DH;
            const int first = blockIdx.x * ROWS_A_BLOCK + sub;
            if (!(DEC_SKIP & 4) && blockIdx.x * ROWS_A_BLOCK < rows) {
                DecWait{b + 1, nb}();
                float* cm = (float*)dec_smem + 3 * MAX_SPLITS * sub;
                const AttCombineSmem cs{cm, cm + MAX_SPLITS, cm + 2 * MAX_SPLITS};
                for (int r = first; r < rows; r += gridDim.x * ROWS_A_BLOCK) {
                    const int rowid = (r / group) * ATT_ROWS + r % group;  // KV head g's row group 0, row hh
                    attn_combine_body<DH>(rowid, threadIdx.x % DH, DecCombineHooks<DH>{sub}, cs, part_o, part_ml, 1,
                                          nsplit, 1, group, NQ, att, nullptr);
                    DecCombineHooks<DH>{sub}.sync();
                }
            }
        }
        dec_arrive(b + 2);
        // 4. o projection + residual
        if (DEC_SKIP & 8)
            DecWait{b + 2, nb}();
        else
            gemv_proj_body<F, KVO, F::RB_PROJ, FO>(grid, DecWait{b + 2, nb}, att, dec_weights(tag, ly.wo, ly.so, sbf),
                                                   NQ, H, x, s_o, dec_smem);
        dec_arrive(b + 3);
        // 5. gate/up + norm + SwiGLU
        if (DEC_SKIP & 16)
            DecWait{b + 3, nb}();
        else
            gemv_gateup_body<F, KVH, F::RB_PAIRS, FH>(grid, DecWait{b + 3, nb}, x, ly.ln2, eps,
                                                      dec_weights(tag, ly.wgu, ly.sgu, sbf), H, I, act, dec_smem);
        dec_arrive(b + 4);
        // 6. down projection + residual
        if (DEC_SKIP & 32)
            DecWait{b + 4, nb}();
        else
            gemv_proj_body<F, KVD, F::RB_PROJ, FD>(grid, DecWait{b + 4, nb}, act, dec_weights(tag, ly.wd, ly.sd, sbf),
                                                   I, H, x, s_d, dec_smem);
        dec_arrive(b + 5);
    }
}
