#!/usr/bin/env bash
# NOT RUN: the probe (dev/fused_wgmma_run.sh, 2026-12-05 01:47 UTC) measured these kernels no faster
# than cuda-fused at any T (experiments.md, session 22), so this A/B was not needed.
# Issue 17 (written 2026-12-04, session 21; not run): the wgmma configurations as a patch of the
# library (dev/fused_wgmma_configuration.patch, variant C) against the tree (A), through
# dev/variants_ab.sh, after dev/fused_wgmma_run.sh has shown the probe's kernels correct.
#   bash dev/fused_wgmma_ab.sh            one call: C's cuda-fused GPU tests (GpuFusedWgmma.* and
#       GpuFusedWgmmaCluster.* among them), then the founding widths forced to cuda-fused from one
#       token to 16384 and the founding case, two rounds; the table is last (~7 min).
#   bash dev/fused_wgmma_ab.sh sanitize   one call: C's GpuFusedWgmma* tests under memcheck and
#       racecheck (hazards counted in our kernels only).
#   (run tool, no carry needed)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = sanitize ]; then
  PATCHES="dev/fused_wgmma_configuration.patch" TEST_VARIANTS=C TESTS_C='GpuFusedWgmma*' \
  SANITIZE_C='GpuFusedWgmma*' CASES="" bash dev/variants_ab.sh
  exit
fi
PATCHES="dev/fused_wgmma_configuration.patch" TEST_VARIANTS=C TESTS_C='GpuFused*' \
CASES="--tokens 1,2,3,64 --strategy cuda-fused --quiet;--preset seed --quiet;\
--tokens 529,733,1024,2048 --strategy cuda-fused --quiet;\
--tokens 4096,6144,16384 --strategy cuda-fused --quiet" \
  bash dev/variants_ab.sh
