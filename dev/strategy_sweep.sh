#!/usr/bin/env bash
# Dev: the sweep under each CUDA strategy and dtype, tables only (run after scripts/gpu_check.sh build).
B=build-gpu/bench/latentkv-bench
OUT=${OUT:-/tmp}
run() { echo "### $*"; $B "$@" >"$OUT/$(echo "$*" | tr -c "a-zA-Z0-9\n" "_").txt" 2>/dev/null; awk "/^case /{f=1} f" "$OUT/$(echo "$*" | tr -c "a-zA-Z0-9\n" "_").txt"; }
run --sweep --strategy cuda-fused
run --sweep --strategy cuda-gemm
run --preset deepseek-v2-lite --tokens 1,64,1024,8192 --dtype bfloat16
run --preset deepseek-v3 --tokens 1,128,4096 --dtype bfloat16
