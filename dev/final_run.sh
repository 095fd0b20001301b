#!/usr/bin/env bash
# The closing device run: build, GPU tests, Python tests, the founding-case and MLA sweeps, then
# compute-sanitizer on the decode and graph tests (last: the slowest part). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
bash scripts/gpu_check.sh build test python > "$OUT/check.txt" 2>&1
grep "^== " "$OUT/check.txt"
B=build-gpu/bench/latentkv-bench
$B 2>/dev/null | tail -4 > "$OUT/founding.txt"; cat "$OUT/founding.txt"
$B --sweep-mla 2>/dev/null | grep -E "^(case|deepseek.* (PASS|FAIL))" | tee "$OUT/sweep_mla.txt"
SANITIZE_FILTER='*GpuDecode*:*Graphs*' timeout 240 bash scripts/gpu_check.sh sanitize 2>&1 | grep "^== "
