#!/usr/bin/env bash
# Kill anything, lose nothing? The MLP example (examples/fashion-mnist-mlp.yaml,
# EPOCHS epochs, default 12, two workers, training.shards: 3) on a loopback
# cluster: a coordinator that checkpoints (--noshard --state_dir,
# --checkpoint_interval_s=2), three shard processes and three tally-worker
# daemons (two for the job and a spare). One undisturbed run, fetched; then
# one run under a kill loop: every EVERY seconds (default 4) SIGKILL to a
# random live shard or worker, and a new process in its place DELAY seconds
# later (default 2), except the first worker killed, which stays down for
# good (KEEP_DOWN=0: every victim comes back; SPARES=0: no third worker).
# Prints each kill (victim, the job's step, and the stall: from the kill
# until the job is past the step it was at for good, any roll-back
# included, read from a trace of the job's step every 20 ms), the stalls'
# p50 / p99 / max, the job's outcome, and
# whether its fetched weights equal the undisturbed run's byte for byte
# (the tensors; else the largest difference and the tensor it is in).
# RANKS=4: the job has fixed ranks (training.ranks: 4 on its two workers,
# docs/cluster.md "Ranks that outlive workers"); its global batch is then
# 4 x 64, its learning rate the example's. REPLICAS=2: each range has a
# backup (training.replicas: 2, docs/cluster.md "Replicated ranges") and
# the job one range (shards: 1, which the MLP's size gives anyway): a
# primary's loss is taken over by its backup, the third shard is the spare
# a new backup is seeded on.
#   bench/chaos.sh [EPOCHS] [EVERY] [DELAY]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-12}
every=${2:-4}
delay=${3:-2}
keep_down=${KEEP_DOWN:-1}
spares=${SPARES:-1}
. bench/lib.sh
python_bench  # B, PY, tmp, pids
# Restarted processes are not in pids (a subshell starts them): their pid
# files are.
trap 'for f in "$tmp"/pid.*; do kill "$(cat "$f")" 2> /dev/null || true; done
      python_bench_cleanup' EXIT

port=7520
coord=127.0.0.1:$port
tally() { $B/client/tally --server=$coord "$@"; }
sed -e "s/epochs: 2/epochs: $epochs/" -e "s/^  workers: 2 /  workers: 2\n  shards: 3 /" \
  examples/fashion-mnist-mlp.yaml > "$tmp/job.yaml"
grep -q "shards: 3" "$tmp/job.yaml" ||
  { echo "examples/fashion-mnist-mlp.yaml changed: fix bench/chaos.sh" >&2; exit 1; }
[[ -n ${RANKS:-} ]] && sed -i "s/^  shards: 3 /  shards: 3\n  ranks: $RANKS /" "$tmp/job.yaml"
[[ -n ${REPLICAS:-} ]] && sed -i "s/^  shards: 3/  shards: 1\n  replicas: $REPLICAS/" "$tmp/job.yaml"
echo "job: $(grep -E '^  (workers|shards|ranks|replicas):' "$tmp/job.yaml" | awk '{printf "%s %s  ", $1, $2}')"


# Every process a name, its pid in $tmp/pid.NAME (a restart writes it anew).
start() {  # NAME
  local name=$1
  case $name in
    shard*)
      local p=$((port + ${name#shard}))
      $B/server/tally-server --listen=127.0.0.1 --port=$p --coordinator=$coord \
        --advertise=127.0.0.1:$p >> "$tmp/$name.log" 2>&1 & ;;
    worker*)
      OMP_NUM_THREADS=1 $B/worker/tally-worker --server=$coord --devices=cpu:1 \
        --name="$name" --health_port=-1 >> "$tmp/$name.log" 2>&1 & ;;
  esac
  echo $! > "$tmp/pid.$name"
  pids+=($!)
}
alive() { kill -0 "$(cat "$tmp/pid.$1")" 2>/dev/null; }

$B/server/tally-server --listen=127.0.0.1 --port=$port --noshard \
  --state_dir="$tmp/state" --checkpoint_interval_s=2 > "$tmp/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do tally health > /dev/null 2>&1 && break; sleep 0.05; done
names=(shard1 shard2 shard3 worker1 worker2)
((spares > 0)) && names+=(worker3)
for n in "${names[@]}"; do start "$n"; done

step_of() {  # ID -> "STATE STEP"
  tally status "$1" --json 2>/dev/null | $PY -c '
import json, sys
j = json.load(sys.stdin)
print(j.get("state", "?"), int(j.get("metrics", {}).get("step", 0)))' || echo "? 0"
}
ended() { [[ $1 == SUCCEEDED || $1 == FAILED || $1 == CANCELLED ]]; }
run_job() { tally submit "$tmp/job.yaml" | awk 'NR == 1'; }  # -> the job's id
wait_job() {  # ID OUT -> its end state, its weights in OUT
  local state step
  while read -r state step <<< "$(step_of "$1")"; ! ended "$state"; do sleep 0.2; done
  tally fetch "$1" "$2" > /dev/null
  echo "$state"
}

calm=$(run_job)
calm_state=$(wait_job "$calm" "$tmp/calm.safetensors")
[[ $calm_state == SUCCEEDED ]] || { echo "the undisturbed run $calm_state" >&2; exit 1; }
echo "undisturbed: $calm $calm_state"

id=$(run_job)
# The job's step every 20 ms: "TIME STEP" lines.
$PY - "$coord" "$id" > "$tmp/trace" <<'PYEOF' &
import sys, time, tally
from tally import tally_pb2 as pb
c = tally.Client(sys.argv[1])
while True:
    try:
        j = c.status(sys.argv[2])
    except tally.RpcError:
        time.sleep(0.02)
        continue
    print(f"{time.time():.3f} {j.metrics.step}", flush=True)
    if j.state not in (pb.PENDING, pb.RUNNING):
        break
    time.sleep(0.02)
PYEOF
tracer=$!
: > "$tmp/kills"
down=""
kills=0
restarts=()

start_s=$(date +%s.%N)
while :; do
  sleep "$every"
  read -r state step <<< "$(step_of "$id")"
  ended "$state" && break
  live=()
  for n in "${names[@]}"; do [[ $n != "$down" ]] && alive "$n" && live+=("$n"); done
  ((${#live[@]})) || continue
  victim=${live[RANDOM % ${#live[@]}]}
  t0=$(date +%s.%N)
  kill -9 "$(cat "$tmp/pid.$victim")"
  kills=$((kills + 1))
  if [[ $keep_down == 1 && -z $down && $victim == worker* ]]; then
    down=$victim  # stays down for good
  else
    (sleep "$delay"; start "$victim") &
    restarts+=($!)
  fi
  echo "$t0 $step $victim" >> "$tmp/kills"
  note=""
  [[ $victim == "$down" ]] && note=" (stays down)"
  echo "kill $kills: $victim$note at step $step"
done
((${#restarts[@]})) && wait "${restarts[@]}"  # the restarts in flight
state=$(wait_job "$id" "$tmp/chaos.safetensors")
wait "$tracer" || true
# Each kill's stall: from the kill to the last moment the job's step was
# at or below the step it was killed at, before the next kill.
$PY - "$tmp/kills" "$tmp/trace" > "$tmp/stalls" <<'PYEOF'
import sys
kills = [(float(t), int(s)) for t, s, _ in (l.split() for l in open(sys.argv[1]))]
trace = [(float(t), int(s)) for t, s in (l.split() for l in open(sys.argv[2]))]
for i, (t0, s0) in enumerate(kills):
    t1 = kills[i + 1][0] if i + 1 < len(kills) else float("inf")
    last = max((t for t, s in trace if t0 <= t < t1 and s <= s0), default=t0)
    after = [t for t, s in trace if t > last and s > s0]
    print(f"{(after[0] if after else last) - t0:.2f}")
PYEOF
paste -d' ' "$tmp/kills" "$tmp/stalls" | awk '{printf "  stall after kill %d (%s at step %s): %s s\n", NR, $3, $2, $4}' 
took=$(awk -v a="$start_s" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')
q() { sort -g "$tmp/stalls" | awk -v q="$1" '{a[NR]=$1} END {if (NR) {i=int(q*NR+0.999); if (i<1) i=1; print a[i]} else print "-"}'; }
echo "chaos: $id $state after $kills kills in $took s; stall p50 $(q 0.5) s, p99 $(q 0.99) s, max $(q 1.0) s"
# The tensors' bytes (the files' headers name their jobs, so the files
# themselves always differ).
$PY - "$tmp/calm.safetensors" "$tmp/chaos.safetensors" <<'PYEOF'
import sys
import tally
a, b = (tally.load_state_dict(p) for p in sys.argv[1:3])
assert a.keys() == b.keys(), "the two files hold different tensors"
same = all(a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)
if same:
    print(f"weights: {len(a)} tensors byte-identical to the undisturbed run's")
else:
    worst = max(((k, (a[k].double() - b[k].double()).abs().max().item()) for k in a),
                key=lambda kv: kv[1])
    print(f"weights: differ, max |delta| {worst[1]:.6g} in {worst[0]}")
PYEOF
