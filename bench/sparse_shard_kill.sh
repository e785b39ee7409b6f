#!/usr/bin/env bash
# A lost shard under a sparse job: the DLRM of examples/dlrm (26 hashed
# tables on Adagrad, two Python workers, training.shards: 2) on a
# coordinator that checkpoints (--noshard --state_dir,
# --checkpoint_interval_s=2) and two shard processes that write their
# tables' files (--table_dir). One undisturbed run, then RUNS runs (default
# 10) on the same cluster, each killing the second shard with SIGKILL at a
# step spread evenly from 30% to 75% of the job's steps and starting it
# again on its port DELAY seconds later (default 3). The job rolls back to
# its last checkpoint and goes on.
# Per run: the step the kill came at, the job's outcome, and its test AUC
# against the undisturbed run's (bit for bit: the tables come back from
# the shards' files, and every batch is a function of the seed, the epoch,
# the rank and the step); then "N of RUNS succeeded", a run succeeding
# when its job SUCCEEDED with the undisturbed AUC exactly. STEPS (default
# 0: the example's whole epoch, 512 steps a worker) caps the job.
#   bench/sparse_shard_kill.sh [RUNS] [STEPS] [DELAY]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
steps=${2:-0}
delay=${3:-3}
. bench/lib.sh
python_bench

port=7480
coord=localhost:$port
cp examples/dlrm/model.py "$tmp/model.py"
training="workers: 2, shards: 2"
((steps > 0)) && training+=", max_steps: $steps"
sed -e "s/workers: 2}/$training}/" examples/dlrm/job.yaml > "$tmp/job.yaml"
grep -q "shards: 2" "$tmp/job.yaml" ||
  { echo "examples/dlrm/job.yaml changed: fix bench/sparse_shard_kill.sh" >&2; exit 1; }

$B/server/tally-server --port=$port --noshard --state_dir="$tmp/state" \
  --checkpoint_interval_s=2 > "$tmp/server.log" 2>&1 &
pids=($!)
declare -A shard_pid
start_shard() {  # I: shard I on port + I (again: the same port)
  $B/server/tally-server --port=$((port + $1)) --coordinator=$coord \
    --advertise=127.0.0.1:$((port + $1)) --table_dir="$tmp/tables" \
    >> "$tmp/shard$1.log" 2>&1 &
  shard_pid[$1]=$!
  pids+=($!)
}
start_shard 1
start_shard 2
for i in 1 2; do
  OMP_NUM_THREADS=1 $PY -m tally.worker --server=$coord --devices=cpu:1 \
    --name="w$i" --quiet > "$tmp/worker$i.log" 2>&1 &
  pids+=($!)
done

submit() { $PY -m tally submit "$tmp/job.yaml" --server=$coord | head -1; }

# The job's steps (a worker's), once it has them.
total_steps() {  # ID
  $PY - "$coord" "$1" <<'PYEOF'
import sys, time, tally
c = tally.Client(sys.argv[1])
while not c.status(sys.argv[2]).metrics.total_steps:
    time.sleep(0.1)
print(c.status(sys.argv[2]).metrics.total_steps)
PYEOF
}

# The job's step once it is at STEP or past it; -1 if it ended first.
at_step() {  # ID STEP
  $PY - "$coord" "$1" "$2" <<'PYEOF'
import sys, time, tally
from tally import tally_pb2 as pb
c = tally.Client(sys.argv[1])
while True:
    j = c.status(sys.argv[2])
    if j.state != pb.RUNNING and j.state != pb.PENDING:
        print(-1)
        break
    if j.state == pb.RUNNING and j.metrics.step >= int(sys.argv[3]):
        print(j.metrics.step)
        break
    time.sleep(0.02)
PYEOF
}

# "STATE AUC MESSAGE" once the job has ended (the AUC as Python's repr:
# equal strings are equal doubles).
outcome() {  # ID
  $PY - "$coord" "$1" <<'PYEOF'
import sys, tally
from tally import tally_pb2 as pb
j = tally.Client(sys.argv[1]).wait(sys.argv[2], timeout=3600, poll=0.2)
print(pb.JobState.Name(j.state), repr(j.metrics.test_auc),
      " ".join(j.message.split())[:300] or "-")
PYEOF
}

calm=$(submit)
read -r state calm_auc message <<< "$(outcome "$calm")"
[[ $state == SUCCEEDED ]] ||
  { echo "the undisturbed run $state: $message" >&2; exit 1; }
total=$(total_steps "$calm")
echo "undisturbed: $total steps, AUC $calm_auc"

ok=0
for ((r = 0; r < runs; r++)); do
  kill_at=$(awk -v r="$r" -v n="$runs" -v t="$total" \
    'BEGIN {f = n > 1 ? 0.30 + 0.45 * r / (n - 1) : 0.30; printf "%d", f * t}')
  id=$(submit)
  step=$(at_step "$id" "$kill_at")
  if ((step >= 0)); then
    kill -9 "${shard_pid[2]}"
    wait "${shard_pid[2]}" 2>/dev/null || true
    sleep "$delay"
    start_shard 2
  fi
  read -r state auc message <<< "$(outcome "$id")"
  verdict=differs
  [[ $auc == "$calm_auc" ]] && verdict=equal
  [[ $state == SUCCEEDED && $verdict == equal ]] && ok=$((ok + 1))
  where="killed at step $step of $total"
  ((step >= 0)) || where="ended before step $kill_at (not killed)"
  echo "run $((r + 1)): $id $where: $state, AUC $auc, undisturbed $calm_auc: $verdict"
  [[ $state == SUCCEEDED ]] || echo "  $message"
done
echo "$ok of $runs succeeded"
