#!/usr/bin/env bash
# GPU verification, for a machine with an NVIDIA GPU (and the CUDA toolkit at
# /usr/local/cuda): builds with the CUDA backend, runs the GPU tests, and
# benchmarks: the MLP and CNN examples (one epoch, standalone) on cuda:0
# against cpu:1, and a large MLP step (4 x 4096^2, batch 1024) against the
# same GEMMs in cuBLAS alone. Prints a short summary; about 5 minutes.
#   bench/gpu-check.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
  echo "nvidia-smi: not available"
if [[ ! -f $build/build.ninja ]]; then
  deploy/install-deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTALLY_CUDA=ON
fi
cmake --build "$build" -j "$(nproc)" || exit 1
summary=()
(cd "$build" && ctest -R "Cuda|cuda" --output-on-failure --timeout 300) | tee /tmp/tally-gpu-tests.txt
summary+=("GPU tests: $(grep -E 'tests passed' /tmp/tally-gpu-tests.txt)")
skipped=$(grep -c "Skipped" /tmp/tally-gpu-tests.txt || true)
summary+=("GPU tests skipped: $skipped")
tmp=$(mktemp -d)
for model in mlp cnn; do
  sed -e 's/epochs: 2/epochs: 1/' "examples/fashion-mnist-$model.yaml" > "$tmp/$model.yaml"
  for devices in cpu:1 cuda:0; do
    "$build/worker/tally-worker" --standalone --job="$tmp/$model.yaml" --devices="$devices" \
      --quiet --summary_json="$tmp/$model-$devices.json" > /dev/null || summary+=("$model $devices: FAILED")
    if [[ -f $tmp/$model-$devices.json ]]; then
      summary+=("$model $devices: $(python3 -c "import json; d=json.load(open('$tmp/$model-$devices.json')); print(f\"{d['samples_per_sec']:.0f} samples/s, test accuracy {d['test_accuracy']:.4f}\")")")
    fi
  done
done
for tf32 in false true; do
  summary+=("large MLP step (tf32=$tf32): $("$build/bench/tally-bench-gpu-step" --steps=20 --tf32=$tf32 2>&1)")
done
rm -rf "$tmp"
echo
echo "==== Tally GPU check summary ($((SECONDS - start)) s) ===="
printf '%s\n' "${summary[@]}"
