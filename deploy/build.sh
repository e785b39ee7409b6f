#!/usr/bin/env bash
# Installs the Debian packages Tally needs and builds it into build/ with
# Ninja. Re-running only rebuilds what changed.
#   deploy/build.sh [--with-torch] [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
deps_args=()
if [[ "${1:-}" == "--with-torch" ]]; then deps_args+=(--with-torch); shift; fi
deploy/install-deps.sh "${deps_args[@]}"
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
elif (($# > 0)); then
  cmake -S . -B build "$@"
fi
cmake --build build -j "$(nproc)"
