#!/usr/bin/env bash
# One call on a GPU machine: build, GPU tests, compute-sanitizer (memcheck + racecheck), the
# benchmark sweeps, an A/B against an earlier tree, the MLA path's sweep, the Python tests and the
# PyTorch benchmarks; a short table last. Logs go to $OUT/logs.tgz (the device tool brings back at
# most 8 files) and the tables are printed.
#   bash scripts/gpu_check.sh [stage ...]
# stages: build test sanitize bench ab mla python pybench (none given: all but ab)
#   SANITIZE_FILTER   gtest filter for compute-sanitizer (default: every GPU test)
#   SANITIZE_TOOLS    compute-sanitizer tools (default "memcheck racecheck"; initcheck finds
#                     reads of device memory nothing wrote, synccheck barriers some threads miss)
#   CTEST             0: the test stage runs the GPU test binary only, not ctest as well
#   BENCH_ARGS        latentkv-bench arguments of the bench stage (default: --sweep, then --sweep-mla)
#   AB_TAR            ab: a `git archive` of the earlier tree (e.g. .carry/base.tar); both trees'
#                     latentkv-bench run --sweep and --sweep-mla in alternating order,
#                     AB_ROUNDS times (default 2)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test sanitize bench mla python pybench)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
note() { summary+=("$1"); echo "== $1"; }
finish() {
  tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
  echo; echo "================ summary ================"
  printf '%s\n' "${summary[@]}"
}
trap finish EXIT
BUILD=build-gpu
JOBS=$(nproc)
gen=""; command -v ninja >/dev/null && gen="-G Ninja"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu \
  --format=csv | tee "$LOGS/device.txt"
date -u | tee -a "$LOGS/device.txt"

build_tree() {  # build_tree <source dir> <build dir> <log>
  cmake -S "$1" -B "$2" $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$3" 2>&1 && cmake --build "$2" -j "$JOBS" >>"$3" 2>&1
}

if want build || [ ! -x $BUILD/bench/latentkv-bench ]; then
  build_tree . $BUILD "$LOGS/build.log"
  rc=$?; note "build rc=$rc"; [ $rc -ne 0 ] && { tail -40 "$LOGS/build.log"; exit 1; }
  grep -iE "spill|local memory" "$LOGS/build.log" | sort | uniq -c | head -10
fi
TEST_GPU=$(find $BUILD -name latentkv_test_gpu -type f -perm -u+x | head -1)
BENCH=$BUILD/bench/latentkv-bench

if want test; then
  $TEST_GPU --gtest_brief=1 >"$LOGS/test_gpu.log" 2>&1; rc=$?
  note "gpu tests rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$LOGS/test_gpu.log" | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "^\[  FAILED|Failure|error" "$LOGS/test_gpu.log" | head -30
  if [ "${CTEST:-1}" != 0 ]; then
    ctest --test-dir $BUILD --output-on-failure -j 8 >"$LOGS/ctest.log" 2>&1; rc=$?
    note "ctest rc=$rc: $(grep -E 'tests passed|tests failed' "$LOGS/ctest.log")"
  fi
fi

if want sanitize; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    compute-sanitizer --tool $tool --error-exitcode 17 $TEST_GPU --gtest_brief=1 \
      --gtest_filter="${SANITIZE_FILTER:-*}" >"$LOGS/sanitize_$tool.log" 2>&1; rc=$?
    note "compute-sanitizer $tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitize_$tool.log" | head -1)"
    [ $rc -ne 0 ] && grep -m 3 -A 8 -E "^========= (Error|Invalid|Race|Warning)" "$LOGS/sanitize_$tool.log"
  done
fi

if want bench; then
  if [ -n "${BENCH_ARGS:-}" ]; then
    $BENCH $BENCH_ARGS --quiet >"$LOGS/bench.txt" 2>&1; note "bench rc=$?"
    cat "$LOGS/bench.txt"
  else
    for sweep in --sweep --sweep-mla; do
      $BENCH $sweep --quiet >"$LOGS/bench${sweep}.txt" 2>&1; note "bench $sweep rc=$?"
      $BENCH $sweep --quiet --json >"$OUT/bench${sweep}.json" 2>/dev/null
      cat "$LOGS/bench${sweep}.txt"
    done
  fi
fi

if want ab; then
  if [ -z "${AB_TAR:-}" ] || [ ! -f "$AB_TAR" ]; then
    note "ab: AB_TAR (a git archive of the earlier tree) not found"
  else
    rc=0
    if [ ! -x build-ab/bench/latentkv-bench ]; then
      rm -rf build-ab-src && mkdir -p build-ab-src && tar -xf "$AB_TAR" -C build-ab-src
      build_tree build-ab-src build-ab "$LOGS/build_ab.log"; rc=$?
    fi
    note "ab: earlier tree build rc=$rc"
    if [ $rc -eq 0 ]; then
      for round in $(seq 1 "${AB_ROUNDS:-2}"); do
        order=(new old); [ $round -eq 2 ] && order=(old new)
        for sweep in --sweep --sweep-mla; do
          for tree in "${order[@]}"; do
            bin=$BENCH; [ $tree = old ] && bin=build-ab/bench/latentkv-bench
            $bin $sweep --json >"$LOGS/ab_${tree}_r${round}${sweep}.json" 2>/dev/null
          done
        done
      done
      python3 - "$LOGS" <<'EOF' | tee "$LOGS/ab.txt"
import glob, json, os, re, sys
rows = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "ab_*.json"))):
    tree = re.match(r"ab_(new|old)_", os.path.basename(path)).group(1)
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        t = (r.get("fused") or {}).get("time_us") or {}
        if t.get("median"):
            key = f"{r['case']} {r['dtype']} [{r['strategy']}]"
            rows.setdefault(key, {}).setdefault(tree, []).append(t["median"])
print("A/B: fused GPU us per call (graph replay, median); old = AB_TAR's tree; two rounds each")
print(f"{'case':52s} {'old':>15s} {'new':>15s} {'new/old':>8s}")
for case, t in rows.items():
    old, new = t.get("old", []), t.get("new", [])
    if old and new:
        fmt = lambda xs: " ".join(f"{x:7.2f}" for x in xs)
        print(f"{case:52s} {fmt(old):>15s} {fmt(new):>15s} {min(new) / min(old):8.3f}")
EOF
    fi
  fi
fi

if want mla; then
  $BENCH --sweep-mla-path --quiet >"$LOGS/bench_mla_path.txt" 2>&1; note "bench --sweep-mla-path rc=$?"
  $BENCH --sweep-mla-path --quiet --json >"$OUT/bench_mla_path.json" 2>/dev/null
  cat "$LOGS/bench_mla_path.txt"
fi

if want python; then
  (python3 -m pip install -q --no-build-isolation --no-deps -Cbuild-dir=build-gpu-py . \
     >"$LOGS/pip.log" 2>&1 &&
   LATENTKV_CASES=$BUILD/tests/common/latentkv-cases \
     python3 -m pytest -q -rs python/tests >"$LOGS/pytest.log" 2>&1); rc=$?
  note "python tests rc=$rc: $(tail -1 "$LOGS/pytest.log" 2>/dev/null)"
  [ $rc -ne 0 ] && { tail -20 "$LOGS/pip.log"; grep -E "^FAILED|^ERROR" "$LOGS/pytest.log" | head -30; }
fi

if want pybench; then
  for b in python/bench/bench_torch.py python/bench/bench_mla.py; do
    [ -f "$b" ] || continue
    PYTHONUNBUFFERED=1 python3 "$b" >"$LOGS/$(basename "$b" .py).txt" 2>&1; rc=$?
    note "$b rc=$rc"
    tail -30 "$LOGS/$(basename "$b" .py).txt"
  done
fi
exit 0
