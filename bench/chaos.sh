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
# a new backup is seeded on. NETNS=1: every process on a network host of
# its own (a namespace each, joined by veth pairs to a bridge: the
# coordinator, three shards, three workers), every one speaking mTLS with
# bearer tokens (certificates made for the hosts' addresses); a restarted
# process starts on its own host again. Needs root and iproute2.
# MODEL=resnet: the ResNet example (examples/resnet: BatchNorm buffers)
# for EPOCHS epochs, at most STEPS steps (default 300), on Python workers
# (python3 -m tally.worker), submitted with the Python client.
#   bench/chaos.sh [EPOCHS] [EVERY] [DELAY]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-12}
every=${2:-4}
delay=${3:-2}
keep_down=${KEEP_DOWN:-1}
spares=${SPARES:-1}
netns=${NETNS:-0}
model=${MODEL:-mlp}
steps=${STEPS:-300}
. bench/lib.sh
python_bench  # B, PY, tmp, pids
# Restarted processes are not in pids (a subshell starts them): their pid
# files are.
trap 'for f in "$tmp"/pid.*; do kill "$(cat "$f")" 2> /dev/null || true; done
      python_bench_cleanup
      for h in "${hosts[@]}"; do  # restarts in flight too
        for p in $(ip netns pids "$h" 2> /dev/null); do kill -9 "$p" 2> /dev/null || true; done
      done
      for h in "${hosts[@]}" "${hub:-}"; do
        if [[ -n $h ]]; then ip netns del "$h" 2> /dev/null || true; fi
      done' EXIT

port=7520
# Where each process runs: its address, and the command prefix that puts
# it on its host (NETNS=1; else every process is on 127.0.0.1).
hosts=()
addr_of() { echo 127.0.0.1; }
on_host() { :; }
auth=()         # a server's TLS and token flags
worker_auth=()  # a worker's
client_auth=()  # the tally client's (and the tracer's, as Python keywords)
if [[ $netns == 1 ]]; then
  [[ $(id -u) == 0 ]] || { echo "NETNS=1 needs root (network namespaces)" >&2; exit 1; }
  hub=chaos-hub-$$
  hosts=(chaos-coord-$$ chaos-shard1-$$ chaos-shard2-$$ chaos-shard3-$$
         chaos-worker1-$$ chaos-worker2-$$ chaos-worker3-$$)
  bridged_hosts "c$$" "$hub" "" "${hosts[@]}"  # 10.233.0.1 ...
  host_index() {  # NAME -> its host's index in hosts
    case $1 in
      coordinator) echo 0 ;;
      shard*) echo "${1#shard}" ;;
      worker*) echo $((3 + ${1#worker})) ;;
    esac
  }
  addr_of() { echo "10.233.0.$(($(host_index "$1") + 1))"; }
  on_host() { echo "ip netns exec ${hosts[$(host_index "$1")]}"; }
  deploy/make-certs.sh "$tmp/certs" $(for i in $(seq ${#hosts[@]}); do echo "10.233.0.$i"; done) > /dev/null
  c=$tmp/certs
  tls=(--tls_ca="$c/ca.pem" --tls_cert="$c/node.pem" --tls_key="$c/node.key")
  auth=("${tls[@]}" --tokens="$c/tokens.txt" --token_file="$c/admin.token")
  worker_auth=("${tls[@]}" --token_file="$c/worker.token")
  client_auth=("${tls[@]}" --token_file="$c/admin.token")
fi
coord=$(addr_of coordinator):$port
tally() { $(on_host coordinator) $B/client/tally "${client_auth[@]}" --server=$coord "$@"; }
if [[ $model == resnet ]]; then
  # One line of training settings: the example's, for two workers.
  cp examples/resnet/model.py "$tmp/"
  training="epochs: $epochs, max_steps: $steps, batch_size: 64, seed: 1, workers: 2, shards: 3"
  [[ -n ${RANKS:-} ]] && training+=", ranks: $RANKS"
  [[ -n ${REPLICAS:-} ]] && training=${training/shards: 3/shards: 1, replicas: $REPLICAS}
  sed -e "s/^training: .*/training: {$training}/" examples/resnet/job.yaml > "$tmp/job.yaml"
  grep -q "max_steps: $steps" "$tmp/job.yaml" ||
    { echo "examples/resnet/job.yaml changed: fix bench/chaos.sh" >&2; exit 1; }
  echo "job: resnet, $training"
else
  sed -e "s/epochs: 2/epochs: $epochs/" -e "s/^  workers: 2 /  workers: 2\n  shards: 3 /" \
    examples/fashion-mnist-mlp.yaml > "$tmp/job.yaml"
  grep -q "shards: 3" "$tmp/job.yaml" ||
    { echo "examples/fashion-mnist-mlp.yaml changed: fix bench/chaos.sh" >&2; exit 1; }
  [[ -n ${RANKS:-} ]] && sed -i "s/^  shards: 3 /  shards: 3\n  ranks: $RANKS /" "$tmp/job.yaml"
  [[ -n ${REPLICAS:-} ]] && sed -i "s/^  shards: 3/  shards: 1\n  replicas: $REPLICAS/" "$tmp/job.yaml"
  echo "job: $(grep -E '^  (workers|shards|ranks|replicas):' "$tmp/job.yaml" | awk '{printf "%s %s  ", $1, $2}')"
fi


# Every process a name, its pid in $tmp/pid.NAME (a restart writes it anew).
start() {  # NAME
  local name=$1
  case $name in
    shard*)
      local p=$((port + ${name#shard})) a
      a=$(addr_of "$name")
      $(on_host "$name") $B/server/tally-server "${auth[@]}" --listen="$a" --port=$p \
        --coordinator=$coord --advertise="$a:$p" >> "$tmp/$name.log" 2>&1 & ;;
    worker*)
      if [[ $model == resnet ]]; then
        OMP_NUM_THREADS=1 $(on_host "$name") $PY -m tally.worker "${worker_auth[@]}" \
          --server=$coord --devices=cpu:1 --name="$name" --quiet >> "$tmp/$name.log" 2>&1 &
      else
        OMP_NUM_THREADS=1 $(on_host "$name") $B/worker/tally-worker "${worker_auth[@]}" \
          --server=$coord --devices=cpu:1 --name="$name" --health_port=-1 >> "$tmp/$name.log" 2>&1 &
      fi ;;
  esac
  echo $! > "$tmp/pid.$name"
  pids+=($!)
}
alive() { kill -0 "$(cat "$tmp/pid.$1")" 2>/dev/null; }

$(on_host coordinator) $B/server/tally-server "${auth[@]}" --listen="$(addr_of coordinator)" \
  --port=$port --noshard --state_dir="$tmp/state" --checkpoint_interval_s=2 > "$tmp/coordinator.log" 2>&1 &
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
run_job() {  # -> the job's id
  if [[ $model == resnet ]]; then
    # The Python client sends the model's code and finds its layout.
    $(on_host coordinator) $PY -m tally "${client_auth[@]}" --server=$coord submit "$tmp/job.yaml" | awk 'NR == 1'
  else
    tally submit "$tmp/job.yaml" | awk 'NR == 1'
  fi
}
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
tls_keywords=()
[[ $netns == 1 ]] && tls_keywords=("$c/ca.pem" "$c/node.pem" "$c/node.key" "$c/admin.token")
job_tracer "$tmp/tracer.py"
$(on_host coordinator) $PY "$tmp/tracer.py" "$coord" "$id" "${tls_keywords[@]}" > "$tmp/trace" &
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
