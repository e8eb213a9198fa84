// Copyright 2026 vla_edge_ros maintainers
// SPDX-License-Identifier: Apache-2.0
// Phase timestamps: one thread writes %globaltimer (ns) into ts[i]. Placed between phases in the graph.
// Twin: none needed (a %globaltimer stamp); its GPU test checks the stamps increase.
#include "common.cuh"

extern "C" __global__ void stamp(unsigned long long* ts, int i) {
    PDL_ENTRY();
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    ts[i] = t;
}
