#!/usr/bin/env bash
# Fuzzes what Tally reads from outside: the job spec parser and validator, a
# pushed tensor chunk, a checkpoint file, a .safetensors file, a .npy
# header, a CSV table, an image (PNG, JPEG), a vocabulary and the text it
# tokenizes, and the directory trees a dataset's paths may name (links,
# loops, FIFOs, huge sparse files). Builds the
# libFuzzer harnesses (tests/fuzz) with clang, AddressSanitizer and UBSan in
# build-fuzz/, then runs each for SECONDS (default 600) from its committed
# seed corpus (tests/fuzz/corpus/NAME; new inputs go to build-fuzz/corpus/NAME),
# and prints one line per harness: executions, executions per second, corpus
# size, and whether it crashed (the crashing input is kept in build-fuzz/).
#   bench/fuzz.sh [SECONDS] [HARNESS ...]     HARNESS: job_spec tensor_chunk
#                                             checkpoint safetensors npy csv image text
#                                             data_paths
#   bench/fuzz.sh --build-only
#   bench/fuzz.sh --no-build SECONDS HARNESS   (ctest's fuzz_* tests)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=600
build_only=0
no_build=0
harnesses=()
for a in "$@"; do
  case $a in
    --build-only) build_only=1 ;;
    --no-build) no_build=1 ;;
    [0-9]*) seconds=$a ;;
    *) harnesses+=("$a") ;;
  esac
done
((${#harnesses[@]})) || harnesses=(job_spec tensor_chunk checkpoint safetensors npy csv image text data_paths)
B=build-fuzz
if ((!no_build)) && [[ ! -f $B/build.ninja ]]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DTALLY_FUZZ=ON -DTALLY_CUDA=OFF -DTALLY_BUILD_TESTS=OFF > /dev/null
fi
targets=()
for h in "${harnesses[@]}"; do targets+=("${h}_fuzz"); done
if ((!no_build)); then
  ninja -C "$B" "${targets[@]}" > "$B/build.log" 2>&1 || { tail -n 30 "$B/build.log" >&2; exit 1; }
fi
((build_only)) && exit 0

status=0
# What a harness must never touch: data_paths builds trees of links to "..",
# /etc/passwd and /dev/zero, and must write beneath its own scratch root
# only (its names, written through a link to "..", would land in /tmp).
outside() {
  sha256sum /etc/passwd
  for n in d t.csv l e v.txt; do [[ -e /tmp/$n || -L /tmp/$n ]] && echo "/tmp/$n"; done
  return 0
}
printf '%-13s %12s %10s %8s  %s\n' harness executions "exec/s" corpus result
for h in "${harnesses[@]}"; do
  corpus=$B/corpus/$h
  rm -rf "$B/crashes/$h"  # only this run's findings
  mkdir -p "$corpus" "$B/crashes/$h"
  log=$B/$h-${seconds}s.log
  before=$(outside)
  set +e
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$B/tests/fuzz/${h}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 \
      -malloc_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$B/crashes/$h/" "$corpus" "tests/fuzz/corpus/$h" > "$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo 0)
  rate=$(grep -oE "stat::average_exec_per_sec: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo 0)
  size=$(find "$corpus" "tests/fuzz/corpus/$h" -type f -printf '%f\n' | sort -u | wc -l)
  if [[ $(outside) != "$before" ]]; then
    result="WROTE OUTSIDE ITS SCRATCH ROOT: /etc/passwd or /tmp changed"
    status=1
  elif ((rc == 0)); then
    result=ok
  else
    result="CRASH (exit $rc): $(ls "$B/crashes/$h" | head -n 1), see $log"
    status=1
  fi
  printf '%-13s %12s %10s %8s  %s\n' "$h" "$runs" "$rate" "$size" "$result"
done
exit $status
