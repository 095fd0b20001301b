#!/usr/bin/env bash
# Issues 16 and 17 (written 2026-12-04, session 20; run 2026-12-05, session 23: the outcome is in
# docs/experiments.md, session 23): calls that place the kernels' time by leaving stages out
# (H200.md: without counters, time variants that leave one stage out and take differences),
# through dev/variants_ab.sh.
#   bash dev/stage_probes.sh        the few-token kernels. A the tree (ALL GPU tests; TEST_VARIANTS=
#       Z skips them); C dev/ka_probe_no_epilogue.patch, D dev/ka_probe_no_sync.patch (KA, V3 kv
#       first stage T=1, 2); E dev/rt_probe_loads.patch, F dev/rt_probe_no_up.patch (register
#       tiles: founding, T=3, T=64); G dev/ot_probe_loads.patch, H dev/ot_probe_no_up.patch
#       (one-token, T=1).
#   bash dev/stage_probes.sh warm   (written in session 23, not run) the load probes with inputs
#       rotated (weights from HBM) and with --no-rotate (one input set, warm in L2 and the TLBs),
#       line by line: C dev/rt_probe_loads.patch (founding, T=64), D dev/ot_probe_loads.patch
#       (T=1), E dev/tc_probe_loads.patch (T=733). Session 23 measured the loads at 2.6-4.1 us past
#       the launch, ~1 us more than session 7's broadcast probe needed for 96 KB; if the warm
#       rows drop to ~1-1.5 us, HBM latency (and page walks on fresh sets) is that cost, and no
#       reordering of the loads inside the kernel removes it. No GPU tests (TEST_VARIANTS=Z). (C's
#       loads are hidden and w_down only: ptxas moved its w_up loads into the never-taken branch.)
#   pdl, pins, tiles (written in sessions 24-25, run 2026-12-05 in session 26; outcome in
#       docs/experiments.md, session 26): the programmatic calls shipped for cuda-fused (not for
#       cuda-mla-decode's K1 or cuda-decode float32, where they lost), the float32 decode's up-tile
#       pin shipped, the register tiles' and one-token pins lost, the token tiles' three patches
#       shipped together. The lost pins stay in dev/ with their readings.
#   bash dev/stage_probes.sh tprobe (written in session 24, not run; its patches apply to 09513d1,
#       before the token tiles changed) where the token tiles' time goes: C dev/tt_probe_loads.patch, D dev/tt_probe_no_up.patch at T = 2048, 4096, 6144
#       rotated and 6144 warm: loads, down product, up product with the stores.
#   bash dev/stage_probes.sh wide   the tensor-core configuration's probes and one experiment. C
#       dev/tc_probe_loads.patch, D dev/tc_probe_no_up.patch (T=529, 733, 1024); E
#       dev/mla_fused_stage_a_no_barrier.patch (V3 first stage and whole path with q_a, with the
#       *Mla* tests and the sanitizers on the fused cases). Session 23's call also carried the
#       48-token tiles, since shipped.
# The probes write nothing, so their rows read "fail!"; only their times count. The bench prints
# an empty kernel's graph time per row (empty_kernel_graph_us in the JSON logs).
#   (run tool, no carry needed)
set -uo pipefail
cd "$(dirname "$0")/.."
# Each mode sets variants_ab.sh's variables; one call at the end runs them.
case "${1:-}" in
  warm)
    PATCHES="dev/rt_probe_loads.patch dev/ot_probe_loads.patch dev/tc_probe_loads.patch"
    TEST_VARIANTS=Z
    CASES="--preset seed --quiet;--preset seed --no-rotate --quiet;--tokens 64 --quiet;\
--tokens 64 --no-rotate --quiet;--tokens 1 --quiet;--tokens 1 --no-rotate --quiet;\
--tokens 733 --quiet;--tokens 733 --no-rotate --quiet"
    export VARIANTS_0=AC VARIANTS_1=AC VARIANTS_2=AC VARIANTS_3=AC VARIANTS_4=AD VARIANTS_5=AD \
      VARIANTS_6=AE VARIANTS_7=AE ;;
  tprobe)
    PATCHES="dev/tt_probe_loads.patch dev/tt_probe_no_up.patch"
    TEST_VARIANTS=Z
    CASES="--tokens 2048,4096,6144 --quiet;--tokens 6144 --no-rotate --quiet" ;;
  wide)
    PATCHES="dev/tc_probe_loads.patch dev/tc_probe_no_up.patch \
dev/mla_fused_stage_a_no_barrier.patch"
    TEST_VARIANTS=E
    export TESTS_E='*Mla*' SANITIZE_E='MlaDecode/*fused*'
    CASES="--tokens 529,733,1024 --quiet;\
--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1,2,4 --quiet;\
--preset deepseek-v3-mla --stage first --tokens 1,16 --quiet;\
--preset deepseek-v3-mla --tokens 1 --quiet"
    export VARIANTS_0=ACD VARIANTS_1=AE VARIANTS_2=AE VARIANTS_3=AE ;;
  *)
    PATCHES="dev/ka_probe_no_epilogue.patch dev/ka_probe_no_sync.patch dev/rt_probe_loads.patch \
dev/rt_probe_no_up.patch dev/ot_probe_loads.patch dev/ot_probe_no_up.patch"
    TEST_VARIANTS=${TEST_VARIANTS-A}
    export TESTS_A='*'
    CASES="--preset deepseek-v3-mla --q-rank 0 --stage first --tokens 1,2 --quiet;\
--preset seed --quiet;--tokens 3,64 --quiet;--tokens 1 --quiet"
    export VARIANTS_0=ACD VARIANTS_1=AEF VARIANTS_2=AEF VARIANTS_3=AGH ;;
esac
if [ -n "${PROBE:-}" ]; then  # a standalone probe first, its table into $OUT
  [ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
  out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"; name=$(basename "$PROBE" .cu)
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a "$PROBE" -o "/tmp/$name" &&
    "/tmp/$name" | tee "$out/$name.txt"
  echo "$name rc=$? at ${SECONDS} s"
fi
export PATCHES TEST_VARIANTS CASES
exec bash dev/variants_ab.sh
