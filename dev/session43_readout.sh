#!/usr/bin/env bash
# Session 43's readout of the tree (K1's carveout shipped): build, every GPU test, memcheck and
# racecheck on cuda-mla-decode's ring and whole-row cases, then latentkv-bench --sweep-mla-path
# (issue 15's and 16's rows) once; the sweep's table last. ~400 s on an H100.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
start=$SECONDS
CTEST=0 SANITIZE_FILTER="MlaDecode/*ring*:MlaDecode/*rows*:MlaDecode/*slices*" \
  timeout 270 bash scripts/gpu_check.sh build test sanitize >"$OUT/check.txt" 2>&1
grep -E "^== " "$OUT/check.txt"; echo "checks done at $((SECONDS - start)) s"
timeout 150 build-gpu/bench/latentkv-bench --sweep-mla-path --quiet >"$OUT/sweep_mla_path.txt" 2>&1
echo "sweep rc=$? at $((SECONDS - start)) s"
tail -45 "$OUT/sweep_mla_path.txt"
