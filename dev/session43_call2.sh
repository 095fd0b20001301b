#!/usr/bin/env bash
# Session 43's second call (~150 s): where the held K3's ~2 us between its staging and its exit go
# (V2-Lite whole T=1 and T=16, Kimi K2 kv T=1: all of kv_b in registers before the wait, yet the
# blocks exit ~2 us after their c is staged). Builds the tree with dev/mla_timeline.patch (the
# 'mma' stamp after the first tile's MMAs, the first warp's exit) and prints the per-block table.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
TL=/tmp/tl_tree; rm -rf $TL; mkdir -p $TL
git ls-files -z | xargs -0 cp --parents -t $TL 2>/dev/null || cp -r . $TL
cd $TL && patch -p1 -s < dev/mla_timeline.patch || exit 1
cmake -S . -B bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLATENTKV_BUILD_TESTS=OFF -DLATENTKV_BUILD_BENCH=ON >"$OUT/tl_build.log" 2>&1 &&
  cmake --build bg -j 16 --target latentkv-bench >>"$OUT/tl_build.log" 2>&1 || { tail -20 "$OUT/tl_build.log"; exit 1; }
echo "built at $SECONDS s"
for args in "--preset deepseek-v2-lite-mla --tokens 1,16" "--preset kimi-k2-mla --q-rank 0 --tokens 1"; do
  LATENTKV_TIMELINE=1 timeout 40 bg/bench/latentkv-bench $args --json --quiet 2>/dev/null
done > "$OUT/timeline2_raw.txt"
python3 dev/mla_timeline_table.py < "$OUT/timeline2_raw.txt" | tee "$OUT/timeline2_table.txt"
gzip -f "$OUT/timeline2_raw.txt"
