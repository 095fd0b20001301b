#!/usr/bin/env bash
# Session 42's first device call (run as `bash dev/session42_call1.sh`): the tree's MLA GPU tests and
# V2-Lite rows (A), cuda-decode with fewer up stages (C, D: timed on the float32 presets by
# mistake, so not the patched bf16 kernel), cuda-fused's register tiles preferring the largest L1
# (E), then dev/carveout_probe.cu. Results: docs/data/h100_session42_2026-12-07.txt.
export PATH=/usr/local/cuda/bin:$PATH
(nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude dev/carveout_probe.cu -o /tmp/carveout_probe > /tmp/probe_build.log 2>&1; echo "probe build rc=$?") &
PATCHES="dev/decode_tc_up_stages_2.patch dev/decode_tc_up_stages_1.patch dev/fused_register_tiles_spread.patch" \
TEST_VARIANTS=ACDE TESTS_A="*Mla*" TESTS_C="*GpuDecode*" TESTS_D="*GpuDecode*" TESTS_E="*Fused*" \
VARIANTS_0=A VARIANTS_1=ACD VARIANTS_2=ACD VARIANTS_3=AE VARIANTS_4=AE \
CASES="--preset deepseek-v2-lite-mla --tokens 1,17,49,64 --quiet;--preset deepseek-v3 --tokens 1,16 --strategy cuda-decode --quiet;--preset deepseek-v2-lite --tokens 1 --strategy cuda-decode --quiet;--quiet;--tokens 1,64,733,6144 --quiet" \
timeout 470 bash dev/variants_ab.sh
wait
timeout 60 /tmp/carveout_probe 2>&1 | tee $OUT/carveout_probe.txt | tail -40
