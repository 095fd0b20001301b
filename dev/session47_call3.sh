#!/usr/bin/env bash
# Session 47's third call (~300 s): the tree (A) against C = dev/mla_epilogue_short_chains.patch
# (cuda-mla-gemm's stage-A epilogue with shorter per-warp chains), every GPU test on C and the
# sanitizers on its sliced / halved / wide epilogue cases, the prefill rows on both, then ncu's
# duration of the epilogue kernel alone in each (V2-Lite and V3 kv, T=1024).
#   run: bash dev/session47_call3.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
PATCHES="dev/mla_epilogue_short_chains.patch" TEST_VARIANTS=C TESTS_C='*' \
SANITIZE_C='*dslices*bfloat16*:*dhalves_*bfloat16*:*wide_*bfloat16*' \
CASES='--preset deepseek-v2-lite-mla --tokens 128,1024,4096;--preset deepseek-v3-mla --q-rank 0 --tokens 64,1024,4096;--preset deepseek-v3-mla --stage first --tokens 64' \
  timeout 250 bash dev/variants_ab.sh > "$OUT/ab.txt" 2>&1
grep -E "tests|memcheck|racecheck" "$OUT/ab.txt" | tail -4
tail -9 "$OUT/ab.txt"
for v in A C; do
  for c in "v2:--preset deepseek-v2-lite-mla" "v3:--preset deepseek-v3-mla --q-rank 0"; do
    name=${c%%:*}; args=${c#*:}
    timeout 25 ncu --clock-control none -k regex:mla_stage_a_epilogue -c 1 \
      --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
      /tmp/variants/$v/bg/bench/latentkv-bench $args --tokens 1024 --iters 1 --warmup 0 \
      --seconds 0.01 --no-rotate 2>&1 | grep -E "gpu__time|inst_executed" | sed "s/^ */$v $name /"
  done
done
