#!/usr/bin/env bash
# One device call: the tree against three carveout preferences (dev/mla_decode_l1_held_b.patch,
# _k1.patch, _k1_held_b.patch: variants C, D, E), timing only, on the rows the held one-tile K3
# and K1 run (V2-Lite, Kimi K2, V3 kv), then ncu's launch statistics of the tree's and E's
# kernels at V2-Lite T=1.
#   bash dev/carveout_call2.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
PATCHES="dev/mla_decode_l1_held_b.patch dev/mla_decode_l1_k1.patch dev/mla_decode_l1_k1_held_b.patch" \
TEST_VARIANTS=N CASES="--preset deepseek-v2-lite-mla --tokens 1,4,16,32,64 --quiet;--preset deepseek-v2-lite-mla --stage first --tokens 1,16 --quiet;--preset deepseek-v3-mla --q-rank 0 --tokens 1,16 --quiet;--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1,16 --quiet;--preset kimi-k2-mla --q-rank 0 --tokens 1,16 --quiet;--preset deepseek-v3-mla --tokens 1 --quiet" \
  timeout 400 bash dev/variants_ab.sh
for v in A E; do
  B=/tmp/variants/$v/bg/bench/latentkv-bench
  echo "==== $v: V2-Lite T=1"
  timeout 40 ncu --clock-control none --section LaunchStats --section Occupancy \
    -k regex:mla_decode -c 2 $B --preset deepseek-v2-lite-mla --tokens 1 --strategy cuda-mla-decode --quiet 2>&1 |
    grep -E "mla_decode_|Shared Memory Configuration Size|Block Limit Shared|Achieved Occupancy" | cut -c1-140
done
