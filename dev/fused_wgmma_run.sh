#!/usr/bin/env bash
# One device call for dev/fused_wgmma_3xtf32_probe.cu (issue 17, many tokens at the founding
# widths): builds the library (Release) and the probe, runs the probe's errors under
# compute-sanitizer memcheck and racecheck (T = 1, 100, 733), then its sweep against the library's
# kAuto in the same process. Output: stdout and $OUT/fused_wgmma.txt; the table is last.
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
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v -Iinclude -Idev \
  dev/fused_wgmma_3xtf32_probe.cu "$build/src/liblatentkv.a" -lcublasLt -lcublas \
  -o /tmp/fused_wgmma_probe 2>&1 | grep -E "registers|spill|warn" | tee -a "$log"
[ -x /tmp/fused_wgmma_probe ] || exit 1
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool (probe kernels and the library's)" | tee -a "$log"
  timeout 240 compute-sanitizer --tool "$tool" --kernel-name regex:fused_wgmma \
    /tmp/fused_wgmma_probe --check 1 100 733 2>&1 | tail -8 | tee -a "$log"
done
echo "== sweep" | tee -a "$log"
timeout 300 /tmp/fused_wgmma_probe "$@" 2>&1 | tee -a "$log"
