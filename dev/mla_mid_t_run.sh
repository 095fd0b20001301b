#!/usr/bin/env bash
# Mid-T rows of the MLA path in one GPU call (run 2026-12-01 19:18 UTC on tree a2a103b, when
# V2-Lite T = 64 lost to torch.compile, 15.5 against 13.5 us; rows and ncu output in
# docs/data/h200_mla_mid_t_2026-12-01_1918.txt, read in docs/experiments.md). This times, on one
# machine, every way latentkv has to run mid-T rows:
#   cuda-mla-decode and cuda-mla-gemm forced (the working tree), and cuda-mla-wgmma (the tree
#   with dev/mla_stage_b_wgmma.patch applied: stage B as one CUTLASS wgmma GEMM whose epilogue
#   writes K with its k_pe columns and V),
# at V2-Lite T = 17, 32, 48, 64, 96, 128 and V3 T = 32, 64, 128 (whole path, no q_a), then reads
# the per-kernel durations of V2-Lite T = 64 under ncu with warm caches for the first two.
# The patch is rebased onto d4da217 (after cuda-mla-gemm's stage A in slices of D); where it no
# longer applies, its build fails and the script times decode and gemm only.
# Needs CUTLASS 4.2's headers as a tarball of include/ in $CUTLASS_TGZ (default
# .carry/cutlass42_include.tgz, carried). Run from the repository root on the GPU machine; logs
# go to $OUT, a short table is printed last.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
CUTLASS_TGZ=${CUTLASS_TGZ:-.carry/cutlass42_include.tgz}
G="-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DLATENTKV_BUILD_TESTS=OFF"
cmake -S . -B build-gpu $G > /dev/null && cmake --build build-gpu -j16 --target latentkv-bench \
  > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
rm -rf /tmp/wgmma /tmp/cutlass && mkdir -p /tmp/wgmma /tmp/cutlass
tar -xzf "$CUTLASS_TGZ" -C /tmp/cutlass
tar --exclude=./build-gpu --exclude=./.carry --exclude=./.git -cf - . | tar -x -C /tmp/wgmma
(cd /tmp/wgmma && patch -p1 -s < dev/mla_stage_b_wgmma.patch &&
 cmake -S . -B b $G -DLATENTKV_CUTLASS_DIR=/tmp/cutlass/include > /dev/null &&
 cmake --build b -j16 --target latentkv-bench) > "$OUT/build_wgmma.log" 2>&1
echo "wgmma build rc=$?"
A=build-gpu/bench/latentkv-bench
W=/tmp/wgmma/b/bench/latentkv-bench
rows() {  # rows <binary> <strategy> <label>
  "$1" --preset deepseek-v2-lite-mla --q-rank 0 --tokens 17,32,48,64,96,128 --strategy "$2" \
    --quiet 2>&1 | grep -E "^custom" | grep -v "MLA B" | sed "s/^/$3 v2-lite /"
  "$1" --preset deepseek-v3-mla --q-rank 0 --tokens 32,64,128 --strategy "$2" --quiet 2>&1 |
    grep -E "^custom" | grep -v "MLA B" | sed "s/^/$3 v3 /"
}
for round in 1 2; do
  rows $A cuda-mla-decode "r$round decode" >> "$OUT/rows.txt"
  rows $A cuda-mla-gemm "r$round gemm" >> "$OUT/rows.txt"
  [ -x $W ] && rows $W cuda-mla-wgmma "r$round wgmma" >> "$OUT/rows.txt"
done
for st in cuda-mla-decode cuda-mla-gemm; do
  timeout 90 ncu --clock-control none --cache-control none --print-summary per-kernel \
    --metrics gpu__time_duration.sum $A --preset deepseek-v2-lite-mla --q-rank 0 --tokens 64 \
    --strategy $st --iters 3 --warmup 2 --no-rotate --quiet 2>&1 |
    grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" > "$OUT/ncu_$st.txt"
done
echo
sort -k3,3 -k4,4 -k2,2 "$OUT/rows.txt" | cut -c1-120
for st in cuda-mla-decode cuda-mla-gemm; do echo "== $st"; cut -c1-140 "$OUT/ncu_$st.txt"; done
