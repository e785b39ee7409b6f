#!/usr/bin/env bash
# Validates deploy/k8s offline (tests/k8s_validate.mjs): installs the npm
# packages kubernetes-models and js-yaml into BUILD_DIR/k8s-validate the
# first time. Skips (77) without node and npm, or when the npm registry
# cannot be reached.
#   k8s_test.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
modules=$1/k8s-validate
command -v node > /dev/null && command -v npm > /dev/null || { echo "SKIP: needs node and npm"; exit 77; }
if [[ ! -d $modules/node_modules/kubernetes-models ]]; then
  mkdir -p "$modules"
  if ! (cd "$modules" && timeout 300 npm install --silent --no-audit --no-fund \
          kubernetes-models@4 js-yaml@4 > npm.log 2>&1); then
    echo "SKIP: cannot install kubernetes-models from the npm registry"; tail -n 5 "$modules/npm.log"
    exit 77
  fi
fi
node "$here/k8s_validate.mjs" "$modules" "$here/../deploy/k8s"
