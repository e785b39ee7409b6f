#!/usr/bin/env bash
# Installs everything (PyTorch included, for the interop test), builds, and
# runs every test with ctest in parallel. The last line is ctest's summary
# ("N% tests passed, ..."), repeated after the list of skipped tests.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh --with-torch
bench/fuzz.sh --build-only  # the libFuzzer harnesses (clang), run 30 s each by ctest
cd build
status=0
ctest -j "$(nproc)" --output-on-failure --timeout 600 | tee ctest-output.log || status=$?
echo
grep -E "tests passed" ctest-output.log | tail -n 1
exit "$status"
