#!/usr/bin/env bash
# Issues 16 and 17, for the next device session (written 2026-12-04, session 20; not run): one
# call that places the few-token kernels' time by leaving stages out (H200.md: without counters,
# time variants that leave one stage out and take differences). Variants (dev/variants_ab.sh):
#   A the tree; C dev/ka_probe_no_epilogue.patch, D dev/ka_probe_no_sync.patch (KA, V3 kv first
#   stage T=1); E dev/rt_probe_loads.patch, F dev/rt_probe_no_up.patch (register tiles: founding,
#   T=3, T=64); G dev/ot_probe_loads.patch, H dev/ot_probe_no_up.patch (one-token, T=1).
# The probes write nothing, so their rows read "fail!"; only their times count. The bench prints
# an empty kernel's graph time per row (empty_kernel_graph_us in the JSON logs). A runs ALL GPU
# tests: it GPU-validates session 20's host-side change (mla_decode.cu bind_tensors()).
#   bash dev/stage_probes.sh   (run tool, no carry needed)
set -uo pipefail
cd "$(dirname "$0")/.."
PATCHES="dev/ka_probe_no_epilogue.patch dev/ka_probe_no_sync.patch dev/rt_probe_loads.patch \
dev/rt_probe_no_up.patch dev/ot_probe_loads.patch dev/ot_probe_no_up.patch" \
TEST_VARIANTS=A TESTS_A='*' \
CASES="--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1,2 --quiet;--preset seed --quiet;\
--tokens 3,64 --quiet;--tokens 1 --quiet" \
VARIANTS_0=ACD VARIANTS_1=AEF VARIANTS_2=AEF VARIANTS_3=AGH \
  bash dev/variants_ab.sh
