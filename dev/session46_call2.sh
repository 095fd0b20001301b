#!/usr/bin/env bash
# Session 46's second call (~250 s): the working tree (A: stage B's two-tile mma_step and column
# pair, K1 programmatic to 64 tokens, its L2 prefetch where stage B follows or past 16 tokens)
# against F (the prefetch only where stage B follows), every GPU test and the sanitizers on A,
# then --sweep-mla-path on A (the README's column for this card) and bench_mla.py against
# transformers' code (dev/bench_mla_call.sh), ~560 s in all; each part prints as it ends.
#   run: bash dev/session46_call2.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
PATCHES="dev/mla_stage_a_prefetch_with_stage_b_only.patch" TESTS='*' \
SANITIZE='MlaDecode/*dec_tiles_T64*bfloat16*:MlaDecode/*dec_one_token*bfloat16*:MlaDecode/*dec_outpad*:MlaGpu.NoKernelOfACall*' \
CASES='--preset deepseek-v2-lite-mla --tokens 1,16,32,64;--preset deepseek-v2-lite-mla --stage first --tokens 1,16,32,64;--preset deepseek-v3-mla --q-rank 0 --tokens 1;--preset kimi-k2-mla --q-rank 0 --tokens 1' \
  timeout 300 bash dev/variants_ab.sh > "$OUT/ab.txt" 2>&1
grep -E "tests|memcheck|racecheck" "$OUT/ab.txt" | tail -4
tail -14 "$OUT/ab.txt"
timeout 70 /tmp/variants/A/bg/bench/latentkv-bench --sweep-mla-path --quiet > "$OUT/sweep_A.txt" 2>&1
echo "sweep rc=$?"; tail -19 "$OUT/sweep_A.txt"
MLA_S=${MLA_S:-120} timeout 200 bash dev/bench_mla_call.sh
