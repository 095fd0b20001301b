#!/usr/bin/env bash
# Session 44's second call (~200 s on an H100): where the held K3's ~1.45 us between its staging
# and its first tile's MMAs go (V2-Lite whole T=1: staged 9.4, mma 10.9 us into the call, its 16
# kv_b loads issued at entry, ~5.6). Builds latentkv-bench with dev/mla_timeline.patch (its
# 'landed' stamp: thread 0's first and last kv_b registers consumed right after the staging), prints
# the per-block table on V2-Lite whole T=1 / 16, Kimi K2 kv T=1 and V3 kv T=1, and V2-Lite T=1 with
# --no-rotate (weights and code in L2); then ncu's PC sampling of K3 on V2-Lite T=1 (its first
# launch: caches cold) for the 'no instruction' share.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
TL=/tmp/tl_tree; rm -rf $TL; mkdir -p $TL
git ls-files -z | xargs -0 cp --parents -t $TL 2>/dev/null || cp -r . $TL
cp dev/mla_timeline.patch dev/mla_timeline_table.py dev/source_profile.sh dev/source_profile_table.py $TL/dev/
cd $TL && patch -p1 -s < dev/mla_timeline.patch || exit 1
cmake -S . -B bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLATENTKV_BUILD_TESTS=OFF -DLATENTKV_BUILD_BENCH=ON >"$OUT/tl_build.log" 2>&1 &&
  cmake --build bg -j 16 --target latentkv-bench >>"$OUT/tl_build.log" 2>&1 || { tail -20 "$OUT/tl_build.log"; exit 1; }
echo "built at $SECONDS s"
B=bg/bench/latentkv-bench
for args in "--preset deepseek-v2-lite-mla --tokens 1,16" "--preset kimi-k2-mla --q-rank 0 --tokens 1" \
            "--preset deepseek-v3-mla --q-rank 0 --tokens 1" \
            "--preset deepseek-v2-lite-mla --tokens 1 --no-rotate"; do
  LATENTKV_TIMELINE=1 timeout 40 $B $args --json --quiet 2>/dev/null
done > "$OUT/timeline2_raw.txt"
python3 dev/mla_timeline_table.py < "$OUT/timeline2_raw.txt" > "$OUT/timeline2_table.txt"
gzip -f "$OUT/timeline2_raw.txt"
echo "timelines at $SECONDS s"
timeout 150 bash dev/source_profile.sh k3_v2lite_t1 $B "--preset deepseek-v2-lite-mla --tokens 1" \
  "mla_decode_stage_b" > "$OUT/k3_profile.txt" 2>&1
echo "profile rc=$? at $SECONDS s"
head -60 "$OUT/k3_profile.txt"
cat "$OUT/timeline2_table.txt"
