#!/usr/bin/env bash
# One device call for the window fold (issues 15/16; docs/experiments.md, sessions 33-34): the
# Python package of the working tree with dev/mla_window_fold.patch builds in the background while
# dev/variants_ab.sh tests, sanitizes and times the tree (A), the patch (C) and the patch with the
# fold from one token (D, dev/mla_window_fold_from_one_token.diff on top; timed only); then ncu and nsys per kernel of A and C
# (dev/mla_decode_ab_profile.sh on the same builds) and bench_mla.py's V2-Lite rows against
# torch.compile on the patched package. Everything lands in $OUT; the A/B table prints last.
#   bash dev/window_fold_call.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT/prof"
PY=/tmp/pyC; rm -rf $PY && mkdir -p $PY
git ls-files -co --exclude-standard | while read -r f; do [ -e "$f" ] && echo "$f"; done |
  tar -cf - -T - | tar -xf - -C $PY
patch -d $PY -p1 -s < dev/mla_window_fold.patch || { echo "patch failed"; exit 1; }
(cd $PY && CMAKE_BUILD_PARALLEL_LEVEL=6 nice -n 19 python3 -m pip install -q --no-build-isolation --no-deps \
   -Cbuild-dir=/tmp/bpy . > "$OUT/prof/pip.log" 2>&1; echo "pip rc=$?" >> "$OUT/prof/pip.log") &
pip_pid=$!
cat dev/mla_window_fold.patch dev/mla_window_fold_from_one_token.diff > /tmp/wfold_from_one_token.patch
PATCHES="dev/mla_window_fold.patch /tmp/wfold_from_one_token.patch" TEST_VARIANTS=C TESTS_C='*Mla*' \
  SANITIZE_C='*wfold_T64*:*wfold_8_chunks_T40*:*wfold_rope2*:*WindowFold*:*wfold_T9*' \
  CASES="--preset deepseek-v2-lite-mla --tokens 1,2,8,16,17,32,48,64 --quiet;--preset deepseek-v2-lite-mla --stage first --tokens 1,16,64 --quiet;--preset deepseek-v3-mla --q-rank 0 --tokens 1,16 --quiet" \
  timeout 360 bash dev/variants_ab.sh > "$OUT/ab.txt" 2>&1
echo "variants_ab rc=$? at ${SECONDS} s"
OUT=$OUT/prof TREES=/tmp/variants TOKENS="16 64" timeout 100 bash dev/mla_decode_ab_profile.sh \
  > "$OUT/prof/profile.txt" 2>&1
echo "profile rc=$? at ${SECONDS} s"
wait $pip_pid; tail -3 "$OUT/prof/pip.log"
PYTHONUNBUFFERED=1 timeout 150 python3 python/bench/bench_mla.py --rows v2-lite:1,v2-lite:64 \
  --json "$OUT/prof/bench_mla.json" > "$OUT/prof/bench_mla.txt" 2>&1
echo "bench_mla rc=$? at ${SECONDS} s"
echo "---- profile"; cat "$OUT/prof/profile.txt"
echo "---- bench_mla (the window fold's package)"; tail -25 "$OUT/prof/bench_mla.txt"
tar -czf "$OUT/prof.tgz" -C "$OUT" prof && rm -rf "$OUT/prof"
echo "---- A/B"; cat "$OUT/ab.txt"
