#!/usr/bin/env bash
# The Python half of a device call: install the package (build dir build-gpu-py), then run
# python/bench/bench_mla.py against transformers' code (eager, torch.compile), capped in time.
# Used by dev/closing_call.sh and dev/readout_call.sh.
#   MLA_ROWS    bench_mla.py --rows (default: its own, every model and T)
#   MLA_S       seconds for bench_mla.py (default 170)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
start=$SECONDS
python3 -m pip install -q --no-build-isolation --no-deps -Cbuild-dir=build-gpu-py . >"$OUT/pip.txt" 2>&1
echo "pip rc=$? at $((SECONDS - start)) s"
rows=(); [ -n "${MLA_ROWS:-}" ] && rows=(--rows "$MLA_ROWS")
PYTHONUNBUFFERED=1 timeout "${MLA_S:-170}" python3 python/bench/bench_mla.py "${rows[@]}" \
  --json "$OUT/bench_mla.json" >"$OUT/bench_mla.txt" 2>&1
echo "bench_mla rc=$? at $((SECONDS - start)) s"; tail -14 "$OUT/bench_mla.txt"
