#!/usr/bin/env bash
# Same-machine A/B for kernel changes: builds the working tree (A) and the tree with each patch in
# $PATCHES applied (B, C, ...; patches against the working tree, kept in the ignored .carry/), and
# prints cuda-decode against cuda-gemm for each at the DeepSeek sizes. Run-to-run differences
# between GPU machines (~0.3-0.5 us here) are as large as the effects measured, hence one machine.
# TESTS=<gtest filter> also builds and runs the working tree's GPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
variants=(A)
rm -rf /tmp/ab && mkdir -p /tmp/ab
cp -r . /tmp/ab/A 2>/dev/null; rm -rf /tmp/ab/A/build-gpu
i=0
for patch in ${PATCHES:-}; do
  name=$(printf "\\x$(printf %x $((66 + i)))"); i=$((i + 1))
  cp -r /tmp/ab/A /tmp/ab/$name && (cd /tmp/ab/$name && patch -p1 -s < "$OLDPWD/$patch") || exit 1
  variants+=("$name")
done
for v in "${variants[@]}"; do
  tests=OFF; [ "$v" = A ] && [ -n "${TESTS:-}" ] && tests=ON
  (cd /tmp/ab/$v && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
     -DLATENTKV_BUILD_TESTS=$tests > "$OUT/build_$v.log" 2>&1 &&
   cmake --build build-gpu >> "$OUT/build_$v.log" 2>&1) || { echo "build $v failed"; tail -20 "$OUT/build_$v.log"; exit 1; }
done
# TESTS=<gtest filter>: the working tree's GPU tests, before the timings.
if [ -n "${TESTS:-}" ]; then
  t=$(find /tmp/ab/A/build-gpu -name latentkv_test_gpu -type f | head -1)
  timeout 240 "$t" --gtest_brief=1 --gtest_filter="$TESTS" > "$OUT/test_A.log" 2>&1
  echo "tests A rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_A.log" | tr '\n' ' ')"
  grep -m 10 -A 8 "Failure" "$OUT/test_A.log" | head -40
fi
# Two rounds, the second in reverse order: a run's position can matter by ~1 us (seen at V2-Lite
# T=1024 with identical code in A and B), so a difference that flips with the order is noise.
reversed=(); for ((j=${#variants[@]}-1; j>=0; j--)); do reversed+=("${variants[$j]}"); done
for round in 1 2; do
  order=("${variants[@]}"); [ $round = 2 ] && order=("${reversed[@]}")
  for v in "${order[@]}"; do
    for preset in deepseek-v2-lite deepseek-v3; do
      /tmp/ab/$v/build-gpu/bench/latentkv-bench --preset $preset --tokens ${TOKENS:-1,4,16} \
        --dtype ${DTYPE:-bfloat16} --strategy ${STRATEGY:-cuda-decode} 2>/dev/null |
        grep -E "^deepseek.* (PASS|FAIL)" | awk -v v=$v -v r=$round '{print v, r, $1, $2, $5}'
    done
  done
done | tee "$OUT/ab.txt"
