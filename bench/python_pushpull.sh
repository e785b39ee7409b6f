#!/usr/bin/env bash
# Pushing and pulling a 67 MB model from the Python worker against the C++
# worker: one linear layer of 4096 x 4096 (+ 4096 biases: 16,781,312
# float32, 67.1 MB) on a synthetic dataset of 4096 features and classes,
# batch 1, STEPS steps (default 100), bsp, one worker and tally-server on
# this machine (the worker next to its shard; a range this big goes over
# loopback TCP, past the shared-memory bound), one thread
# per process. At batch 1 the layer's compute is two matrix-vector products
# (a few ms); the rest of a step is the pull of 67 MB and the push of 67 MB.
# The same model, as a job's layers on tally-worker (the native engine),
# and as nn.Linear(4096, 4096) on python3 -m tally.worker (PyTorch, the
# same C++ parameter client under pybind11), alternating runs, REPEATS of
# each (default 3), medians: the job's own steps/s (steps over the shards'
# training time, after the data is loaded), and the worker's own figures
# per step as it reports them while it trains (`tally status`'s table):
# its compute, and the time it waits for its pull and its push, which is
# what pushing and pulling costs it. The ratio on that line is the C++
# worker's time over the Python worker's: its speed relative to C++.
#   bench/python_pushpull.sh [REPEATS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
steps=${2:-100}
. bench/lib.sh
python_bench
dataset="dataset: {name: synthetic, train_size: 4096, test_size: 64, features: 4096, classes: 4096, seed: 1}"
training="training: {epochs: 1, batch_size: 1, max_steps: $steps, seed: 1, workers: 1}"
printf '%s\n' "name: pushpull-cpp" \
  "model: {layers: [{linear: {in_features: 4096, out_features: 4096}}]}" \
  "$dataset" "$training" "optimizer: {type: sgd, lr: 0.01}" > "$tmp/cpp.yaml"
printf '%s\n' "name: pushpull-python" "model: {python: {file: model.py, build: make_model}}" \
  "$dataset" "$training" "optimizer: {type: sgd, lr: 0.01}" > "$tmp/python.yaml"
printf '%s\n' "from torch import nn" "" "" "def make_model():" \
  "    return nn.Linear(4096, 4096)" > "$tmp/model.py"

run() {  # cpp|python -> steps/s
  local kind=$1 port=7470
  $B/server/tally-server --port=$port --lease_timeout_ms=10000 > "$tmp/server.log" 2>&1 &
  pids=($!)
  if [[ $kind == cpp ]]; then
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $B/worker/tally-worker --server=localhost:$port \
      --devices=cpu:1 --name=w --quiet > "$tmp/worker.log" 2>&1 &
  else
    OMP_NUM_THREADS=1 $PY -m tally.worker --server=localhost:$port --devices=cpu:1 \
      --name=w --quiet > "$tmp/worker.log" 2>&1 &
  fi
  pids+=($!)
  local id
  id=$($PY -m tally submit "$tmp/$kind.yaml" --server=localhost:$port | head -1)
  $PY - "$port" "$id" <<'PYEOF'
import statistics, sys, time, tally
from tally import tally_pb2 as pb
c = tally.Client(f"localhost:{sys.argv[1]}")
compute, data = [], []
while True:
    job = c.status(sys.argv[2])
    if job.state in tally.client.TERMINAL:
        break
    if job.metrics.step > 10 and job.metrics.progress:
        p = job.metrics.progress[0]  # the worker's smoothed figures per step
        compute.append(p.compute_seconds)
        data.append(p.wait_seconds + p.push_seconds)
    time.sleep(0.5)
assert job.state == pb.SUCCEEDED, (pb.JobState.Name(job.state), job.message)
print(job.metrics.step / job.metrics.train_seconds, 1000 * statistics.median(compute),
      1000 * statistics.median(data))
PYEOF
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  pids=()
}

: > "$tmp/cpp.sps"
: > "$tmp/python.sps"
for ((r = 0; r < repeats; r++)); do
  run cpp >> "$tmp/cpp.sps"
  run python >> "$tmp/python.sps"
done
col() { awk -v k="$2" '{print $k}' "$tmp/$1.sps" | median; }
printf "%-44s %10s %10s %8s\n" "67 MB model, batch 1, $steps steps" "Python" "C++" "ratio"
printf "%-44s %10.2f %10.2f %8.3f\n" "steps/s" "$(col python 1)" "$(col cpp 1)" \
  "$(ratio "$(col python 1)" "$(col cpp 1)")"
printf "%-44s %10.1f %10.1f\n" "compute ms per step (the engine)" "$(col python 2)" "$(col cpp 2)"
printf "%-44s %10.1f %10.1f %8.3f\n" "push+pull ms per step (speed ratio)" "$(col python 3)" \
  "$(col cpp 3)" "$(ratio "$(col cpp 3)" "$(col python 3)")"
