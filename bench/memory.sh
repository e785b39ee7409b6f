#!/usr/bin/env bash
# Peak memory and throughput on a large model, Tally against PyTorch DDP in
# one run: a 74M-parameter MLP (784-8192-8192-10, 295 MB of float32
# weights), Adam, two workers of one thread, batch 64 each, 20 steps of
# synthetic data. Tally: tally-server (which holds the job's only shard)
# and two tally-worker daemons; DDP: two gloo processes
# (bench/pytorch_ddp.py --steps). Prints samples/s and every process's
# peak resident set (VmHWM), and the model's size for scale.
#   bench/memory.sh
# WORKER_FLAGS: more tally-worker flags (e.g. --exchange_stream=false).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
PY=/usr/bin/python3
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
steps=20
port=7421
cat > "$tmp/job.yaml" <<SPEC
name: mlp-74m
model:
  layers:
    - linear: {in_features: 784, out_features: 8192}
    - relu
    - linear: {in_features: 8192, out_features: 8192}
    - relu
    - linear: {in_features: 8192, out_features: 10}
dataset: {name: synthetic, features: 784, classes: 10, train_size: $((steps * 2 * 64)), test_size: 64}
training: {epochs: 1, batch_size: 64, workers: 2}
optimizer: {type: adam, lr: 0.001}
SPEC
hwm() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
$B/server/tally-server --listen=127.0.0.1 --port=$port > "$tmp/server.log" 2>&1 &
sp=$!
pids=("$sp")
for _ in $(seq 100); do $B/client/tally --server=127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.05; done
for i in 1 2; do
  $B/worker/tally-worker --server=127.0.0.1:$port --devices=cpu:1 --quiet --health_port=-1 \
    ${WORKER_FLAGS:-} > "$tmp/w$i.log" 2>&1 &
  pids+=($!)
done
out=$($B/client/tally --server=127.0.0.1:$port submit "$tmp/job.yaml" --wait) || { echo "job failed: $out" >&2; exit 1; }
id=${out%%$'\n'*}
params=$($B/client/tally --server=127.0.0.1:$port status "$id" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['num_params'])")
tsps=$($B/client/tally --server=127.0.0.1:$port status "$id" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['metrics']['mean_samples_per_sec'])")
s_mb=$(hwm "${pids[0]}"); w1_mb=$(hwm "${pids[1]}"); w2_mb=$(hwm "${pids[2]}")
kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true
pids=()
(cd bench && $PY pytorch_ddp.py --model mlp-large --optimizer adam --steps $steps --procs 2 --port 29561) > "$tmp/d.json"
model_mb=$($PY -c "print(round($params * 4 / 2**20))")
$PY - "$tmp/d.json" <<PYEOF
import json, sys
d = json.load(open(sys.argv[1]))
model = $model_mb
rows = [("Tally", $tsps, [("server (shard)", $s_mb), ("worker 1", $w1_mb), ("worker 2", $w2_mb)]),
        ("PyTorch DDP (gloo)", d["samples_per_sec"],
         [("rank 0", d["peak_rss_mb"][0]), ("rank 1", d["peak_rss_mb"][1]),
          ("launcher", d["launcher_peak_rss_mb"])])]
print(f"model: {$params:,} parameters, {model} MiB of float32; Adam; 2 workers x batch 64; $steps steps")
print(f"{'system':<20} {'samples/s':>10}  {'process':<16} {'peak RSS MiB':>12} {'x model':>8}")
for name, sps, procs in rows:
    total = sum(mb for _, mb in procs)
    for i, (p, mb) in enumerate(procs):
        print(f"{name if i == 0 else '':<20} {sps if i == 0 else '':>10.6}  {p:<16} {mb:>12.0f} {mb / model:>8.2f}")
    print(f"{'':<20} {'':>10}  {'total':<16} {total:>12.0f} {total / model:>8.2f}")
print(f"Tally / DDP samples/s: {rows[0][1] / rows[1][1]:.2f}")
PYEOF
