#!/usr/bin/env bash
# The decode kernel's hottest SASS instructions by ncu's warp-stall samples, for one call of each
# case in CASES ("preset:T ..."), so a slow phase can be found without dev switches in src/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
[ -x build-gpu/bench/latentkv-bench ] || bash scripts/gpu_check.sh build > "$OUT/check.txt" 2>&1
B=build-gpu/bench/latentkv-bench
for c in ${CASES:-deepseek-v2-lite:16}; do
  preset=${c%:*}; t=${c#*:}
  f="$OUT/sass_${preset}_$t.csv"
  ncu --clock-control none --kernel-name regex:"decode_kernel" --launch-skip 30 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
    $B --preset $preset --tokens $t --dtype bfloat16 --strategy cuda-decode --iters 5 > "$f" 2>/dev/null
  echo "== $preset T=$t: hottest instructions (stall samples, % of all)"
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
