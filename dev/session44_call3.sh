#!/usr/bin/env bash
# Session 44's third call (~450 s on an H100): the held K3's MMA stretch (1.45 us between its
# staging and its first tile's MMAs with every operand on chip; ncu: 'wait' and short-scoreboard
# stalls in a chain of LDS -> HMMA -> HMMA per K-block behind a per-K-block branch).
#   A  the tree
#   C  dev/mla_mma_step_no_break.patch: mma_step without the branch at `end` at one token tile
#   D  dev/mla_mma_step_four_chains.patch: C, and K3's one-tile accumulators in four chains with a
#      K-block's halves on two of them
# MlaDecode/* GPU tests on C and D, memcheck and racecheck on D's one-token cases, then the rows.
cd "$(dirname "$0")/.."
PATCHES="dev/mla_mma_step_no_break.patch dev/mla_mma_step_four_chains.patch" TEST_VARIANTS=CD \
TESTS="MlaDecode/*:MlaDecodeGpu.*" SANITIZE_D="MlaDecode/*one_token*" \
CASES="--preset deepseek-v2-lite-mla --tokens 1,16,64;--preset kimi-k2-mla --q-rank 0 --tokens 1;\
--preset deepseek-v3-mla --q-rank 0 --tokens 1,16;--preset deepseek-v2-lite-mla --stage first --tokens 1,16;\
--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1,16;--preset deepseek-v3-mla --tokens 1" \
  timeout 560 bash dev/variants_ab.sh
