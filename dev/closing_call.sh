#!/usr/bin/env bash
# One closing device call for a shipped kernel change: build, every GPU test, compute-sanitizer on
# the named tests, latentkv-bench's named rows, the Python package and bench_mla.py's named rows
# against transformers' code (eager, torch.compile), then the Python GPU tests as time allows.
#   SANITIZE_FILTER  gtest filter for memcheck and racecheck
#   CASES            ';'-separated latentkv-bench argument lists
#   MLA_ROWS         bench_mla.py --rows
#   PYTEST_K         pytest -k expression for the last stage (default: mla)
#   TOTAL_S          seconds the whole call may take (default 540): the last stage gets the rest
#   run: bash dev/closing_call.sh   (device tool, no carry); tables in $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
start=$SECONDS
CTEST=0 bash scripts/gpu_check.sh build test >"$OUT/check.txt" 2>&1
grep "^== " "$OUT/check.txt"; echo "build+tests done at $((SECONDS - start)) s"
SANITIZE_FILTER="$SANITIZE_FILTER" timeout 150 bash scripts/gpu_check.sh sanitize 2>&1 | grep "^== "
echo "sanitizers done at $((SECONDS - start)) s"
IFS=';' read -ra cases <<<"$CASES"
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  build-gpu/bench/latentkv-bench $c 2>&1 | tee -a "$OUT/bench.txt"
done
echo "bench rows done at $((SECONDS - start)) s"
python3 -m pip install -q --no-build-isolation --no-deps -Cbuild-dir=build-gpu-py . >"$OUT/pip.txt" 2>&1
echo "pip rc=$? at $((SECONDS - start)) s"
PYTHONUNBUFFERED=1 timeout 200 python3 python/bench/bench_mla.py --rows "$MLA_ROWS" \
  --json "$OUT/bench_mla.json" 2>&1 | tee "$OUT/bench_mla.txt" | tail -12
echo "bench_mla done at $((SECONDS - start)) s"
left=$((${TOTAL_S:-540} - (SECONDS - start)))
if [ $left -gt 30 ]; then
  LATENTKV_CASES=build-gpu/tests/common/latentkv-cases timeout $left \
    python3 -m pytest -q -x -k "${PYTEST_K:-mla}" python/tests >"$OUT/pytest.txt" 2>&1
  echo "pytest -k ${PYTEST_K:-mla} rc=$?: $(tail -1 "$OUT/pytest.txt")"
fi
