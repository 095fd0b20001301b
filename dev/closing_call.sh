#!/usr/bin/env bash
# One closing device call for a shipped change: dev/variants_ab.sh on the tree (A: its GPU tests
# TESTS_A, compute-sanitizer on SANITIZE_A) and any PATCHES beside it (timed on CASES in the same
# call), then the Python package and python/bench/bench_mla.py's MLA_ROWS against transformers'
# code (eager, torch.compile; dev/bench_mla_call.sh). Each part is capped so the call ends inside
# the device's limit.
#   AB_S        seconds for the variants_ab part (default 300)
#   MLA_S       seconds for bench_mla.py (default 150)
#   MLA_ROWS    bench_mla.py --rows (default v2-lite:1,v2-lite:64)
#   run: TESTS_A='*Mla*' SANITIZE_A=... CASES="..." [PATCHES=...] bash dev/closing_call.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
start=$SECONDS
TEST_VARIANTS=A timeout "${AB_S:-300}" bash dev/variants_ab.sh
echo "variants_ab done at $((SECONDS - start)) s"
OUT=$OUT MLA_ROWS="${MLA_ROWS:-v2-lite:1,v2-lite:64}" MLA_S="${MLA_S:-150}" bash dev/bench_mla_call.sh
