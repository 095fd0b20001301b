#!/usr/bin/env bash
# One device call that reads the whole tree: build, every GPU test, compute-sanitizer on
# SANITIZE_FILTER, latentkv-bench --sweep-mla-path (issue 15's and 16's rows) once, then the
# Python package and python/bench/bench_mla.py's rows (default: all) against transformers' code
# (dev/bench_mla_call.sh).
# Each part capped so the call ends inside the device's 600 s.
#   SANITIZE_FILTER   gtest filter for the sanitizers (default: cuda-mla-decode's K2 cases)
#   MLA_ROWS          bench_mla.py --rows (default: its own, every model and T)
#   READOUT_CHECKS    gpu_check.sh's stages (default "build test sanitize"; "build" where an A/B
#                     of the same call's code already ran the tests)
#   run: bash dev/readout_call.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
start=$SECONDS
CTEST=0 SANITIZE_FILTER="${SANITIZE_FILTER:-MlaDecode/*slices*:MlaDecode/*rows*}" \
  timeout 240 bash scripts/gpu_check.sh ${READOUT_CHECKS:-build test sanitize} >"$OUT/check.txt" 2>&1
grep -E "^== " "$OUT/check.txt"; echo "checks done at $((SECONDS - start)) s"
timeout 130 build-gpu/bench/latentkv-bench --sweep-mla-path --quiet >"$OUT/sweep_mla_path.txt" 2>&1
echo "sweep rc=$? at $((SECONDS - start)) s"
MLA_S=170 bash dev/bench_mla_call.sh
tail -30 "$OUT/sweep_mla_path.txt"
