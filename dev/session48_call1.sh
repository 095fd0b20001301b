#!/usr/bin/env bash
# Prepared in session 48 (not run: the device was not lent after its first call). One A/B call
# (~500 s): A = the tree, C = A + dev/mla_stage_a_prologue.patch (cuda-mla-gemm's stage-A
# prologue beside stage A's GEMM: each token's slot and RoPE angles found there, so the epilogue
# reads them from L2 instead of starting with the position -> table round trips), D = C +
# dev/mla_epilogue_vectors.patch (the epilogue's sums of squares and q_a / cache / latent stores
# in 4-column vectors), E = D + dev/mla_epilogue_four_warps.patch (4 warps a token at T = 1024;
# timing only: the whole-path rows). Every MLA GPU test on C and D, memcheck and racecheck on D
# (whose code holds all of C's) on the epilogue's sliced / halved / wide cases and the late-writer
# test, then the prefill rows.
#   run: bash dev/session48_call1.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
P=dev/mla_stage_a_prologue.patch V=dev/mla_epilogue_vectors.patch
PATCHES="$P $P+$V $P+$V+dev/mla_epilogue_four_warps.patch" \
TEST_VARIANTS="C D" TESTS='*Mla*' SANITIZE_C='NoSuchTest.None' VARIANTS_2=ACD VARIANTS_3=ACD \
SANITIZE='*dslices*bfloat16*:*dhalves_*bfloat16*:*wide_*bfloat16*:MlaGpu.NoKernel*' \
CASES='--preset deepseek-v2-lite-mla --tokens 128,1024,4096;--preset deepseek-v3-mla --q-rank 0 --tokens 128,1024,4096;--preset deepseek-v3-mla --stage first --tokens 128,1024;--preset deepseek-v2-lite-mla --stage first --tokens 256' \
  timeout 500 bash dev/variants_ab.sh > "$OUT/ab.txt" 2>&1
grep -E "tests|memcheck|racecheck|FAILED" "$OUT/ab.txt" | tail -12
tail -16 "$OUT/ab.txt"
