#!/usr/bin/env bash
# A readout of the tree (session 44; run by session 45 on an H200 in 212 s with SANITIZE=1): build, every GPU
# test (SANITIZE=1: then memcheck and racecheck on cuda-mla-decode's ring, whole-row and sliced K2
# cases, ~+100 s), while a second tree with dev/mla_timeline.patch (K3's staged and mma stamps) builds beside them; then
# latentkv-bench --sweep-mla-path (issue 15's and 16's rows) once, then the timeline build's
# per-block records on the rows whose K3 tail after its release is unexplained (V2-Lite T=1 / 16,
# Kimi K2 kv T=1, V3 kv T=1, V3 stage B alone T=1, V3 q_a + kv T=1 / 16, V2-Lite first T=16; the
# held K3's 'mma' stamp says where its ~2 us after staging go). Tables last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
start=$SECONDS
TL=/tmp/tl_tree; rm -rf $TL; mkdir -p $TL
git ls-files -z | xargs -0 cp --parents -t $TL 2>/dev/null || cp -r . $TL
(cd $TL && patch -p1 -s < dev/mla_timeline.patch &&
 cmake -S . -B bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
   -DLATENTKV_BUILD_TESTS=OFF -DLATENTKV_BUILD_BENCH=ON >"$OUT/tl_build.log" 2>&1 &&
 nice cmake --build bg -j 6 >>"$OUT/tl_build.log" 2>&1; echo "timeline build rc=$?") &
tl_pid=$!
CTEST=0 SANITIZE_FILTER="MlaDecode/*ring*:MlaDecode/*rows*:MlaDecode/*slices*" \
  timeout 260 bash scripts/gpu_check.sh build test ${SANITIZE:+sanitize} >"$OUT/check.txt" 2>&1
grep -E "^== " "$OUT/check.txt"; echo "checks done at $((SECONDS - start)) s"
wait $tl_pid
timeout 130 build-gpu/bench/latentkv-bench --sweep-mla-path --quiet >"$OUT/sweep_mla_path.txt" 2>&1
echo "sweep rc=$? at $((SECONDS - start)) s"
B=$TL/bg/bench/latentkv-bench
if [ -x $B ]; then
  for args in "--preset deepseek-v2-lite-mla --tokens 1,16" "--preset kimi-k2-mla --q-rank 0 --tokens 1" \
              "--preset deepseek-v3-mla --q-rank 0 --tokens 1" \
              "--preset deepseek-v3-mla --q-rank 0 --stage second --tokens 1" \
              "--preset deepseek-v3-mla --tokens 1,16" \
              "--preset deepseek-v2-lite-mla --stage first --tokens 16"; do
    LATENTKV_TIMELINE=1 timeout 40 $B $args --json --quiet 2>/dev/null
  done > "$OUT/timeline_raw.txt"
  python3 dev/mla_timeline_table.py < "$OUT/timeline_raw.txt" > "$OUT/timeline_table.txt"
  gzip -f "$OUT/timeline_raw.txt"
fi
echo "done at $((SECONDS - start)) s"
tail -45 "$OUT/sweep_mla_path.txt"
cat "$OUT/timeline_table.txt" 2>/dev/null
