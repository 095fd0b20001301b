#!/usr/bin/env bash
# Session 44's fourth call (~300 s on an H100): the shipped mma_step change read whole, and the
# ring's K-block branch.
#   A  the tree (every GPU test), C  dev/mla_ring_no_branch.patch (MlaDecode tests, memcheck and
#      racecheck on the ring's cases), timed on the rows the ring serves and two controls
# then latentkv-bench --sweep-mla-path on A. (K1's timeline stamps, dev/mla_timeline.patch, were
# left out for device time: V2-Lite whole T=1 / 16, first T=16 and V3 kv T=1 are the rows to read.)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; export OUT
PATCHES="dev/mla_ring_no_branch.patch" TEST_VARIANTS=AC TESTS_A="*" \
TESTS_C="MlaDecode/*:MlaDecodeGpu.*" SANITIZE_C="MlaDecode/*ring*bfloat16*" \
CASES="--preset deepseek-v3-mla --q-rank 0 --tokens 1,16;--preset deepseek-v3-mla --q-rank 0 --stage second --tokens 1;\
--preset kimi-k2-mla --q-rank 0 --tokens 1;--preset deepseek-v2-lite-mla --tokens 1" \
  timeout 330 bash dev/variants_ab.sh
timeout 60 /tmp/variants/A/bg/bench/latentkv-bench --sweep-mla-path --quiet >"$OUT/sweep_mla_path.txt" 2>&1
echo "sweep rc=$? at $SECONDS s"
echo "done at $SECONDS s"
tail -18 "$OUT/sweep_mla_path.txt"
