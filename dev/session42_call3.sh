#!/usr/bin/env bash
# Prepared in session 42 for the next device session (~300 s): K1 with a shared-memory carveout
# that holds K3's blocks beside it (C: the smallest configuration that holds them, in its shipping
# form; D: the largest), stage B alone reading its cache slots before the first kv_b wave (E), and
# C with the per-block timeline (F); GPU tests on C and E, then the rows each should move and the
# ones they must not, then F's timeline. A's tests cover the launches LaunchAttributes (ptx.h) builds, which no
# GPU had run when this was written: cuda-fused's, K2's cluster launch and K3's.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
PATCHES="dev/mla_decode_k1_carveout_fit.patch dev/mla_decode_k1_carveout_max.patch dev/mla_stage_b_slot_first.patch dev/mla_decode_k1_carveout_fit_timeline.patch" \
TEST_VARIANTS=ACE TESTS_A="*Fused*:*GpuGraphs*:Stages/*:Edges/*" TESTS_C="MlaDecode/*" TESTS_E="MlaDecode/*" \
VARIANTS_0=ACD VARIANTS_1=ACD VARIANTS_2=ACD VARIANTS_3=AE \
CASES="--preset deepseek-v3-mla --q-rank 0 --tokens 1,4,16 --quiet;--preset kimi-k2-mla --q-rank 0 --tokens 1,16 --quiet;--preset deepseek-v2-lite-mla --tokens 1,16 --quiet;--preset deepseek-v3-mla --q-rank 0 --stage second --tokens 1,16 --quiet" \
timeout 420 bash dev/variants_ab.sh
B=/tmp/variants/F/bg/bench/latentkv-bench
[ -x $B ] || exit 1
for args in "--preset deepseek-v3-mla --q-rank 0 --tokens 1,16" "--preset kimi-k2-mla --q-rank 0 --tokens 1"; do
  LATENTKV_TIMELINE=1 timeout 60 $B $args --json --quiet 2>/dev/null
done > "$OUT/timeline_raw.txt"
python3 dev/mla_timeline_table.py < "$OUT/timeline_raw.txt" | tee "$OUT/timeline_table.txt"
gzip -f "$OUT/timeline_raw.txt"
