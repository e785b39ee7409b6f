#!/usr/bin/env bash
# Tally's data loader against PyTorch's DataLoader, side by side, on the same
# files, one thread of work against num_workers 0 and two against 2,
# REPEATS epochs each (default 3), medians of samples/s:
#   png    Fashion-MNIST's 60,000 training images as 28x28 grayscale PNGs
#          (examples/fashion-mnist-png/export.py), ToTensor + Normalize;
#   jpeg   3,000 RGB 256x256 JPEGs (quality 90, 10 classes), Resize(224) +
#          CenterCrop(224) + ToTensor + Normalize (ImageNet's evaluation
#          transform), Tally's `resize: crop` to [3, 224, 224];
#   npy    the 60,000 training images as uint8 .npy arrays, memory-mapped,
#          scaled to [0, 1].
# PyTorch's side is torchvision's ImageFolder (PIL decodes) and a Dataset
# over np.load(mmap_mode="r") (bench/pytorch_loader.py); Tally's is the
# worker's BatchLoader (bench/loader.cc). Batch 64, shuffled.
# Then the engine's wait for the loader while training: the CNN examples on
# the IDX files (in memory), the PNG folder (both 2 epochs, normalised) and
# the .npy arrays (1 epoch, not normalised), one worker each, from the
# worker's tally_worker_loader_wait_seconds against the job's training time.
#   bench/loader.sh [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
B=build
[[ -x $B/bench/tally-bench-loader ]] || { echo "build first: deploy/build.sh --with-torch" >&2; exit 1; }
PY=/usr/bin/python3
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
field() { $PY -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

$PY examples/fashion-mnist-png/export.py "$tmp/png" > /dev/null
$PY examples/fashion-mnist-npy/export.py "$tmp/npy" > /dev/null
$PY - "$tmp/jpeg" <<'PY'
import os, sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for c in range(10):
    os.makedirs(f"{sys.argv[1]}/class{c}", exist_ok=True)
    for i in range(300):  # smooth colour fields with noise: photo-like sizes
        low = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        img = Image.fromarray(low).resize((256, 256), Image.BICUBIC)
        noise = rng.integers(-12, 12, size=(256, 256, 3))
        px = np.clip(np.asarray(img, np.int32) + noise, 0, 255).astype(np.uint8)
        Image.fromarray(px).save(f"{sys.argv[1]}/class{c}/{i:04d}.jpg", quality=90)
PY
echo "data: $(du -sh "$tmp/png/train" | cut -f1) of PNGs, $(du -sh "$tmp/jpeg" | cut -f1) of JPEGs, $(du -sh "$tmp/npy" | cut -f1) of .npy"

spec() {  # name dataset-json -> path
  cat > "$tmp/$1.json" <<JSON
{"model": {"layers": ["flatten", {"linear": {"in_features": 784, "out_features": 10}}]},
 "dataset": $2, "training": {"batch_size": 64, "seed": 1}}
JSON
  echo "$tmp/$1.json"
}
png=$(spec png "{\"name\": \"image_folder\", \"train\": \"$tmp/png/train\", \"shape\": [1, 28, 28],
  \"mean\": [0.286], \"std\": [0.353], \"classes\": 10, \"train_size\": 60000}")
jpeg=$(spec jpeg "{\"name\": \"image_folder\", \"train\": \"$tmp/jpeg\", \"shape\": [3, 224, 224],
  \"resize\": \"crop\", \"mean\": [0.485, 0.456, 0.406], \"std\": [0.229, 0.224, 0.225],
  \"classes\": 10, \"train_size\": 3000}")
sed -i 's/"in_features": 784/"in_features": 150528/' "$jpeg"
npy=$(spec npy "{\"name\": \"arrays\", \"train\": {\"inputs\": \"$tmp/npy/x_train.npy\",
  \"labels\": \"$tmp/npy/y_train.npy\"}, \"shape\": [1, 28, 28], \"classes\": 10, \"train_size\": 60000}")

printf '%-6s %-8s %14s %14s %8s\n' data threads "Tally (sps)" "PyTorch (sps)" ratio
for kind in png jpeg npy; do
  for threads in 1 2; do
    workers=$((threads == 1 ? 0 : 2))
    t=$($B/bench/tally-bench-loader --job="${!kind}" --threads=$threads --repeats="$repeats")
    case $kind in
      png) p=$($PY bench/pytorch_loader.py folder "$tmp/png/train" --channels 1 --size 28 \
                 --mean 0.286 --std 0.353 --workers $workers --repeats "$repeats") ;;
      jpeg) p=$($PY bench/pytorch_loader.py folder "$tmp/jpeg" --channels 3 --size 224 \
                  --resize 224 --mean 0.485 0.456 0.406 --std 0.229 0.224 0.225 \
                  --workers $workers --repeats "$repeats") ;;
      npy) p=$($PY bench/pytorch_loader.py npy "$tmp/npy/x_train.npy" "$tmp/npy/y_train.npy" \
                 --workers $workers --repeats "$repeats") ;;
    esac
    tm=$(field "$t" median)
    pm=$(field "$p" median)
    printf '%-6s %-8s %14.0f %14.0f %8.2f   (Tally %s, PyTorch %s)\n' "$kind" \
      "$threads/$workers" "$tm" "$pm" "$(awk -v a="$tm" -v b="$pm" 'BEGIN {print a / b}')" \
      "$(field "$t" samples_per_sec)" "$(field "$p" samples_per_sec)"
  done
done

# The engine's wait for its batches while training (one worker, cpu:1).
port=7480
mport=7490  # the server takes port + 1 for its data plane
$B/server/tally-server --port=$port > "$tmp/server.log" 2>&1 &
pids+=($!)
$B/worker/tally-worker --server=localhost:$port --devices=cpu:1 --name=w \
  --metrics_port=$mport --data_root="$tmp,/usr/share" --quiet > "$tmp/worker.log" 2>&1 &
pids+=($!)
export PYTHONPATH=$PWD/$B/python
metric() { curl -s "localhost:$mport/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
for _ in $(seq 100); do curl -s "localhost:$mport/metrics" > /dev/null && break; sleep 0.1; done
for kind in idx png npy; do
  if [[ $kind == idx ]]; then  # the reference: the same CNN on the IDX files
    sed -e "s/workers: 2/workers: 1/" -e "s/lr: 0.02/lr: 0.01/" \
      examples/fashion-mnist-cnn.yaml > "$tmp/train-$kind.yaml"
  elif [[ $kind == png ]]; then
    sed -e "s|/tmp/fashion-mnist-png|$tmp/png|g" -e "s/workers: 2/workers: 1/" \
      -e "s/lr: 0.02/lr: 0.01/" examples/fashion-mnist-png/job.yaml > "$tmp/train-$kind.yaml"
  else
    sed -e "s|/tmp/fashion-mnist-npy|$tmp/npy|g" examples/fashion-mnist-npy/job.yaml \
      > "$tmp/train-$kind.yaml"
  fi
  w0=$(metric tally_worker_loader_wait_seconds_sum)
  result=$($PY - "$port" "$tmp/train-$kind.yaml" <<'PY'
import sys
import tally
c = tally.Client(f"localhost:{sys.argv[1]}")
job = c.wait(c.submit(sys.argv[2]).id, timeout=1200)
m = job.metrics
print(f"{m.step} {m.train_seconds} {m.mean_samples_per_sec} {m.test_accuracy} {job.message}")
PY
)
  w1=$(metric tally_worker_loader_wait_seconds_sum)
  read -r steps t sps accuracy _ <<< "$result"
  awk -v k=$kind -v n="$steps" -v t="$t" -v sps="$sps" -v acc="$accuracy" -v w0="${w0:-0}" -v w1="$w1" 'BEGIN {
    w = w1 - w0
    printf "training on %s: %d steps in %.1f s (%.0f samples/s), test accuracy %.4f; the engine waited %.0f ms for its batches in all, %.2f%% of the training time\n", k, n, t, sps, acc, w * 1e3, 100 * w / t }'
done
