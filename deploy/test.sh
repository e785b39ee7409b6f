#!/usr/bin/env bash
# Installs everything (PyTorch included, for the interop test), builds, and
# runs every test with ctest in parallel. The last line is ctest's summary
# ("N% tests passed, ..."), repeated after the list of skipped tests.
# TALLY_LARGE_TESTS=1 adds the tests labelled large (minutes and 12 GiB
# each, run alone: the 4 GiB table over four shards).
#   TALLY_LARGE_TESTS=1 bash deploy/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh --with-torch
bench/fuzz.sh --build-only  # the libFuzzer harnesses (clang), run 30 s each by ctest
cd build
status=0
large=(-LE large)
[[ ${TALLY_LARGE_TESTS:-0} == 1 ]] && large=()
ctest -j "$(nproc)" --output-on-failure --timeout 600 "${large[@]}" |
  tee ctest-output.log || status=$?
echo
grep -E "tests passed" ctest-output.log | tail -n 1
exit "$status"
