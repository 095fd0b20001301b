#!/usr/bin/env bash
# Session 44's fourth call (~350 s on an H100): the shipped mma_step change read whole, and the
# ring's K-block branch.
#   A  the tree (every GPU test), C  dev/mla_ring_no_branch.patch (MlaDecode tests, memcheck and
#      racecheck on the ring's cases), timed on the rows the ring serves and two controls
# then latentkv-bench --sweep-mla-path on A, then the timeline build (dev/mla_timeline.patch: K1's
# staged, landed and mma stamps) on V2-Lite whole T=1 / 16, V2-Lite first T=16 and V3 kv T=1.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
TL=/tmp/tl_tree; rm -rf $TL; mkdir -p $TL
git ls-files -z | xargs -0 cp --parents -t $TL 2>/dev/null || cp -r . $TL
(cd $TL && patch -p1 -s < dev/mla_timeline.patch &&
 cmake -S . -B bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
   -DLATENTKV_BUILD_TESTS=OFF -DLATENTKV_BUILD_BENCH=ON >"$OUT/tl_build.log" 2>&1 &&
 nice cmake --build bg -j 4 --target latentkv-bench >>"$OUT/tl_build.log" 2>&1; echo "timeline build rc=$?") &
tl_pid=$!
PATCHES="dev/mla_ring_no_branch.patch" TEST_VARIANTS=AC TESTS_A="*" \
TESTS_C="MlaDecode/*:MlaDecodeGpu.*" SANITIZE_C="MlaDecode/*ring*" \
CASES="--preset deepseek-v3-mla --q-rank 0 --tokens 1,16;--preset deepseek-v3-mla --q-rank 0 --stage second --tokens 1;\
--preset kimi-k2-mla --q-rank 0 --tokens 1;--preset deepseek-v2-lite-mla --tokens 1" \
  timeout 330 bash dev/variants_ab.sh
wait $tl_pid
timeout 60 /tmp/variants/A/bg/bench/latentkv-bench --sweep-mla-path --quiet >"$OUT/sweep_mla_path.txt" 2>&1
echo "sweep rc=$? at $SECONDS s"
B=$TL/bg/bench/latentkv-bench
if [ -x $B ]; then
  for args in "--preset deepseek-v2-lite-mla --tokens 1,16" \
              "--preset deepseek-v2-lite-mla --stage first --tokens 16" \
              "--preset deepseek-v3-mla --q-rank 0 --tokens 1"; do
    LATENTKV_TIMELINE=1 timeout 30 $B $args --json --quiet 2>/dev/null
  done > "$OUT/timeline_raw.txt"
  python3 dev/mla_timeline_table.py < "$OUT/timeline_raw.txt" > "$OUT/timeline_table.txt"
  gzip -f "$OUT/timeline_raw.txt"
fi
echo "done at $SECONDS s"
tail -18 "$OUT/sweep_mla_path.txt"
cat "$OUT/timeline_table.txt" 2>/dev/null
