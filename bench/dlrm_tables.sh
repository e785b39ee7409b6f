#!/usr/bin/env bash
# The DLRM of examples/dlrm with large tables: 26 hashed tables of ROWS x 16
# (default 400,000 each: 10.4 million rows, 666 MB of float32 and as much
# again in Adagrad's sums), synthetic clicks with CARD ids a feature (Zipf
# 1.05, default 400,000), batch 256 per worker, STEPS steps per worker
# (default 100), one thread per process, REPEATS alternating rounds
# (default 3), medians:
#   Tally     tally-server as coordinator only, two shard processes
#             (training.shards: 2, so every table spreads over both and no
#             process holds one whole), two Python workers (cpu:1); the
#             tables' modules built on the meta device, so the workers
#             never allocate them;
#   DDP-gloo  bench/pytorch_dlrm.py --procs 2: every rank holds every table
#             and its Adagrad sums, and gloo all-reduces the sparse
#             gradients.
# Per side: samples/s (Tally's over the shards' training time, DDP's over
# its loop, both after the data is made), the test log-loss and AUC, the
# peak resident memory of each process (VmHWM; DDP's ru_maxrss), and the
# bytes a step moves: Tally's row messages (pull and push, the job's table
# figures) against the bound (the batch's unique rows x 16 x 4 bytes, each
# way), and the dense part; DDP's bytes each rank wrote in its loop.
# TABLES=async in the environment runs Tally's side with
# training.consistency.tables: async (each worker's rows stepped as they
# come, the dense part bsp).
#   bench/dlrm_tables.sh [REPEATS] [STEPS] [ROWS] [CARD]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
steps=${2:-100}
rows=${3:-400000}
card=${4:-400000}
. bench/lib.sh
python_bench

dlrm_model "$rows" "$tmp/model.py"
consistency=""
[[ ${TABLES:-sync} == async ]] && consistency=", consistency: {tables: async}"
sed -e "s/workers: [0-9]*/workers: 2, max_steps: $steps, shards: 2$consistency/" \
    -e "s/cardinality: [0-9]*/cardinality: $card/" \
    examples/dlrm/job.yaml > "$tmp/job.yaml"

hwm() { awk '/VmHWM/ {print $2 * 1024}' "/proc/$1/status"; }

tally_run() {  # -> "samples/s loss auc wire bound dense rss..." (one line)
  local port=7470 i
  $B/server/tally-server --port=$port --noshard --lease_timeout_ms=10000 > "$tmp/server.log" 2>&1 &
  pids=($!)
  for i in 1 2; do
    $B/server/tally-server --port=$((port + i)) --coordinator=localhost:$port \
      --advertise=127.0.0.1:$((port + i)) --lease_timeout_ms=10000 > "$tmp/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 1 2; do
    OMP_NUM_THREADS=1 $PY -m tally.worker --server=localhost:$port --devices=cpu:1 \
      --name="w$i" --quiet > "$tmp/worker$i.log" 2>&1 &
    pids+=($!)
  done
  local id
  id=$($PY -m tally submit "$tmp/job.yaml" --server=localhost:$port | head -1)
  local figures
  figures=$($PY - "$port" "$id" "$steps" <<'PYEOF'
import sys, tally
from tally import tally_pb2 as pb
c = tally.Client(f"localhost:{sys.argv[1]}")
job = c.wait(sys.argv[2], timeout=3600)
assert job.state == pb.SUCCEEDED, (pb.JobState.Name(job.state), job.message)
m = job.metrics
worker_steps = 2 * int(sys.argv[3])
wire = sum(t.pull_wire_bytes + t.push_wire_bytes for t in m.tables) / worker_steps
bound = sum(t.pulled_bytes + t.pushed_bytes for t in m.tables) / worker_steps
print(m.samples / m.train_seconds, m.test_loss, m.test_auc, wire, bound)
PYEOF
)
  local rss=() p
  for p in "${pids[@]}"; do rss+=("$(hwm "$p")"); done
  echo "$figures ${rss[*]}"
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  pids=()
}

torch_run() {  # -> "samples/s loss auc wire rss0 rss1"
  local out
  out=$(cd bench && OMP_NUM_THREADS=1 $PY pytorch_dlrm.py --procs=2 --steps="$steps" \
          --rows="$rows" --cardinality="$card")
  $PY -c "
import json, sys
r = json.loads(sys.argv[1])
print(r['samples_per_sec'], r['test_loss'], r['test_auc'], max(r['wire_bytes_per_step']),
      *r['peak_rss'])" "$out"
}
col() { cut -d' ' -f"$2" < "$tmp/$1" | median; }

: > "$tmp/tally"
: > "$tmp/torch"
for ((r = 0; r < repeats; r++)); do
  tally_run >> "$tmp/tally"
  torch_run >> "$tmp/torch"
done
mib() { awk -v b="$1" 'BEGIN {printf "%.0f", b / 1048576}'; }
t=$(col tally 1); p=$(col torch 1)
echo "dlrm, 26 tables x $rows rows x 16, $card ids a feature, 2 workers, $steps steps/worker, batch 256, tables ${TABLES:-sync}"
printf "%-44s %14s %14s %8s\n" "" "Tally" "DDP-gloo" "ratio"
printf "%-44s %14.0f %14.0f %8.3f\n" "samples/s" "$t" "$p" "$(ratio "$t" "$p")"
printf "%-44s %14.4f %14.4f\n" "test log-loss" "$(col tally 2)" "$(col torch 2)"
printf "%-44s %14.4f %14.4f\n" "test AUC" "$(col tally 3)" "$(col torch 3)"
printf "%-44s %14s %14s\n" "row bytes a worker-step (messages)" "$(col tally 4 | xargs printf %.0f)" "-"
printf "%-44s %14s %14s %8.3f\n" "  bound: unique rows x 16 x 4, pull + push" \
  "$(col tally 5 | xargs printf %.0f)" "-" "$(ratio "$(col tally 4)" "$(col tally 5)")"
printf "%-44s %14s %14s\n" "bytes a rank wrote a step (all-reduces)" "-" "$(col torch 4 | xargs printf %.0f)"
printf "%-44s %14s %14s\n" "peak RSS, MiB: coordinator" "$(mib "$(col tally 6)")" "-"
printf "%-44s %14s %14s\n" "  shards (Tally) / ranks (DDP)" \
  "$(mib "$(col tally 7)"), $(mib "$(col tally 8)")" "$(mib "$(col torch 5)"), $(mib "$(col torch 6)")"
printf "%-44s %14s %14s\n" "  workers" "$(mib "$(col tally 9)"), $(mib "$(col tally 10)")" "-"
