#!/usr/bin/env bash
# One device call for dev/fused_wgmma_3xtf32_probe.cu (issue 17, the founding widths): builds the
# library (Release) and the probe, checks the operand readings one wgmma at a time
# (dev/wgmma_tf32_layout_probe.cu), runs the probe's sweep against the library's kAuto
# in the same process (errors, then times), then compute-sanitizer memcheck and racecheck (T = 1
# and 100) and ncu of each variant at T=6144 and T=384 (one launch each: --check mode; clocks not
# locked; $OUT/ncu_*.txt). Everything is written to $OUT/fused_wgmma.txt as it comes, so a call cut
# at its time limit keeps what ran. dev/fused_wgmma_table.py turns the log into the docs' tables.
# Usage (run tool, no carry): bash dev/fused_wgmma_run.sh [token counts...]
set -uo pipefail
mkdir -p "${OUT:-/tmp/out}"
OUT=$(cd "${OUT:-/tmp/out}" && pwd)
cd "$(dirname "$0")/.."
build=${BUILD:-build}
log="$OUT/fused_wgmma.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$log"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATENTKV_BUILD_TESTS=OFF \
  -DLATENTKV_BUILD_BENCH=OFF > /dev/null || exit 1
cmake --build "$build" --target latentkv > /dev/null || exit 1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -Iinclude -Isrc -Idev \
  dev/fused_wgmma_3xtf32_probe.cu "$build/src/liblatentkv.a" -lcublasLt -lcublas \
  -o /tmp/fused_wgmma_probe 2>&1 | grep -E "registers|spill|warn" | tee -a "$log"
[ -x /tmp/fused_wgmma_probe ] || exit 1
echo "== one wgmma: the operand readings (dev/wgmma_tf32_layout_probe.cu)" | tee -a "$log"
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Idev dev/wgmma_tf32_layout_probe.cu \
  -o /tmp/wgmma_layout_probe && timeout 60 /tmp/wgmma_layout_probe 2>&1 | tee -a "$log"
echo "== sweep" | tee -a "$log"
timeout 240 /tmp/fused_wgmma_probe "$@" 2>&1 | tee -a "$log"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool (the probe's kernels)" | tee -a "$log"
  timeout 100 compute-sanitizer --tool "$tool" --kernel-name kns=fused_wgmma \
    /tmp/fused_wgmma_probe --check 1 100 2>&1 | tail -8 | tee -a "$log"
done
for t in 6144 384; do
  timeout 90 ncu --clock-control none -k regex:fused_wgmma \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    /tmp/fused_wgmma_probe --check $t > "$OUT/ncu_$t.txt" 2>&1
  echo "== ncu T=$t (variants in the sweep's order)" | tee -a "$log"
  grep -E "^  fused_wgmma|Duration|Issued Ipc Active|Registers Per|Stall|DRAM Throughput|Compute \(SM\) Throughput" \
    "$OUT/ncu_$t.txt" | cut -c1-110 | head -40 | tee -a "$log"
done
echo "== the sweep again (the call's last lines): T, variant, error, us"
grep -E "^T=" "$log" | awk '{printf "%-8s %-14s %-9s %8s %s\n", $1, $3, $6, $7, $9}'
