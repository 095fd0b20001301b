#!/usr/bin/env bash
# Where the tensor-core decode kernel's time goes (bf16), for one call of each case in CASES
# ("preset:T ..."): ncu's speed-of-light, launch and warp-stall metrics, and with SASS=1 the
# hottest SASS instructions by warp-stall samples (to find a slow phase without dev switches in
# src/). The GPU machine has no nsys. KERNEL (a regex; default kv_proj_decode_tc_sm90) and STRATEGY
# profile another kernel, e.g. KERNEL=gemm STRATEGY=cuda-gemm (cuBLAS's kernels).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
[ -x build-gpu/bench/latentkv-bench ] || bash scripts/gpu_check.sh build > "$OUT/check.txt" 2>&1
B=build-gpu/bench/latentkv-bench
for c in ${CASES:-deepseek-v2-lite:1 deepseek-v2-lite:16 deepseek-v3:1}; do
  preset=${c%:*}; t=${c#*:}
  ARGS="--preset $preset --tokens $t --dtype bfloat16 --strategy ${STRATEGY:-cuda-decode} --iters 5"
  NCU="ncu --clock-control none --kernel-name regex:${KERNEL:-kv_proj_decode_tc_sm90} --launch-skip 30 --launch-count 1"
  echo "== $preset T=$t"
  $NCU --section SpeedOfLight --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    $B $ARGS > "$OUT/ncu_${preset}_$t.txt" 2>&1
  grep -E "Duration|Memory Throughput|DRAM Through|Dynamic Shared|Grid Size" "$OUT/ncu_${preset}_$t.txt" | head -8
  grep -E "issue_stalled" "$OUT/ncu_${preset}_$t.txt" | awk '$NF+0 > 0.05' | sed -E "s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//" | sort -k3 -g -r | head -8
  [ "${SASS:-0}" = 1 ] || continue
  f="$OUT/sass_${preset}_$t.csv"
  $NCU --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
    $B $ARGS > "$f" 2>/dev/null
  echo "-- hottest instructions (stall samples, % of all)"
  python3 - "$f" <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
head, rows = rows[start], rows[start:]
col = next(i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All"))
src = next(i for i, h in enumerate(head) if h == "Source")
addr = next(i for i, h in enumerate(head) if h == "Address")
body = [r for r in rows[1:] if len(r) == len(head)]
val = lambda r: float(r[col].replace(",", "") or 0)
total = sum(val(r) for r in body) or 1
for r in sorted(body, key=val, reverse=True)[:int(sys.argv[2]) if len(sys.argv) > 2 else 30]:
    print(f"{100 * val(r) / total:5.1f}%  {r[addr]:>6}  {r[src][:90]}")
PY

done
