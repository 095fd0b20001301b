#!/usr/bin/env bash
# Session 47: where cuda-mla-gemm's prefill rows spend their time on today's tree. ncu (kernels
# serialized, clocks not locked) over one call of each row: every kernel's duration, SM and DRAM
# throughput, grid and registers (the unfused baseline's kernels included: the table names them),
# then the stage-A epilogue's warp states and memory workload alone. With H200=1 (or on an H200)
# it first runs dev/readout_call.sh (build, GPU tests, --sweep-mla-path, bench_mla.py).
#   run: bash dev/session47_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
start=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "device: $gpu"
if [[ "$gpu" == *H200* || -n "${H200:-}" ]]; then
  MLA_S=110 timeout 330 bash dev/readout_call.sh 2>&1 | tail -25
else
  gen=""; command -v ninja >/dev/null && gen="-G Ninja"
  { cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DLATENTKV_BUILD_TESTS=OFF && cmake --build build-gpu -j "$(nproc)" --target latentkv-bench; } \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
echo "built at $((SECONDS - start)) s"
B=build-gpu/bench/latentkv-bench
metrics=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum
cases=("v2_1024:--preset deepseek-v2-lite-mla --tokens 1024"
       "v2_4096:--preset deepseek-v2-lite-mla --tokens 4096"
       "v3_64:--preset deepseek-v3-mla --q-rank 0 --tokens 64"
       "v3_1024:--preset deepseek-v3-mla --q-rank 0 --tokens 1024"
       "v3_4096:--preset deepseek-v3-mla --q-rank 0 --tokens 4096")
for c in "${cases[@]}"; do
  name=${c%%:*}; args=${c#*:}
  timeout 60 ncu --clock-control none --csv --metrics $metrics -c 40 \
    $B $args --iters 1 --warmup 0 --seconds 0.01 --no-rotate > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
  echo "== $name ($args): kernel | us | SM% | DRAM% | grid | regs | warps% | MB read | MB written"
  python3 - "$OUT/ncu_$name.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = collections.OrderedDict()
for r in rows:
    e = k.setdefault(r[ix["ID"]], {"name": r[ix["Kernel Name"]]})
    e[r[ix["Metric Name"]]] = r[ix["Metric Value"]].replace(",", "")
f = lambda e, m, s=1: f"{float(e.get(m, 'nan')) / s:.1f}"
for i, e in k.items():
    print(f"{i:>3} {e['name'][:48]:48s} {f(e,'gpu__time_duration.sum',1000):>7} {f(e,'sm__throughput.avg.pct_of_peak_sustained_elapsed'):>5} "
          f"{f(e,'dram__throughput.avg.pct_of_peak_sustained_elapsed'):>5} {e.get('launch__grid_size','')[:8]:>8} {e.get('launch__registers_per_thread',''):>4} "
          f"{f(e,'sm__warps_active.avg.pct_of_peak_sustained_active'):>5} {f(e,'dram__bytes_read.sum',1e6):>7} {f(e,'dram__bytes_write.sum',1e6):>7}")
PY
done
echo "per-kernel tables at $((SECONDS - start)) s"
for name in v2_1024 v3_1024 v3_4096; do
  args=$(printf '%s\n' "${cases[@]}" | grep "^$name:" | cut -d: -f2-)
  timeout 60 ncu --clock-control none -k regex:mla_stage_a_epilogue -c 1 --section SpeedOfLight \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section InstructionStats \
    $B $args --iters 1 --warmup 0 --seconds 0.01 --no-rotate > "$OUT/ncu_epilogue_$name.txt" 2>&1
  echo "== epilogue $name"
  grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Executed Instructions  |Warp Cycles Per Issued|Block Limit|stall|Registers Per" \
    "$OUT/ncu_epilogue_$name.txt" | sed 's/  */ /g' | head -30
done
echo "done at $((SECONDS - start)) s"
