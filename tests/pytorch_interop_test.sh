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
# The same through a cluster: two workers, the server's weights fetched.
build=$(dirname "$(dirname "$worker")")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait; rm -rf "$dir"' EXIT
"$build/server/tally-server" --listen=127.0.0.1 --port="$port" > "$dir/server.log" 2>&1 &
pids+=($!)
for i in 1 2; do
  "$worker" --server="127.0.0.1:$port" --quiet --health_port=-1 > "$dir/w$i.log" 2>&1 &
  pids+=($!)
done
tally() { "$build/client/tally" --server="127.0.0.1:$port" "$@"; }
for _ in $(seq 100); do tally health > /dev/null 2>&1 && break; sleep 0.05; done
out=$(tally submit "$dir/mlp.yaml" --wait)
id=${out%%$'\n'*}
tally status "$id" --json > "$dir/cluster.json"
tally fetch "$id" --output="$dir/cluster.safetensors" > /dev/null
$PY tests/check_pytorch_load.py mlp "$dir/cluster.safetensors" "$dir/cluster.json"
