#!/usr/bin/env bash
# One call on a GPU machine: build, GPU tests, compute-sanitizer (memcheck + racecheck), the
# benchmark sweep, the Python tests and the PyTorch benchmark; a short table last. Logs go to $OUT
# (the device tool brings that folder back) or ./gpu-out.
#   bash scripts/gpu_check.sh [stage ...]     stages: build test sanitize bench python pybench
# With no stages, all of them run. Extra latentkv-bench arguments: BENCH_ARGS="--preset seed".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test sanitize bench python pybench)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
note() { summary+=("$1"); echo "== $1"; }
BUILD=build-gpu
JOBS=$(nproc)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
  --format=csv | tee "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"

if want build || [ ! -x $BUILD/bench/latentkv-bench ]; then
  gen=""; command -v ninja >/dev/null && gen="-G Ninja"
  cmake -S . -B $BUILD $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$OUT/build.log" 2>&1 && cmake --build $BUILD -j "$JOBS" >>"$OUT/build.log" 2>&1
  rc=$?; note "build rc=$rc"; [ $rc -ne 0 ] && { tail -40 "$OUT/build.log"; exit 1; }
  grep -E "registers|spill" "$OUT/build.log" | sort | uniq -c | head -20
fi
TEST_GPU=$(find $BUILD -name latentkv_test_gpu -type f -perm -u+x | head -1)
BENCH=$BUILD/bench/latentkv-bench

if want test; then
  $TEST_GPU --gtest_brief=1 >"$OUT/test_gpu.log" 2>&1; rc=$?
  tail -5 "$OUT/test_gpu.log"; note "gpu tests rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/test_gpu.log" | tr '\n' ' ')"
  ctest --test-dir $BUILD --output-on-failure >"$OUT/ctest.log" 2>&1; rc=$?
  note "ctest rc=$rc: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
fi

if want sanitize; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 17 $TEST_GPU --gtest_brief=1 \
      --gtest_filter="${SANITIZE_FILTER:-*}" >"$OUT/sanitize_$tool.log" 2>&1; rc=$?
    note "compute-sanitizer $tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | head -1)"
    [ $rc -ne 0 ] && grep -m 3 -A 8 -E "^========= (Error|Invalid|Race|Warning)" "$OUT/sanitize_$tool.log"
  done
fi

if want bench; then
  $BENCH ${BENCH_ARGS:---sweep} >"$OUT/bench.txt" 2>"$OUT/bench.err"; rc=$?
  note "bench rc=$rc"
  $BENCH ${BENCH_ARGS:---sweep} --json >"$OUT/bench.json" 2>/dev/null
fi

if want python; then
  (python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/pip.log" 2>&1 &&
   python3 -m pytest -q python/tests >"$OUT/pytest.log" 2>&1); rc=$?
  note "python tests rc=$rc: $(tail -1 "$OUT/pytest.log" 2>/dev/null)"
  note "torch ops registered in: $(python3 -c 'import latentkv.torch as lt; print(lt.OPS_BACKEND)' 2>&1 | tail -1)"
fi

if want pybench; then
  PYTHONUNBUFFERED=1 python3 python/bench/bench_torch.py >"$OUT/pybench.txt" 2>&1; rc=$?
  note "python bench rc=$rc"
fi

echo; echo "================ summary ================"
cat "$OUT/device.txt"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/bench.txt" ] && want bench && tail -25 "$OUT/bench.txt"
[ -f "$OUT/pybench.txt" ] && want pybench && tail -20 "$OUT/pybench.txt"
exit 0
