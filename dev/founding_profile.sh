#!/usr/bin/env bash
# Issue 17, for the next device session: where do cuda-fused's few-token calls spend their time?
# ncu (clocks not locked, ncu's cache control on: every load cold) of the shipped tree's kernels at
# the founding widths (T=1: one-token, T=3 and T=16: register tiles with 32 columns a block, the
# founding case: register tiles with 256) and of dev/fused_register_tiles_cluster.patch's cluster
# kernel at T=1 and T=3 (~1 us slower than the one-token kernel at T=1 on 2026-12-04 although each
# block reads 12.5 KB instead of 54 KB). Per kernel: duration, cycles, issued IPC, warp stall
# reasons, L1 wavefronts, DRAM and L2 throughput. First it runs dev/sm_intake_probe.cu (one SM's
# intake of 12-96 KB without math). Results in $OUT; a short summary on stdout.
#   bash dev/founding_profile.sh   (run tool, no carry needed)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
rm -rf /tmp/cluster && mkdir -p /tmp/cluster
git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C /tmp/cluster
patch -d /tmp/cluster -p1 -s < dev/fused_register_tiles_cluster.patch || exit 1
for tree in . /tmp/cluster; do
  (cmake -S $tree -B $tree/build-prof $gen -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_CUDA_ARCHITECTURES=90a -DLATENTKV_BUILD_TESTS=OFF > "$OUT/build_$(basename $tree).log" 2>&1 &&
   cmake --build $tree/build-prof -j 8 --target latentkv-bench >> "$OUT/build_$(basename $tree).log" 2>&1) &
done
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/sm_intake_probe.cu \
  -o /tmp/sm_intake_probe > "$OUT/build_probe.log" 2>&1 &
wait
[ -x /tmp/sm_intake_probe ] && /tmp/sm_intake_probe | tee "$OUT/sm_intake_probe.txt"
profile() {  # name, bench binary, bench arguments[, kernel regex, strategy]
  ncu --clock-control none -k regex:${4:-kv_proj} -c 2 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    "$2" $3 --strategy ${5:-cuda-fused} --iters 2 --warmup 0 --seconds 0.01 > "$OUT/ncu_$1.txt" 2>&1
  echo "== $1 ($3)"
  grep -E "^  ${4:-kv_proj}|Duration|Elapsed Cycles|Issued Ipc Active|Registers Per|Grid Size|Cluster Size|Stall|L2 Hit Rate |DRAM Throughput" \
    "$OUT/ncu_$1.txt" | head -24
}
S=build-prof/bench/latentkv-bench; C=/tmp/cluster/build-prof/bench/latentkv-bench
profile one_token_t1 $S "--tokens 1"
profile reg32_t3 $S "--tokens 3"
profile reg32_t16 $S "--tokens 16"
profile reg256_founding $S "--preset seed"
profile cluster_t1 $C "--tokens 1"
profile cluster_t3 $C "--tokens 3"
profile mla_ka_v3_t1 $S "--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1" \
  mla_decode_fused_stage_a cuda-mla-decode
profile mla_ka_v3_qa_t1 $S "--preset deepseek-v3-mla --stage first --tokens 1" \
  mla_decode_fused_stage_a cuda-mla-decode
for b in $S $C; do $b --tokens 1,3 --quiet 2>&1 | tail -3; done
# One archive: the device tool brings back at most 8 files (2026-12-05 lost 4 of the 11).
(cd "$OUT" && tar -czf founding_profile.tgz ncu_*.txt build_*.log sm_intake_probe.txt 2>/dev/null &&
  rm -f ncu_*.txt build_*.log sm_intake_probe.txt)
