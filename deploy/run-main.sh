#!/usr/bin/env bash
# The main job: installs and builds Tally, then trains the example MLP on
# Fashion-MNIST (2 epochs, standalone worker on one CPU device), printing
# progress and the final test accuracy, and writes the weights to
# out/fashion-mnist-mlp.safetensors.
#   deploy/run-main.sh [JOB_SPEC] [--devices=cpu:N]
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-examples/fashion-mnist-mlp.yaml}
shift || true
deploy/build.sh
mkdir -p out
name=$(basename "$job" .yaml)
build/worker/tally-worker --standalone --job="$job" "$@" \
  --output="out/$name.safetensors" --summary_json="out/$name.json"
echo "summary: out/$name.json, weights: out/$name.safetensors"
