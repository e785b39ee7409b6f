#!/usr/bin/env bash
# The Python package type-checks: mypy, with python/mypy.ini, over the
# package as built (build/python/tally: python/tally's sources, _native.pyi
# for the extension, protoc's tally_pb2.pyi for the messages) finds nothing.
#   tests/python_types_test.sh BUILD_DIR
# Exits 77 (skipped) without mypy, or where the Python package is not built
# (it needs pybind11: deploy/install-deps.sh --with-torch).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v mypy > /dev/null; then
  echo "SKIP: no mypy (deploy/install-deps.sh installs it)"
  exit 77
fi
if [[ ! -f $build/python/tally/tally_pb2.pyi ]]; then
  echo "SKIP: no $build/python/tally/tally_pb2.pyi (the Python package is not built)"
  exit 77
fi
# From the package's parent, so that `files = tally` (mypy.ini) and the
# path given name the same package.
cd "$build/python"
exec mypy --config-file "$src/python/mypy.ini" --cache-dir "$build/python/.mypy_cache" \
  "$build/python/tally"
