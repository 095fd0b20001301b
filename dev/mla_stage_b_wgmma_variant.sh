#!/usr/bin/env bash
# EXPERIMENT helper (with dev/mla_stage_b_wgmma.patch applied): rewrites the configuration lines
# of src/cuda/mla_stage_b_wgmma.cu in place for an A/B: $1 tile M (128 | 256), $2 cluster M
# (1 | 2), $3 Pingpong | Cooperative; then rebuild and time with latentkv-bench --strategy
# cuda-mla-wgmma.
f=src/cuda/mla_stage_b_wgmma.cu
sed -i -E "s/^constexpr int kTileM = [0-9]+;/constexpr int kTileM = $1;/; s/^constexpr int kClusterM = [0-9]+;/constexpr int kClusterM = $2;/; s/^using Schedule = cutlass::gemm::KernelTmaWarpSpecialized[A-Za-z]+;/using Schedule = cutlass::gemm::KernelTmaWarpSpecialized$3;/" "$f"
grep -E "^constexpr int kTileM|^constexpr int kClusterM|^using Schedule" "$f" | tr '\n' ' '
echo
