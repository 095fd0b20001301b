#!/usr/bin/env bash
# One device call: the tree against dev/mla_decode_prefer_l1.patch (variant C: every
# cuda-mla-decode kernel preferring the largest L1) on V3's and V2-Lite's decode rows, then ncu's
# launch statistics (the shared-memory carveout the driver chose, "Shared Memory Configuration
# Size") for the tree's K1, KA, K2 and K3 at V3 T=1 and for the patch's.
#   bash dev/carveout_call.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
PATCHES=dev/mla_decode_prefer_l1.patch TEST_VARIANTS=N CASES="--preset deepseek-v3-mla --stage first --tokens 1,16 --quiet;--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1,16 --quiet;--preset deepseek-v3-mla --q-rank 0 --tokens 1,16 --quiet;--preset deepseek-v3-mla --tokens 1 --quiet;--preset deepseek-v3-mla --q-rank 0 --stage second --tokens 1 --quiet;--preset deepseek-v2-lite-mla --tokens 1,16 --quiet;--preset deepseek-v2-lite-mla --stage first --tokens 1 --quiet" \
  timeout 300 bash dev/variants_ab.sh
for v in A C; do
  B=/tmp/variants/$v/bg/bench/latentkv-bench
  for args in "--preset deepseek-v3-mla --tokens 1" "--preset deepseek-v3-mla --q-rank 0 --tokens 1"; do
    echo "==== $v: $args"
    timeout 60 ncu --clock-control none --section LaunchStats --section Occupancy \
      -k regex:mla_decode -c 4 $B $args --strategy cuda-mla-decode --quiet 2>&1 |
      grep -E "mla_decode_|Shared Memory Configuration Size|Driver Shared Memory|Dynamic Shared|Static Shared|Registers Per|Achieved Occupancy|Block Limit Shared" | cut -c1-140
  done
done
