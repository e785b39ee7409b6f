#!/usr/bin/env bash
# Local-cluster throughput against PyTorch DDP, side by side in one run.
#
# Tally: tally-server and two tally-worker daemons (cpu:1 each) on localhost
# train the MLP and the CNN example for one epoch (batch 64 per worker, SGD
# lr 0.02 momentum 0.9); the figure is the job's mean samples/s over its
# training (first pull to last step). PyTorch: DistributedDataParallel with
# gloo, two processes of one thread, the same model, batch, optimizer and
# data (bench/pytorch_ddp.py). Row mlp-bf16: Tally with bfloat16 on the wire
# against DDP with its fp16 gradient compression hook. Medians of REPEATS
# (default 3) alternating runs.
#   bench/cluster_throughput.sh [REPEATS]
# ROWS="mlp cnn" picks rows (default: mlp mlp-bf16 cnn). With BASELINE=DIR
# (another build tree, e.g. of an earlier commit) its Tally runs too,
# alternating with this build's, in a column of their own; BASELINE_FLAGS
# (tally-worker flags, e.g. --overlap_push=false) are given to the
# baseline's workers, whose build is then this one unless BASELINE is set;
# SERVER_FLAGS and BASELINE_SERVER_FLAGS (tally-server flags, e.g.
# --streamed_sums=false) likewise for each one's server.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
B=${BUILD:-build}  # BUILD=DIR: another build tree (an earlier commit)
PY=/usr/bin/python3
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
. bench/lib.sh  # median, ratio, iperf_gbps
port=7391

tally_run() {  # spec [build [worker flags [server flags]]] -> samples/s and test accuracy
  local B=${2:-$B} wflags=(${3:-}) sflags=(${4:-${SERVER_FLAGS:-}})
  port=$((port + 1))
  $B/server/tally-server --listen=127.0.0.1 --port=$port "${sflags[@]}" > "$tmp/server.log" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do $B/client/tally --server=127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.05; done
  local w=() i
  for i in 1 2; do
    $B/worker/tally-worker --server=127.0.0.1:$port --devices=cpu:1 --quiet --health_port=-1 \
      "${wflags[@]}" > "$tmp/w$i.log" 2>&1 &
    w+=($!)
  done
  pids=("$sp" "${w[@]}")
  local out id
  # A few steps of the same job first, so that both daemons have loaded the
  # dataset (they keep it) and the timed job starts with both ready, as
  # DDP's timing starts after its processes loaded theirs and met.
  sed -e 's/^training:/training:\n  max_steps: 4/' "$1" > "$tmp/warmup.yaml"
  out=$($B/client/tally --server=127.0.0.1:$port submit "$tmp/warmup.yaml" --wait) ||
    { echo "warm-up job failed: $out" >&2; exit 1; }
  out=$($B/client/tally --server=127.0.0.1:$port submit "$1" --wait) || { echo "job failed: $out" >&2; exit 1; }
  id=${out%%$'\n'*}
  $B/client/tally --server=127.0.0.1:$port status "$id" --json |
    $PY -c "import json,sys; m=json.load(sys.stdin)['metrics']; print(m['mean_samples_per_sec'], m['test_accuracy'])"
  kill "$sp" "${w[@]}"; wait 2>/dev/null || true
  pids=()
}

[[ (${BASELINE_FLAGS:-} || ${BASELINE_SERVER_FLAGS:-}) && ! ${BASELINE:-} ]] && BASELINE=$B
printf "%-9s %14s %14s %8s %10s %10s" model tally_sps ddp_sps ratio tally_acc ddp_acc
[[ ${BASELINE:-} ]] && printf " %14s %9s" base_sps base_ddp
printf "\n"
# mlp-bf16: Tally with training.wire_dtype bfloat16 against DDP with its
# fp16_compress_hook (each one's gradient compression).
for row in ${ROWS:-mlp mlp-bf16 cnn}; do
  model=${row%%-*}
  compress=none
  sed -e 's/epochs: 2/epochs: 1/' "examples/fashion-mnist-$model.yaml" > "$tmp/$row.yaml"
  if [[ $row == *-bf16 ]]; then
    sed -i 's/^  workers: 2/  workers: 2\n  wire_dtype: bfloat16/' "$tmp/$row.yaml"
    grep -q "wire_dtype: bfloat16" "$tmp/$row.yaml" || { echo "could not set wire_dtype" >&2; exit 1; }
    compress=fp16
  fi
  : > "$tmp/t"; : > "$tmp/d"; : > "$tmp/b"
  for ((i = 0; i < repeats; i++)); do
    # (Not in a subshell: the run's processes are gone before the next.)
    tally_run "$tmp/$row.yaml" > "$tmp/r"; read -r sps acc < "$tmp/r"
    echo "$sps" >> "$tmp/t"; tacc=$acc
    if [[ ${BASELINE:-} ]]; then
      tally_run "$tmp/$row.yaml" "$BASELINE" "${BASELINE_FLAGS:-}" "${BASELINE_SERVER_FLAGS:-}" > "$tmp/r"; read -r sps acc < "$tmp/r"
      echo "$sps" >> "$tmp/b"
    fi
    (cd bench && $PY pytorch_ddp.py --model "$model" --procs 2 --compress $compress --port $((29500 + i))) > "$tmp/d.json"
    $PY -c "import json; print(json.load(open('$tmp/d.json'))['samples_per_sec'])" >> "$tmp/d"
    dacc=$($PY -c "import json; print(json.load(open('$tmp/d.json'))['test_accuracy'])")
  done
  t=$(median < "$tmp/t"); d=$(median < "$tmp/d")
  printf "%-9s %14.0f %14.0f %8.2f %10.4f %10.4f" "$row" "$t" "$d" \
    "$(ratio "$t" "$d")" "$tacc" "$dacc"
  if [[ ${BASELINE:-} ]]; then
    b=$(median < "$tmp/b")
    printf " %14.0f %9.2f" "$b" "$(ratio "$b" "$d")"
  fi
  printf "\n"
done
