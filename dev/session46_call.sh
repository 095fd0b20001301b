#!/usr/bin/env bash
# The next device session's first call (prepared in session 45, whose device budget went to failed
# machine starts), ~330 s: an A/B of the three stacked patches against the tree (C = stage B's
# two-tile mma_step without its branch plus the column pair, D = C plus K1's L2 prefetch before
# its wait, E = D with K1 programmatic up to 64 tokens), every GPU test on E (its kernels are D's
# and C's; it also takes the programmatic K1 at T = 17..64) with memcheck and racecheck on the
# cases each patch touches, then latentkv-bench --sweep-mla-path on E's build. Table last.
#   run: bash dev/session46_call.sh      (then, with the winners committed, dev/readout_call.sh on an
#   H200 for the README: every GPU test, the sweep and bench_mla.py against transformers)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
PATCHES="dev/mla_stage_b_two_tiles_column_pair.patch dev/mla_stage_a_prefetch_l2.patch \
dev/mla_stage_a_prefetch_l2_to_64_tokens.patch" TEST_VARIANTS=E TESTS_E='*' \
SANITIZE_E='MlaDecode/*dec_tiles_T64*bfloat16*:MlaDecode/*dec_one_token*bfloat16*:MlaDecode/*dec_outpad*:MlaGpu.NoKernelOfACall*' \
CASES='--preset deepseek-v2-lite-mla --tokens 1,16,49,64;--preset kimi-k2-mla --q-rank 0 --tokens 1;--preset deepseek-v3-mla --q-rank 0 --tokens 1;--preset deepseek-v2-lite-mla --stage first --tokens 1,16,64' \
  timeout 330 bash dev/variants_ab.sh > "$OUT/ab.txt" 2>&1
timeout 60 /tmp/variants/E/bg/bench/latentkv-bench --sweep-mla-path --quiet > "$OUT/sweep_E.txt" 2>&1
tail -19 "$OUT/sweep_E.txt"
tail -16 "$OUT/ab.txt"
