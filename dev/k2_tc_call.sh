#!/usr/bin/env bash
# One device call (~5 minutes on 16 cores): the K2 and tensor-core changes that
# the device never ran (session 35), tested, sanitized and timed against the tree in the same call.
#   C = dev/mla_decode_k2_running_pointers.patch (K2's partials by running pointers, two trips)
#   D = dev/mla_decode_k2_one_trip_running_pointers.patch (the same, one trip of 8 chunks)
#   E = dev/fused_tc_two_blocks_swizzled.patch (cuda-fused's tensor-core configuration at two
#       blocks an SM; its region to T = 16 x SMs)
#   F = dev/mla_decode_k2_two_barriers.patch (D, and two of the row epilogue's four barriers out)
# E and F get the GPU tests of what they touch and compute-sanitizer memcheck and racecheck (F's
# tests cover D's code too).
#   run: bash dev/k2_tc_call.sh   (device tool, no carry)
set -uo pipefail
cd "$(dirname "$0")/.."
PATCHES="dev/mla_decode_k2_running_pointers.patch dev/mla_decode_k2_one_trip_running_pointers.patch dev/fused_tc_two_blocks_swizzled.patch dev/mla_decode_k2_two_barriers.patch" \
TEST_VARIANTS=EF TESTS_F="*Mla*" TESTS_E="GpuFused*" \
SANITIZE_F="MlaDecode/MlaGpuCase.MatchesReference/rows_*" SANITIZE_E="GpuFusedTensorCore.*" \
VARIANTS_0=ACDF VARIANTS_1=ACDF VARIANTS_2=AE VARIANTS_3=AF VARIANTS_4=AF \
CASES="--preset deepseek-v2-lite-mla --tokens 1,2,16,32,64 --quiet;--preset deepseek-v2-lite-mla --stage first --tokens 1,16,64 --quiet;--tokens 529,733,900,1056,1280,1536,2048 --quiet;--preset deepseek-v3-mla --tokens 1,16 --quiet;--preset deepseek-v3-mla --stage first --tokens 1,4 --quiet" \
  bash dev/variants_ab.sh
