#!/usr/bin/env bash
# Single-process training throughput, Tally against PyTorch, side by side.
#
# For the MLP and the CNN example: one epoch of Fashion-MNIST, batch 64,
# SGD(lr 0.02, momentum 0.9), alternating Tally and PyTorch runs (REPEATS
# each, default 3) and reporting the median samples/s of each:
#   tally_sps     Tally with DEVICES (cpu:1 = one replica, one thread)
#   torch_1t_sps  PyTorch with one thread (the cpu:1 row's figure)
#   torch_nt_sps  PyTorch with as many threads as the row has replicas
#   ratio_1t      tally_sps / torch_1t_sps
# and, for the MLP's cpu:1 row, the floor under it (tally-bench-sgemm-floor,
# same widths and batch, one epoch of steps, median of REPEATS runs):
#   gemm_floor    samples/s of the step's 8 GEMMs alone
#   step_floor    samples/s of those GEMMs with plain loops for bias, ReLU,
#                 the loss and SGD (no data loading)
#   r_gemm r_step tally_sps over each floor
# Needs a built tree (deploy/build.sh) and python3-torch.
#
#   bench/train_throughput.sh [REPEATS] [DEVICES...]
# extra DEVICES (e.g. cpu:2) add rows with more replicas.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
shift || true
extra_devices=("$@")
worker=build/worker/tally-worker
floor=build/bench/tally-bench-sgemm-floor
[[ -x $worker && -x $floor ]] || { echo "build first: deploy/build.sh" >&2; exit 1; }
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

. bench/lib.sh  # median, ratio, iperf_gbps
field() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

printf "%-6s %-8s %10s %12s %12s %8s %9s %9s %10s %10s %7s %7s\n" model devices tally_sps torch_1t_sps torch_nt_sps ratio_1t tally_acc torch_acc \
  gemm_floor step_floor r_gemm r_step
for model in mlp cnn; do
  sed -e 's/epochs: 2/epochs: 1/' "examples/fashion-mnist-$model.yaml" > "$tmp/$model.yaml"
  for devices in cpu:1 "${extra_devices[@]}"; do
    threads=${devices#cpu:}
    : > "$tmp/t"; : > "$tmp/p"; : > "$tmp/fg"; : > "$tmp/fs"
    for ((i = 0; i < repeats; i++)); do
      $worker --standalone --job="$tmp/$model.yaml" --devices="$devices" --quiet \
        --summary_json="$tmp/t.json" > /dev/null
      field "$tmp/t.json" samples_per_sec >> "$tmp/t"
      tacc=$(field "$tmp/t.json" test_accuracy)
      # PyTorch with as many threads as Tally has replicas.
      $PY bench/pytorch_train.py --model "$model" --threads "$threads" > "$tmp/p.json"
      field "$tmp/p.json" samples_per_sec >> "$tmp/p"
      pacc=$(field "$tmp/p.json" test_accuracy)
      if [[ $model == mlp && $devices == cpu:1 ]]; then
        # The example's widths (examples/fashion-mnist-mlp.yaml), batch 64.
        $floor --layers=784,256,128,10 --batch=64 --steps=938 > "$tmp/f.json"
        field "$tmp/f.json" gemm_samples_per_sec >> "$tmp/fg"
        field "$tmp/f.json" step_samples_per_sec >> "$tmp/fs"
      fi
    done
    t=$(median < "$tmp/t")
    p=$(median < "$tmp/p")
    if [[ $devices == cpu:1 ]]; then base_p=$p; fi
    floors=(- - - -)
    if [[ -s $tmp/fg ]]; then
      fg=$(median < "$tmp/fg"); fs=$(median < "$tmp/fs")
      floors=("$(printf %.0f "$fg")" "$(printf %.0f "$fs")" \
        "$(printf %.2f "$(ratio "$t" "$fg")")" "$(printf %.2f "$(ratio "$t" "$fs")")")
    fi
    printf "%-6s %-8s %10.0f %12.0f %12.0f %8.2f %9.4f %9.4f %10s %10s %7s %7s\n" "$model" "$devices" "$t" "$base_p" "$p" \
      "$(ratio "$t" "$base_p")" "$tacc" "$pacc" "${floors[@]}"
  done
done
