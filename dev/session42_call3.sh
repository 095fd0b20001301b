#!/usr/bin/env bash
# Session 42's third device call: K1 with a shared-memory carveout that holds K3's blocks beside it
# (C: the largest configuration, D: the smallest that holds them; E: D with the timeline), GPU tests
# on C and D, then the rows it should move and the ones it must not, then E's timeline.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
PATCHES="dev/mla_decode_k1_carveout_max.patch dev/mla_decode_k1_carveout_fit.patch dev/mla_decode_k1_carveout_fit_timeline.patch" \
TEST_VARIANTS=D TESTS_D="MlaDecode/*" VARIANTS_0=ACD VARIANTS_1=ACD VARIANTS_2=ACD \
CASES="--preset deepseek-v3-mla --q-rank 0 --tokens 1,16 --quiet;--preset kimi-k2-mla --q-rank 0 --tokens 1 --quiet;--preset deepseek-v2-lite-mla --tokens 1 --quiet" \
timeout 230 bash dev/variants_ab.sh
B=/tmp/variants/E/bg/bench/latentkv-bench
[ -x $B ] || exit 1
for args in "--preset deepseek-v3-mla --q-rank 0 --tokens 1,16"; do
  LATENTKV_TIMELINE=1 timeout 40 $B $args --json --quiet 2>/dev/null
done > "$OUT/timeline_raw.txt"
python3 dev/mla_timeline_table.py < "$OUT/timeline_raw.txt" | tee "$OUT/timeline_table.txt"
gzip -f "$OUT/timeline_raw.txt"
