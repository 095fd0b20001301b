#!/usr/bin/env bash
# Issue 17's next GPU call (written 2026-12-01, not yet run): builds and runs the two founding
# probes (dev/founding_chain_probe.cu: the bytes with no math; dev/fused_one_token_probe.cu: a
# short-chain kernel at T = 1 and 4 over 2-16 blocks), then times cuda-fused at few tokens through
# latentkv-bench and reads its T=1 kernel with ncu. Run from the repository root on the GPU
# machine; logs go to $OUT and a short summary is printed last.
set -u
A="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude"
nvcc $A dev/founding_chain_probe.cu -o /tmp/founding_chain_probe || exit 1
nvcc $A dev/fused_one_token_probe.cu -o /tmp/fused_one_token_probe || exit 1
/tmp/founding_chain_probe > "$OUT/chain_probe.txt" 2>&1; echo "chain probe rc=$?"
/tmp/fused_one_token_probe > "$OUT/one_token_probe.txt" 2>&1; echo "one-token probe rc=$?"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  > /dev/null && cmake --build build-gpu -j16 --target latentkv-bench > /dev/null || exit 1
B=build-gpu/bench/latentkv-bench
$B --tokens 1,2,4,7,16,64,128,264,384 --strategy cuda-fused --quiet > "$OUT/bench.txt" 2>&1
echo "bench rc=$?"
timeout 120 ncu --clock-control none --set full -k regex:kv_proj_fused --launch-skip 20 \
  --launch-count 1 $B --tokens 1 --strategy cuda-fused --iters 5 --warmup 2 --quiet \
  > "$OUT/ncu_t1.txt" 2>&1
echo "ncu rc=$?"
cat "$OUT/chain_probe.txt" "$OUT/one_token_probe.txt"
grep -E "PASS|FAIL" "$OUT/bench.txt" | grep -v "^  "
