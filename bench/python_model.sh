#!/usr/bin/env bash
# A submitter's own PyTorch module on Tally's Python workers against plain
# PyTorch, side by side: the ResNet example (examples/resnet/model.py),
# batch 64 per worker, SGD(lr 0.05, momentum 0.9), normalised
# Fashion-MNIST, STEPS steps per worker (default 150), one thread per
# process, alternating runs, REPEATS of each (default 3), medians:
#   standalone   one Python worker (cpu:1) and tally-server on this machine,
#                against a plain PyTorch training loop;
#   cluster      two Python workers (cpu:1 each) and tally-server, against
#                DistributedDataParallel (gloo) over two processes.
# Tally's samples/s are the job's own (samples over the shards' training
# time, from the first step to the last, after the data is loaded);
# PyTorch's are its loop's after its data is loaded.
#   bench/python_model.sh [REPEATS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
steps=${2:-150}
B=build
[[ -f $B/python/tally/engine.py ]] || { echo "build first: deploy/build.sh --with-torch" >&2; exit 1; }
. bench/lib.sh
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
export PYTHONPATH=$PWD/$B/python
PY=/usr/bin/python3
field() { $PY -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

tally_run() {  # workers -> samples/s
  local workers=$1 port=7460 i
  $B/server/tally-server --port=$port --lease_timeout_ms=10000 > "$tmp/server.log" 2>&1 &
  pids=($!)
  for ((i = 1; i <= workers; i++)); do
    OMP_NUM_THREADS=1 $PY -m tally.worker --server=localhost:$port --devices=cpu:1 \
      --name="w$i" --quiet > "$tmp/worker$i.log" 2>&1 &
    pids+=($!)
  done
  cp examples/resnet/model.py "$tmp/model.py"
  sed -e "s/workers: 1/workers: $workers, max_steps: $steps/" examples/resnet/job.yaml \
    > "$tmp/job.yaml"
  local id
  id=$($PY -m tally submit "$tmp/job.yaml" --server=localhost:$port | head -1)
  $PY - "$port" "$id" <<'PYEOF'
import sys, tally
from tally import tally_pb2 as pb
c = tally.Client(f"localhost:{sys.argv[1]}")
job = c.wait(sys.argv[2], timeout=1800)
assert job.state == pb.SUCCEEDED, (pb.JobState.Name(job.state), job.message)
print(job.metrics.samples / job.metrics.train_seconds)
PYEOF
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  pids=()
}

torch_run() {  # procs -> samples/s
  field "$(cd bench && $PY pytorch_resnet.py --procs="$1" --steps="$steps")" samples_per_sec
}

for k in tally1 torch1 tally2 torch2; do : > "$tmp/$k"; done
for ((r = 0; r < repeats; r++)); do
  tally_run 1 >> "$tmp/tally1"
  torch_run 1 >> "$tmp/torch1"
  torch_run 2 >> "$tmp/torch2"
  tally_run 2 >> "$tmp/tally2"
done
printf "%-34s %12s %12s %8s\n" "ResNet, $steps steps/worker, batch 64" "Tally" "PyTorch" "ratio"
t1=$(median < "$tmp/tally1"); p1=$(median < "$tmp/torch1")
t2=$(median < "$tmp/tally2"); p2=$(median < "$tmp/torch2")
printf "%-34s %12.1f %12.1f %8.3f\n" "standalone vs plain loop, sps" "$t1" "$p1" "$(ratio "$t1" "$p1")"
printf "%-34s %12.1f %12.1f %8.3f\n" "2 workers vs DDP-gloo 2 procs, sps" "$t2" "$p2" "$(ratio "$t2" "$p2")"
