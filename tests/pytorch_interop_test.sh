#!/usr/bin/env bash
# Trains a short run with tally-worker, then loads the exported .safetensors
# into the equivalent torch.nn.Sequential and checks that PyTorch computes
# the same test accuracy Tally reported. Skips (77) without PyTorch.
set -euo pipefail
worker="$1"
PY=/usr/bin/python3
if ! $PY -c "import torch" 2>/dev/null; then
  echo "SKIP: python3-torch is not installed"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for model in mlp cnn; do
  sed -e 's/epochs: 2/epochs: 1/' -e 's/seed: 1/seed: 1\n  max_steps: 150/' \
    "examples/fashion-mnist-$model.yaml" > "$dir/$model.yaml"
  "$worker" --standalone --job="$dir/$model.yaml" --quiet \
    --output="$dir/$model.safetensors" --summary_json="$dir/$model.json"
  $PY tests/check_pytorch_load.py "$model" "$dir/$model.safetensors" "$dir/$model.json"
done
