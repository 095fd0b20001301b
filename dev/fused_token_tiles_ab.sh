#!/usr/bin/env bash
# One device call for the next step of cuda-fused's token-tile configuration (issue 17): builds the
# working tree (A) and the tree with dev/fused_token_tiles_vectors_template.patch applied (B, or
# PATCH=<file>), runs B's cuda-fused GPU tests and compute-sanitizer memcheck on its token-tile
# test, then times cuda-fused forced on both trees over T (two rounds, alternating order) and
# prints one table, A / B per T. Logs in $OUT/logs.tgz (the device tool returns at most 8 files).
#   bash dev/fused_token_tiles_ab.sh            (on the GPU machine; ~4 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT0=${OUT:-$PWD/gpu-out}; OUT=$OUT0/l; mkdir -p "$OUT"
trap 'tar -czf "$OUT0/logs.tgz" -C "$OUT0" l && rm -rf "$OUT"' EXIT
PATCH=${PATCH:-dev/fused_token_tiles_vectors_template.patch}
TOKENS=${TOKENS:-384,529,733,1024,1057,2048,4096,6144,8449,16384}
rm -rf /tmp/tt_ab /tmp/tt_ab_b && mkdir -p /tmp/tt_ab
git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C /tmp/tt_ab
cp -r /tmp/tt_ab /tmp/tt_ab_b && patch -d /tmp/tt_ab_b -p1 -s < "$PATCH" || { echo "patch failed"; exit 1; }
build() {  # build <src> <tests ON/OFF> <log>
  cmake -S "$1" -B "$1/bg" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DLATENTKV_BUILD_TESTS=$2 -DLATENTKV_BUILD_BENCH=ON > "$3" 2>&1 && ninja -C "$1/bg" >> "$3" 2>&1
}
build /tmp/tt_ab OFF "$OUT/build_a.log" & pa=$!
build /tmp/tt_ab_b ON "$OUT/build_b.log"; rb=$?; wait $pa; ra=$?
echo "build A rc=$ra, B rc=$rb"; [ $ra -ne 0 ] || [ $rb -ne 0 ] && exit 1
T=$(find /tmp/tt_ab_b/bg -name latentkv_test_gpu -type f | head -1)
$T --gtest_brief=1 --gtest_filter='GpuFused*' > "$OUT/test_b.log" 2>&1
echo "B fused tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_b.log" | tr '\n' ' ')"
compute-sanitizer --tool memcheck --error-exitcode 17 "$T" --gtest_brief=1 \
  --gtest_filter='GpuFusedTokenTiles.*' > "$OUT/memcheck_b.log" 2>&1
echo "B memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_b.log" | head -1)"
for r in 1 2; do
  order="A B"; [ $r = 2 ] && order="B A"
  for v in $order; do
    dir=/tmp/tt_ab; [ $v = B ] && dir=/tmp/tt_ab_b
    "$dir/bg/bench/latentkv-bench" --tokens "$TOKENS" --strategy cuda-fused --quiet \
      > "$OUT/bench_${v}_$r.txt" 2>&1
  done
done
python3 - "$OUT" <<'PY'
import glob, os, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*_*.txt"))):
    v = os.path.basename(f).split("_")[1]
    for line in open(f):
        p = line.split()
        if len(p) >= 6 and p[0].startswith("T=") and p[1].startswith("cuda"):
            rows.setdefault(p[0], {}).setdefault(v, []).append(p[3])
print("cuda-fused forced, us per call (graph replay, inputs rotated), two rounds: A (tree) / B (patch)")
for k, v in rows.items():
    print(f"{k:8s} A {' '.join(v.get('A', [])):>12s}   B {' '.join(v.get('B', [])):>12s}")
PY
