#!/usr/bin/env bash
# Second device call of session 34 for the window fold (docs/experiments.md): where its stage B
# (K3) spends the ~12 us that ncu found over the tree's K3, and whether loading each token's run
# sums together (dev/mla_window_fold_runs_together.diff on top of the patch, D) removes it.
# dev/variants_ab.sh times A (tree), C (dev/mla_window_fold.patch) and D, tests D's MLA decode
# cases; then dev/source_profile.sh samples K3 of C and D and K1 of A and C at V2-Lite T=16.
#   bash dev/window_fold_profile_call.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT/prof"
cat dev/mla_window_fold.patch dev/mla_window_fold_runs_together.diff > /tmp/wfold_runs_together.patch
PATCHES="dev/mla_window_fold.patch /tmp/wfold_runs_together.patch" TEST_VARIANTS=D \
  TESTS_D='*MlaDecode*:*wfold*:*WindowFold*' \
  CASES="--preset deepseek-v2-lite-mla --tokens 1,2,8,16,64 --quiet;--preset deepseek-v2-lite-mla --stage first --tokens 1,64 --quiet" \
  timeout 300 bash dev/variants_ab.sh > "$OUT/ab.txt" 2>&1
echo "variants_ab rc=$? at ${SECONDS} s"
args="--preset deepseek-v2-lite-mla --tokens 16 --strategy cuda-mla-decode"
for job in "C stage_b" "D stage_b" "A stage_a" "C stage_a"; do
  set -- $job
  echo "==== $1 $2 (V2-Lite T=16)"
  OUT=$OUT/prof timeout 90 bash dev/source_profile.sh "${1}_$2" /tmp/variants/$1/bg/bench/latentkv-bench \
    "$args" "mla_decode_$2" 2>&1 | head -60
done > "$OUT/prof/profiles.txt"
echo "profiles done at ${SECONDS} s"
tar -czf "$OUT/prof.tgz" -C "$OUT" prof && rm -rf "$OUT/prof"
cat "$OUT/ab.txt" | tail -30
