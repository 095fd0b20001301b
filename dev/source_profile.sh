#!/usr/bin/env bash
# Where one kernel's warps wait, instruction by instruction: ncu's PC sampling (every 32 cycles,
# clocks not locked, ncu's cache control on) of one launch, read back as the SASS source page, then
# dev/source_profile_table.py prints the instructions that hold the most stall samples and the
# samples per phase (the stretches between barriers). The report and the page's CSV go to $OUT.
#   bash dev/source_profile.sh NAME BENCH "BENCH ARGS" KERNEL_REGEX
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
name=$1 bench=$2 args=$3 kernel=$4
ncu --clock-control none --warp-sampling-interval 0 -k "regex:$kernel" -c 1 \
  --section SourceCounters --section WarpStateStats --section InstructionStats \
  --section SpeedOfLight -f -o "$OUT/$name" $bench $args --iters 2 --warmup 0 --seconds 0.01 \
  > "$OUT/$name.ncu.log" 2>&1 || { tail -20 "$OUT/$name.ncu.log"; exit 1; }
ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
ncu -i "$OUT/$name.ncu-rep" --page details --print-details all > "$OUT/$name.details.txt" 2>&1
grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  |Stall|Issued Warp" \
  "$OUT/$name.details.txt" | head -20
python3 dev/source_profile_table.py "$OUT/$name.sass.csv"
