#!/usr/bin/env bash
# A submitter's own PyTorch module on Tally's Python workers against plain
# PyTorch, side by side, EXAMPLE (default resnet) one of
#   resnet    the ResNet example (examples/resnet/model.py), batch 64 per
#             worker, SGD(lr 0.05, momentum 0.9), normalised Fashion-MNIST
#             (reference: bench/pytorch_resnet.py);
#   text-lm   the byte-level language model (examples/text-lm/model.py),
#             batch 32 windows of 128 bytes per worker, Adam(lr 0.002), the
#             fortunes corpus as a text dataset (bench/pytorch_lm.py reads
#             the same windows), with each side's final test loss;
#   dlrm      the DLRM example (examples/dlrm: 26 hashed tables of 20,000 x
#             16 on the shards, Adagrad; SGD on the towers), batch 256 per
#             worker, synthetic clicks (bench/pytorch_dlrm.py: the same
#             samples, nn.EmbeddingBag(sparse=True), DDP-gloo all-reducing
#             the sparse gradients), with each side's test log-loss;
# STEPS steps per worker (default 150), one thread per process,
# alternating runs, REPEATS of each (default 3), medians:
#   standalone   one Python worker (cpu:1) and tally-server on this machine,
#                against a plain PyTorch training loop;
#   cluster      two Python workers (cpu:1 each) and tally-server, against
#                DistributedDataParallel (gloo) over two processes.
# Tally's samples/s are the job's own (samples over the shards' training
# time, from the first step to the last, after the data is loaded);
# PyTorch's are its loop's after its data is loaded.
#   bench/python_model.sh [REPEATS] [STEPS] [EXAMPLE]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
steps=${2:-150}
example=${3:-resnet}
case $example in
  resnet) reference=pytorch_resnet.py; batch=64 ;;
  text-lm) reference=pytorch_lm.py; batch=32 ;;
  dlrm) reference=pytorch_dlrm.py; batch=256 ;;
  *) echo "unknown example $example (resnet, text-lm, dlrm)" >&2; exit 2 ;;
esac
. bench/lib.sh
python_bench
field() { $PY -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

tally_run() {  # workers -> samples/s test_loss
  local workers=$1 port=7460 i
  $B/server/tally-server --port=$port --lease_timeout_ms=10000 > "$tmp/server.log" 2>&1 &
  pids=($!)
  for ((i = 1; i <= workers; i++)); do
    OMP_NUM_THREADS=1 $PY -m tally.worker --server=localhost:$port --devices=cpu:1 \
      --name="w$i" --quiet > "$tmp/worker$i.log" 2>&1 &
    pids+=($!)
  done
  cp "examples/$example/model.py" "$tmp/model.py"
  sed -e "s/workers: [0-9]*/workers: $workers, max_steps: $steps/" \
    "examples/$example/job.yaml" > "$tmp/job.yaml"
  local id
  id=$($PY -m tally submit "$tmp/job.yaml" --server=localhost:$port | head -1)
  $PY - "$port" "$id" <<'PYEOF'
import sys, tally
from tally import tally_pb2 as pb
c = tally.Client(f"localhost:{sys.argv[1]}")
job = c.wait(sys.argv[2], timeout=1800)
assert job.state == pb.SUCCEEDED, (pb.JobState.Name(job.state), job.message)
print(job.metrics.samples / job.metrics.train_seconds, job.metrics.test_loss)
PYEOF
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  pids=()
}

torch_run() {  # procs -> samples/s test_loss
  local out
  # One thread, as the workers have: Debian's OpenBLAS (pthreads) starts a
  # thread a core unless OMP_NUM_THREADS says otherwise.
  out=$(cd bench && OMP_NUM_THREADS=1 $PY "$reference" --procs="$1" --steps="$steps")
  echo "$(field "$out" samples_per_sec) $($PY -c "import json,sys; print(json.loads(sys.argv[1]).get('test_loss', 'nan'))" "$out")"
}
# Column K's median.
col() { cut -d' ' -f"$2" < "$tmp/$1" | median; }

for k in tally1 torch1 tally2 torch2; do : > "$tmp/$k"; done
for ((r = 0; r < repeats; r++)); do
  tally_run 1 >> "$tmp/tally1"
  torch_run 1 >> "$tmp/torch1"
  torch_run 2 >> "$tmp/torch2"
  tally_run 2 >> "$tmp/tally2"
done
printf "%-36s %12s %12s %8s\n" "$example, $steps steps/worker, batch $batch" "Tally" "PyTorch" "ratio"
t1=$(col tally1 1); p1=$(col torch1 1); t2=$(col tally2 1); p2=$(col torch2 1)
printf "%-36s %12.1f %12.1f %8.3f\n" "standalone vs plain loop, sps" "$t1" "$p1" "$(ratio "$t1" "$p1")"
printf "%-36s %12.1f %12.1f %8.3f\n" "2 workers vs DDP-gloo 2 procs, sps" "$t2" "$p2" "$(ratio "$t2" "$p2")"
if [[ $example == text-lm || $example == dlrm ]]; then
  printf "%-36s %12.4f %12.4f\n" "standalone vs plain loop, test loss" "$(col tally1 2)" "$(col torch1 2)"
  printf "%-36s %12.4f %12.4f\n" "2 workers vs DDP-gloo, test loss" "$(col tally2 2)" "$(col torch2 2)"
fi
