#!/usr/bin/env bash
# Session 42's second device call: the bf16 decode kernel with fewer up-weight stages (D, E against
# A; the first call timed the float32 kernel by mistake), then cuda-mla-decode's per-block timeline
# (C = the tree with dev/mla_timeline.patch) on the whole path, each stage alone, V3 and V2-Lite.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
PATCHES="dev/mla_timeline.patch dev/decode_tc_up_stages_2.patch dev/decode_tc_up_stages_1.patch" \
TEST_VARIANTS=N VARIANTS_0=ADE VARIANTS_1=ADE VARIANTS_2=ADE VARIANTS_3=AC VARIANTS_4=AC \
CASES="--preset deepseek-v3 --dtype bfloat16 --tokens 1,16 --strategy cuda-decode --quiet;--preset deepseek-v2-lite --dtype bfloat16 --tokens 1 --strategy cuda-decode --quiet;--preset deepseek-v3 --dtype bfloat16 --tokens 1,128 --quiet;--preset deepseek-v3-mla --q-rank 0 --tokens 1,16 --quiet;--preset deepseek-v2-lite-mla --tokens 1,64 --quiet" \
timeout 330 bash dev/variants_ab.sh
B=/tmp/variants/C/bg/bench/latentkv-bench
[ -x $B ] || exit 1
for args in "--preset deepseek-v3-mla --q-rank 0 --tokens 1,16" \
            "--preset deepseek-v3-mla --q-rank 0 --stage second --tokens 1" \
            "--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1" \
            "--preset deepseek-v3-mla --stage first --tokens 1" \
            "--preset deepseek-v3-mla --tokens 1" \
            "--preset deepseek-v2-lite-mla --tokens 1,16,64" \
            "--preset deepseek-v2-lite-mla --stage second --tokens 1" \
            "--preset deepseek-v2-lite-mla --stage first --tokens 1"; do
  LATENTKV_TIMELINE=1 timeout 60 $B $args --json --quiet 2>/dev/null
done > "$OUT/timeline_raw.txt"
python3 dev/mla_timeline_table.py < "$OUT/timeline_raw.txt" | tee "$OUT/timeline_table.txt"
gzip -f "$OUT/timeline_raw.txt"
