#!/usr/bin/env bash
# Peak memory and throughput on a large model, Tally against PyTorch DDP in
# one run: a 74M-parameter MLP (784-8192-8192-10, 295 MB of float32
# weights), Adam, WORKERS (default 2) workers of one thread, batch 64 each,
# 20 steps of synthetic data. Tally: tally-server (which holds the job's
# only shard) and WORKERS tally-worker daemons; DDP: WORKERS gloo processes
# (bench/pytorch_ddp.py --steps). Prints samples/s and every process's
# peak resident set (VmHWM), the model's size for scale, and the server's
# bound (2 + Adam's 2 slots) x model + 64 MiB.
#   [WORKERS=4] bench/memory.sh
# WORKER_FLAGS: more tally-worker flags (e.g. --exchange_stream=false);
# SERVER_FLAGS: more tally-server flags (e.g. --streamed_sums=false).
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
n=${WORKERS:-2}
cat > "$tmp/job.yaml" <<SPEC
name: mlp-74m
model:
  layers:
    - linear: {in_features: 784, out_features: 8192}
    - relu
    - linear: {in_features: 8192, out_features: 8192}
    - relu
    - linear: {in_features: 8192, out_features: 10}
dataset: {name: synthetic, features: 784, classes: 10, train_size: $((steps * n * 64)), test_size: 64}
training: {epochs: 1, batch_size: 64, workers: $n}
optimizer: {type: adam, lr: 0.001}
SPEC
hwm() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
$B/server/tally-server --listen=127.0.0.1 --port=$port ${SERVER_FLAGS:-} > "$tmp/server.log" 2>&1 &
sp=$!
pids=("$sp")
for _ in $(seq 100); do $B/client/tally --server=127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.05; done
for i in $(seq "$n"); do
  $B/worker/tally-worker --server=127.0.0.1:$port --devices=cpu:1 --quiet --health_port=-1 \
    ${WORKER_FLAGS:-} > "$tmp/w$i.log" 2>&1 &
  pids+=($!)
done
out=$($B/client/tally --server=127.0.0.1:$port submit "$tmp/job.yaml" --wait) || { echo "job failed: $out" >&2; exit 1; }
id=${out%%$'\n'*}
params=$($B/client/tally --server=127.0.0.1:$port status "$id" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['num_params'])")
tsps=$($B/client/tally --server=127.0.0.1:$port status "$id" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['metrics']['mean_samples_per_sec'])")
s_mb=$(hwm "${pids[0]}")
w_mb=()
for i in $(seq "$n"); do w_mb+=("$(hwm "${pids[$i]}")"); done
kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true
pids=()
(cd bench && $PY pytorch_ddp.py --model mlp-large --optimizer adam --steps $steps --procs "$n" --port 29561) > "$tmp/d.json"
model_mb=$($PY -c "print(round($params * 4 / 2**20))")
$PY - "$tmp/d.json" <<PYEOF
import json, sys
d = json.load(open(sys.argv[1]))
model = $model_mb
workers = [int(x) for x in "${w_mb[*]}".split()]
rows = [("Tally", $tsps, [("server (shard)", $s_mb)] +
         [(f"worker {i + 1}", mb) for i, mb in enumerate(workers)]),
        ("PyTorch DDP (gloo)", d["samples_per_sec"],
         [(f"rank {i}", mb) for i, mb in enumerate(d["peak_rss_mb"])] +
         [("launcher", d["launcher_peak_rss_mb"])])]
print(f"model: {$params:,} parameters, {model} MiB of float32; Adam; $n workers x batch 64; $steps steps")
print(f"{'system':<20} {'samples/s':>10}  {'process':<16} {'peak RSS MiB':>12} {'x model':>8}")
for name, sps, procs in rows:
    total = sum(mb for _, mb in procs)
    for i, (p, mb) in enumerate(procs):
        print(f"{name if i == 0 else '':<20} {sps if i == 0 else '':>10.6}  {p:<16} {mb:>12.0f} {mb / model:>8.2f}")
    print(f"{'':<20} {'':>10}  {'total':<16} {total:>12.0f} {total / model:>8.2f}")
print(f"Tally / DDP samples/s: {rows[0][1] / rows[1][1]:.2f}")
bound = (2 + 2) * $params * 4 / 2**20 + 64
print(f"server peak {$s_mb} MiB against (2 + 2 slots) x model + 64 MiB = {bound:.0f} MiB:"
      f" {'within' if $s_mb <= bound else 'over'}")
PYEOF
