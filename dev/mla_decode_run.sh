#!/usr/bin/env bash
# One device call for cuda-mla-decode (mla_decode.cu): build the GPU tests and the benchmark, the
# decode tests (every T edge), compute-sanitizer memcheck + racecheck on a few of them, then
# cuda-mla-decode against cuda-mla-gemm at T = 1, 16, 32, 64 (whole path, first stage, second
# stage) for V3 (no q_a), V3 q_a + kv and V2-Lite, and a per-kernel timeline (nsys) or ncu reading
# of V3 T = 1; step ab times cuda-mla-decode against a second build with AB_FLAGS (the variant a
# -D selects) in alternating rounds. Logs in $OUT; a short summary on stdout. STEPS picks steps
# (default: all but ab).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STEPS=${STEPS:-"build test bench sanitize profile"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
start=$(date +%s)
t() { echo "[$(( $(date +%s) - start )) s] $*"; }
B=b
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
date -u
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
if want build; then
  cmake -S . -B $B $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    > "$OUT/build.log" 2>&1 &&
    cmake --build $B -j "$(nproc)" --target latentkv_test_gpu latentkv-bench >> "$OUT/build.log" 2>&1
  rc=$?; t "build rc=$rc"; grep -iE "spill|local memory" "$OUT/build.log" | sort -u | head -5
  [ $rc -ne 0 ] && { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
fi
if want ab; then  # a second build with extra CUDA flags (AB_FLAGS: -D of a variant under test)
  cmake -S . -B b2 $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    "-DCMAKE_CUDA_FLAGS=${AB_FLAGS:?ab needs AB_FLAGS}" > "$OUT/build_ab.log" 2>&1 &&
    cmake --build b2 -j 8 --target latentkv-bench >> "$OUT/build_ab.log" 2>&1 &
  ab_pid=$!
fi
TEST=$(find $B -name latentkv_test_gpu -type f -perm -u+x | head -1)
BENCH=$B/bench/latentkv-bench
if want test; then
  # Eight shards at once: the float64 references on the CPU are most of the time.
  shards=8; pids=()
  for i in $(seq 0 $((shards - 1))); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 100 "$TEST" --gtest_brief=1 \
      --gtest_filter="${TEST_FILTER:-*MlaDecode*:MlaGpu.*}" > "$OUT/tests_$i.log" 2>&1 &
    pids+=($!)
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  cat "$OUT"/tests_*.log > "$OUT/tests.log"; rm -f "$OUT"/tests_*.log
  t "tests rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/tests.log" | awk '{n[$2]+=$3} END {for (k in n) printf "%s %d  ", k, n[k]}')"
  grep -E "^\[  FAILED" "$OUT/tests.log" | head -12
  [ $rc -ne 0 ] && grep -m 6 -B2 -A8 "Failure" "$OUT/tests.log" | head -60
fi
rows() { grep -E "cuda-mla-(decode|gemm)" | grep -vE "^\s|skipped" ; }
if want bench; then
  {
    for strategy in cuda-mla-decode cuda-mla-gemm; do
      q="--iters 60 --seconds 0.4 --quiet --strategy $strategy"
      $BENCH --preset deepseek-v3-mla --q-rank 0 --tokens 1,16,32,64 $q
      $BENCH --preset deepseek-v2-lite-mla --tokens 1,16,32,64 $q
      $BENCH --preset deepseek-v3-mla --tokens 1,64 $q
      $BENCH --preset deepseek-v3-mla --q-rank 0 --tokens 1,16,64 --stage first $q
      $BENCH --preset deepseek-v3-mla --tokens 1,16 --stage first $q
      $BENCH --preset deepseek-v2-lite-mla --tokens 1,16,64 --stage first $q
      $BENCH --preset deepseek-v3-mla --q-rank 0 --tokens 1,16,32,64 --stage second $q
      $BENCH --preset deepseek-v2-lite-mla --tokens 16,32,64 --stage second $q
    done
  } > "$OUT/bench.txt" 2>&1
  t "bench rc=$?"
  rows < "$OUT/bench.txt" | awk '{print $1, $2, $3, $5, $6}'
fi
if want ab; then
  wait $ab_pid; t "ab build rc=$?"
  for round in 1 2; do
    for bin in $BENCH b2/bench/latentkv-bench; do
      q="--iters 60 --seconds 0.4 --quiet --strategy cuda-mla-decode"
      for args in "--preset deepseek-v3-mla --q-rank 0 --tokens 1,16,64" \
                  "--preset deepseek-v2-lite-mla --tokens 1,16,64" "--preset deepseek-v3-mla --tokens 1"; do
        $bin $args $q 2>&1 | rows | awk -v b="${bin%%/*}" '{print b, $1, $2, $5}'
      done
    done
  done > "$OUT/ab.txt"
  t "ab (build, case, us):"; sort -k2,3 -s "$OUT/ab.txt" | tr '\n' ';'; echo
fi
if want sanitize; then
  f="${SANITIZE_FILTER:-*MlaDecode*dec_tiles_T17*bfloat16_both*paged*:*MlaDecode*dec_tiles_T64*float16_both*dense*:*MlaDecode*dec_tiles_T48*bfloat16_second*paged*:*MlaDecode*dec_16_rope2*float16_both*:*MlaDecode*dec_one_token_B1*bfloat16_second*:*MlaDecode*deepseek_v2_lite_mla_T64*:*MlaDecode*dec_wide_T17*bfloat16_second*}"
  for tool in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 17 "$TEST" --gtest_brief=0 \
      --gtest_filter="$f" > "$OUT/sanitize_$tool.log" 2>&1 &
  done
  wait
  for tool in memcheck racecheck; do
    l="$OUT/sanitize_$tool.log"
    t "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$l" | head -1); $(grep -cE '^\[       OK' "$l") ok, $(grep -cE '^\[  FAILED  \] [A-Z]' "$l") failed"
    grep -m 2 -A 6 -E "^========= (Error|Invalid|Race)" "$l"
  done
fi
if want profile; then
  if command -v nsys >/dev/null; then
    timeout 45 nsys profile --cuda-graph-trace=node -o "$OUT/t" -f true \
      $BENCH --preset deepseek-v3-mla --q-rank 0 --tokens 1 --strategy cuda-mla-decode \
      --iters 20 --seconds 0.2 --quiet > /dev/null 2>&1
    nsys stats --report cuda_gpu_trace --format csv "$OUT/t.nsys-rep" 2>/dev/null |
      grep -E "mla_decode_stage" | tail -6 | cut -d, -f1-2 | sed 's/"//g' > "$OUT/timeline.txt"
    rm -f "$OUT"/t.nsys-rep "$OUT"/t.sqlite
    t "nsys (start ns, duration ns of the last graph's kernels):"; cat "$OUT/timeline.txt"
  fi
  timeout 40 ncu --clock-control none -k regex:mla_decode_stage -c 3 --section SpeedOfLight \
    --section Occupancy $BENCH --preset deepseek-v3-mla --q-rank 0 --tokens 1 \
    --strategy cuda-mla-decode --iters 2 --warmup 0 --quiet > "$OUT/ncu.txt" 2>&1
  t "ncu rc=$?"
  grep -E "mla_decode_stage|Duration|DRAM Throughput|Achieved Occupancy|Registers Per" \
    "$OUT/ncu.txt" | sed 's/  */ /g' | head -20
fi
t done
