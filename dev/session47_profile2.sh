#!/usr/bin/env bash
# Session 47's second profile: the stage-A epilogue's SASS with ncu's per-instruction counts and
# stall samples (dev/source_profile.sh: the source page's CSV in $OUT, its stalls a phase printed;
# V2-Lite and V3 kv T=1024), then every kernel of one cuda-mla-gemm call at V3 T=1024 (the bench's
# empty-kernel probe excluded). Builds latentkv-bench only. Run on 2026-12-08 (H100): the first
# part as meant (docs/data/h100_session48_epilogue_source_2026-12-08.txt); the second's -c 14 was
# used up by the bench's setup (fill kernels and the cuBLAS ceiling GEMMs) before the MLA call, so
# it needs a larger -c or a kernel filter past the ceilings before it reads that call.
#   run: bash dev/session47_profile2.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
start=$SECONDS
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
{ cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DLATENTKV_BUILD_TESTS=OFF && cmake --build build-gpu -j "$(nproc)" --target latentkv-bench; } \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "built at $((SECONDS - start)) s"
B=build-gpu/bench/latentkv-bench
for c in "v2:--preset deepseek-v2-lite-mla" "v3:--preset deepseek-v3-mla --q-rank 0"; do
  name=${c%%:*}; args=${c#*:}
  echo "== epilogue $name T=1024"
  timeout 120 bash dev/source_profile.sh "epilogue_$name" "$B" "$args --tokens 1024 --no-rotate" \
    mla_stage_a_epilogue 2>&1 | tail -40
done
timeout 90 ncu --clock-control none -k 'regex:^(?!.*empty_kernel)' -c 14 \
  --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
  $B --preset deepseek-v3-mla --q-rank 0 --tokens 1024 --iters 1 --warmup 0 --seconds 0.01 --no-rotate \
  > "$OUT/kernels_v3_1024.txt" 2>&1
grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__throughput|launch__grid_size" "$OUT/kernels_v3_1024.txt" \
  | sed 's/  */ /g' | cut -c1-110 | head -60
echo "done at $((SECONDS - start)) s"
