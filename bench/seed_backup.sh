#!/usr/bin/env bash
# What seeding a new backup costs the job that goes on meanwhile. A
# loopback cluster (a coordinator with --noshard, three shard processes,
# two tally-workers) trains a job whose one range is large: a linear layer
# of PARAMS_SIDE x PARAMS_SIDE (default 2048: 4.2 M weights) with Adam, so
# the state a new backup is made from (weights and two slots) is 12 x
# SIDE^2 bytes. Two copies (the default): the range has a primary and a
# backup, and the third shard is the spare. Once the job trains, the
# backup's shard is killed; the spare gets a new backup, seeded from the
# primary while the job trains (docs/cluster.md, "Replicated ranges").
# Prints, from the job's events and a trace of its step every 20 ms: how
# long the seed took (from the event that the backup is seeded to the one
# that it caught up: the state crossing the coordinator twice, and the
# steps made meanwhile), the steps the job made during it, and the longest
# the job's step stood still from the kill until it caught up.
#   bench/seed_backup.sh [PARAMS_SIDE]
set -euo pipefail
cd "$(dirname "$0")/.."
side=${1:-2048}
. bench/lib.sh
python_bench  # B, PY, tmp, pids
port=7540
coord=127.0.0.1:$port
tally() { $B/client/tally --server=$coord "$@"; }
cat > "$tmp/job.yaml" <<EOF
name: seed-backup
model:
  layers:
    - linear: {in_features: $side, out_features: $side}
dataset: {name: synthetic, train_size: $((67108864 / side)), test_size: 256, features: $side, classes: $side, seed: 1}
training: {epochs: 1, batch_size: 16, seed: 1, workers: 2, shards: 1}
optimizer: {type: adam, lr: 0.001}
EOF

$B/server/tally-server --listen=127.0.0.1 --port=$port --noshard > "$tmp/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do tally health > /dev/null 2>&1 && break; sleep 0.05; done
declare -A pid_of
for i in 1 2 3; do
  $B/server/tally-server --listen=127.0.0.1 --port=$((port + i)) --coordinator=$coord \
    --advertise=127.0.0.1:$((port + i)) > "$tmp/shard$i.log" 2>&1 &
  pids+=($!)
  pid_of[127.0.0.1:$((port + i))]=$!
done
for i in 1 2; do
  OMP_NUM_THREADS=1 $B/worker/tally-worker --server=$coord --devices=cpu:1 --name="w$i" \
    --health_port=-1 > "$tmp/w$i.log" 2>&1 &
  pids+=($!)
done
id=$(tally submit "$tmp/job.yaml" | awk 'NR == 1')
echo "job $id: one range of $((side * side + side)) values, Adam: a state of $(( (side * side + side) * 12 / 1000000 )) MB"

# The job's step and events, as "TIME STEP" lines and a JSON line of the
# events at the end.
job_tracer "$tmp/tracer.py"
$PY "$tmp/tracer.py" "$coord" "$id" --events > "$tmp/trace" &
tracer=$!

step_of() {
  tally status "$id" --json 2> /dev/null |
    $PY -c 'import json, sys; print(int(json.load(sys.stdin).get("metrics", {}).get("step", 0)))' || echo 0
}
for _ in $(seq 600); do (( $(step_of) >= 30 )) && break; sleep 0.1; done
# The address of the live shard that holds the job's backup copy.
backup=$(tally shards | awk -v job="$id" '
  /^[^ ]/ { address = $2; live = $3 == "live" }
  live && $1 == job && index($0, "backup copy") { print address }' | head -n 1)
[[ -n ${pid_of[$backup]:-} ]] || { tally shards >&2; echo "no backup copy found" >&2; exit 1; }
kill_time=$(date +%s.%N)
kill -9 "${pid_of[$backup]}"
echo "killed the backup's shard ($backup) at step $(step_of)"
for _ in $(seq 1200); do
  tally report "$id" --output="$tmp/report.html" > /dev/null 2>&1 &&
    grep -q "caught up with its primary" "$tmp/report.html" && break
  sleep 0.1
done
sleep 1
tally cancel "$id" > /dev/null
wait "$tracer" || true
$PY - "$tmp/trace" "$kill_time" <<'PYEOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
events = json.loads(lines[-1])
trace = [(float(t), int(s)) for t, s in (l.split() for l in lines[:-1])]
kill = float(sys.argv[2])
seeded = next((t for t, x in events if "is seeded from its primary" in x and t >= kill - 1), None)
caught = next((t for t, x in events if "caught up with its primary" in x), None)
if seeded is None or caught is None:
    sys.exit("the seed's events are missing: " + "; ".join(x for _, x in events[-5:]))
steps = [s for t, s in trace if seeded <= t <= caught]
window = [(t, s) for t, s in trace if kill <= t <= caught]
still, since, last = 0.0, window[0][0], window[0][1]
for t, s in window:
    if s != last:
        still = max(still, t - since)
        since, last = t, s
still = max(still, caught - since)
print(f"seed: {caught - seeded:.2f} s from seeded to caught up; "
      f"the job made {max(steps) - min(steps) if steps else 0} steps meanwhile; "
      f"longest still from the kill until caught up: {still:.2f} s")
PYEOF
