#!/usr/bin/env bash
# One device call for a same-machine A/B of whole trees: builds the working tree (A, with its GPU
# tests), the tree of AB_TAR (a `git archive` of an earlier commit, as B) and the working tree with
# each entry of PATCHES applied (C, D, ...; an entry a.patch+b.patch applies b on top of a), runs
# the GPU tests (TESTS, a gtest filter) and compute-sanitizer memcheck and racecheck on SANITIZE
# (a filter; racecheck hazards are counted in our kernels only, cuBLAS's nvjet_* report their own)
# of A, or of each variant in TEST_VARIANTS
# (letters; TESTS_<letter> and SANITIZE_<letter> override the filters per variant; a letter no
# variant has, as TEST_VARIANTS=N, builds no tests: timing only), then every
# bench line of CASES (';' separated latentkv-bench arguments; VARIANTS_<n>=letters limits line n
# to some variants) on each variant, two rounds in alternating order, and prints one table: fused us per variant and the
# baseline's, each row led by its CASES line number (B2B=1: also the back-to-back times, against an
# empty kernel launched the same way). Logs in $OUT/logs.tgz (the device tool brings back at most 8 files).
# Killed by a timeout (TERM), it still prints the rows timed so far and packs the logs.
#   AB_TAR=.carry/base.tar PATCHES=".carry/x.patch" CASES="--preset seed --tokens 1,64" \
#     bash dev/variants_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT0=${OUT:-$PWD/gpu-out}; L=$OUT0/l; mkdir -p "$L"
# On any exit (the end, or a timeout's TERM) the table of the rows timed so far, then the logs.
finish() {
  print_table
  tar -czf "$OUT0/logs.tgz" -C "$OUT0" l && rm -rf "$L"
}
print_table() {
python3 - "$L" <<'PY'
import glob, json, os, re, sys
rows, loops = {}, {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    i, v, r = re.match(r"bench_(\d+)_([A-Z])_(\d)", os.path.basename(path)).groups()
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        x = json.loads(line)
        t = ((x.get("fused") or {}).get("time_us") or {}).get("median")
        b = ((x.get("unfused") or {}).get("time_us") or {}).get("median")
        ok = "" if x.get("result") in ("pass", "passed", "ok") else f" {x.get('result')}!"
        stage = (x.get("shape") or {}).get("stage", "")
        key = (int(i), f"{x.get('case')} {stage} [{x.get('strategy')}]{ok}")
        e = rows.setdefault(key, {})
        e.setdefault(v, []).append(t)
        if b: e.setdefault("base", []).append(b)
        loop = ((x.get("fused") or {}).get("back_to_back_us") or {}).get("median")
        empty = x.get("empty_kernel_back_to_back_us")
        if loop:
            e2 = loops.setdefault(key, {})
            e2.setdefault(v, []).append(loop)
            if empty: e2.setdefault("base", []).append(empty)
f = lambda xs: " ".join(f"{x:6.2f}" for x in xs if x) if xs else "-"
def table(title, rows, base):
    print(title)
    vs = sorted({v for e in rows.values() for v in e if v != "base"})
    print(f"{'case':58s} " + " ".join(f"{v:>13s}" for v in vs) + f" {base:>13s}")
    for key in sorted(rows):
        e = rows[key]
        print(f"{f'{key[0]}: {key[1]}'[:58]:58s} " + " ".join(f"{f(e.get(v)):>13s}" for v in vs) + f" {f(e.get('base', [])[:2]):>13s}")
if os.environ.get("B2B"):
    table("us per call back to back from C++ (median); empty = an empty kernel launched the same way", loops, "empty")
table("us per call (graph replay, inputs rotated unless --no-rotate, median), two rounds per variant; base = the bench's baseline", rows, "base")
PY
}
trap finish EXIT
trap 'exit 143' TERM INT
W=/tmp/variants; rm -rf $W && mkdir -p $W/A
# (only the listed files that exist: the device's git index can name files removed since)
git ls-files -co --exclude-standard | while read -r f; do [ -e "$f" ] && echo "$f"; done |
  tar -cf - -T - | tar -xf - -C $W/A
variants=(A)
if [ -n "${AB_TAR:-}" ]; then mkdir -p $W/B && tar -xf "$AB_TAR" -C $W/B && variants+=(B); fi
n=0
for stack in ${PATCHES:-}; do  # an entry a+b+c: those patches applied in turn
  v=$(printf "\\x$(printf %x $((67 + n)))"); n=$((n + 1))
  cp -r $W/A $W/$v || exit 1
  IFS=+ read -ra parts <<< "$stack"
  for patch in "${parts[@]}"; do
    patch -d $W/$v -p1 -s < "$patch" || { echo "patch $patch failed"; exit 1; }
  done
  variants+=("$v")
done
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
pids=()
for v in "${variants[@]}"; do
  tests=OFF; [[ "${TEST_VARIANTS:-A}" == *$v* ]] && tests=ON
  (cmake -S $W/$v -B $W/$v/bg $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
     -DLATENTKV_BUILD_TESTS=$tests -DLATENTKV_BUILD_BENCH=ON > "$L/build_$v.log" 2>&1 &&
   cmake --build $W/$v/bg -j 8 >> "$L/build_$v.log" 2>&1; echo "build $v rc=$?") &
  pids+=($!)
done
wait "${pids[@]}"
echo "builds done at ${SECONDS} s"
for v in "${variants[@]}"; do [ -x $W/$v/bg/bench/latentkv-bench ] || { tail -30 "$L/build_$v.log"; exit 1; }; done
grep -ihE "spill|bytes stack frame" "$L"/build_*.log | grep -v " 0 bytes spill" | sort | uniq -c | head
for v in $(echo "${TEST_VARIANTS:-A}" | grep -o .); do
  [ -d $W/$v/bg ] || continue  # a letter no variant has (TEST_VARIANTS=N): timing only
  T=$(find $W/$v/bg -name latentkv_test_gpu -type f | head -1)
  TESTS_V=$(eval echo "\"\${TESTS_$v:-${TESTS:-}}\""); SANITIZE_V=$(eval echo "\"\${SANITIZE_$v:-${SANITIZE:-}}\"")
  if [ -n "$TESTS_V" ]; then
    timeout 300 $T --gtest_brief=1 --gtest_filter="$TESTS_V" > "$L/test_$v.log" 2>&1
    echo "$v tests ($TESTS_V) rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$L/test_$v.log" | tr '\n' ' ')"
    grep -m 10 -B 2 -A 8 "Failure" "$L/test_$v.log" | head -50
  fi
  if [ -n "$SANITIZE_V" ]; then
    for tool in memcheck racecheck; do
      timeout 240 compute-sanitizer --tool $tool $T --gtest_brief=1 --gtest_filter="$SANITIZE_V" \
        > "$L/${tool}_$v.log" 2>&1
      echo "$v $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/${tool}_$v.log" | head -1);" \
        "hazard lines outside nvjet: $(grep -E '^========= .*(hazard|Error)' -A 3 "$L/${tool}_$v.log" | grep -E 'in [a-z_]+' | grep -vc nvjet)"
    done
  fi
done
echo "tests and sanitizers done at ${SECONDS} s"
IFS=';' read -ra lines <<< "${CASES:-}"
for round in 1 2; do
  order=("${variants[@]}")
  if [ $round = 2 ]; then order=(); for ((j=${#variants[@]}-1; j>=0; j--)); do order+=("${variants[$j]}"); done; fi
  for i in "${!lines[@]}"; do
    allowed=$(eval echo "\${VARIANTS_$i:-}")
    for v in "${order[@]}"; do
      [ -n "$allowed" ] && [[ "$allowed" != *$v* ]] && continue
      $W/$v/bg/bench/latentkv-bench ${lines[$i]} --json > "$L/bench_${i}_${v}_$round.json" 2> "$L/bench_${i}_${v}_$round.err"
    done
  done
done
echo "bench rows done at ${SECONDS} s"
