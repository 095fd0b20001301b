#!/usr/bin/env bash
# Where the tree's cuda-mla-decode kernels wait on V2-Lite's whole path (issues 15/16): ncu PC
# sampling (dev/source_profile.sh) of K1, the whole-row K2 and K3 at T=64 and T=16, and of K3
# at T=1 (the T=1 fold). Session 34 found stage B of the window fold waiting mostly on
# instruction fetch (7,064 SASS instructions, each run about once a warp); this says whether the
# tree's kernels do too. Reports and tables in $OUT; the tables on stdout.
#   bash dev/mla_decode_tree_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT/prof"
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
cmake -S . -B /tmp/tp $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLATENTKV_BUILD_TESTS=OFF > "$OUT/prof/build.log" 2>&1 &&
  cmake --build /tmp/tp -j 16 --target latentkv-bench >> "$OUT/prof/build.log" 2>&1 ||
  { tail -30 "$OUT/prof/build.log"; exit 1; }
echo "build done at ${SECONDS} s"
B=/tmp/tp/bench/latentkv-bench
for job in "64 mla_decode_stage_a$" "64 mla_decode_stage_a_row_epilogue" "64 mla_decode_stage_b" \
           "16 mla_decode_stage_b" "16 mla_decode_stage_a_row_epilogue" "1 mla_decode_stage_b"; do
  set -- $job
  name="T$1_$(echo "$2" | tr -dc 'a-z_')"
  echo "==== $name"
  OUT=$OUT/prof timeout 60 bash dev/source_profile.sh "$name" $B \
    "--preset deepseek-v2-lite-mla --tokens $1 --strategy cuda-mla-decode" "$2" 2>&1 |
    grep -vE "Stall (Drain|GMMA|Membar|Misc|Sleeping|MIO|Dispatch|LG)" | head -24 | cut -c1-150
done
echo "profiles done at ${SECONDS} s"
tar -czf "$OUT/prof.tgz" -C "$OUT" prof && rm -rf "$OUT/prof"
