#!/usr/bin/env bash
# Per-kernel view of cuda-mla-decode's V2-Lite whole path with and without a change: ncu
# durations (kernels serialized, clocks not locked) and, where nsys is installed (the device had none
# in session 34), the nsys timeline of graph replays, for the
# working tree (A) and the working tree with PATCH applied (C). Output in $OUT; a summary on stdout.
# TREES=/tmp/variants reuses dev/variants_ab.sh's builds of A and C (no PATCH, no build here).
#   PATCH=dev/mla_window_fold.patch TOKENS="16 64" bash dev/mla_decode_ab_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
if [ -n "${TREES:-}" ]; then
  W=$TREES
else
  W=/tmp/wfprof; rm -rf $W && mkdir -p $W/A
  git ls-files -co --exclude-standard | while read -r f; do [ -e "$f" ] && echo "$f"; done |
    tar -cf - -T - | tar -xf - -C $W/A
  cp -r $W/A $W/C && patch -d $W/C -p1 -s < "$PATCH" || { echo "patch failed"; exit 1; }
  gen=""; command -v ninja >/dev/null && gen="-G Ninja"
  for v in A C; do
    (cmake -S $W/$v -B $W/$v/bg $gen -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES=90a \
       -DLATENTKV_BUILD_TESTS=OFF > "$OUT/build_$v.log" 2>&1 &&
     cmake --build $W/$v/bg -j 8 --target latentkv-bench >> "$OUT/build_$v.log" 2>&1
     echo "build $v rc=$?") &
  done
  wait
fi
for T in ${TOKENS:-16 64}; do
  for v in A C; do
    B=$W/$v/bg/bench/latentkv-bench
    ncu --clock-control none -k regex:mla_decode -c 6 --section SpeedOfLight --section LaunchStats \
      --section Occupancy $B --preset deepseek-v2-lite-mla --tokens $T --strategy cuda-mla-decode \
      --iters 2 --warmup 0 --seconds 0.01 > "$OUT/ncu_${v}_T$T.txt" 2>&1
    echo "== $v T=$T ncu"
    grep -E "^  mla_decode|Duration|Grid Size|Cluster Size|Achieved Occupancy|Registers Per" \
      "$OUT/ncu_${v}_T$T.txt" | sed 's/(latentkv::detail::[^)]*)//' | head -24
    if command -v nsys >/dev/null; then
      nsys profile --cuda-graph-trace=node -o "$W/t" -f true $B --preset deepseek-v2-lite-mla \
        --tokens $T --strategy cuda-mla-decode > /dev/null 2>&1
      echo "== $v T=$T nsys (start ns, duration ns, name) of the last graph replays"
      nsys stats --report cuda_gpu_trace --format csv "$W/t.nsys-rep" 2>/dev/null |
        grep -E "mla_decode" | tail -6 | cut -d, -f1-2,6-9 | sed 's/"//g' | cut -c1-150
      rm -f $W/t.nsys-rep $W/t.sqlite
    fi
  done
done
for round in 1 2; do
  for v in A C; do
    echo "== $v round $round: latentkv-bench (us per call, graph replay)"
    $W/$v/bg/bench/latentkv-bench --preset deepseek-v2-lite-mla \
      --tokens "${BENCH_TOKENS:-2,8,16,32,64}" --strategy cuda-mla-decode --quiet 2>&1 |
      grep -E "deepseek" | cut -c1-110
  done
done
