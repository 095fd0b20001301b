#!/usr/bin/env bash
# Issue 17 (written 2026-12-04, session 21; not run): the wgmma configuration as a patch of the
# library (dev/fused_wgmma_configuration.patch, variant C) against the tree (A) in one device
# call through dev/variants_ab.sh: C's cuda-fused GPU tests (its GpuFusedWgmma.TileEdges among
# them), memcheck and racecheck on GpuFusedWgmma.*, then the founding widths forced to cuda-fused
# from T=529 (where the streaming grid passes two blocks per SM and the patch takes the call) to
# 16384, and the founding case. Run after dev/fused_wgmma_run.sh has shown the probe correct.
#   (run tool, no carry needed)
set -uo pipefail
cd "$(dirname "$0")/.."
PATCHES="dev/fused_wgmma_configuration.patch" \
TEST_VARIANTS=C TESTS_C='GpuFused*:*GpuShapes*:*GpuGraphs*:*Layouts*' \
SANITIZE_C='GpuFusedWgmma.*' \
CASES="--tokens 529,733,1024,2048 --strategy cuda-fused --quiet;\
--tokens 4096,6144,16384 --strategy cuda-fused --quiet;--preset seed --quiet" \
  bash dev/variants_ab.sh
