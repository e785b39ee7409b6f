#!/usr/bin/env bash
# Installs everything (PyTorch included, for the interop test), builds, and
# runs every test with ctest in parallel. The last lines are ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh --with-torch
cd build
ctest -j "$(nproc)" --output-on-failure --timeout 600
