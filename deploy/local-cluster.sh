#!/usr/bin/env bash
# The main job: a local Tally cluster on this machine. Installs and builds
# Tally, starts tally-server and two tally-worker daemons (cpu:1 each) on
# localhost, submits a job (default: the Fashion-MNIST MLP), watches it to the
# end, prints the final test accuracy, fetches the weights to out/, and stops
# everything, also on Ctrl-C. With --shards=N (N > 1) the coordinator holds
# no parameters and N shard processes (ports PORT+1 ...) split the job's
# between them (the spec gets `training.shards: N`).
#   deploy/local-cluster.sh [JOB_SPEC] [--port=7070] [--workers=2] [--shards=1]
set -euo pipefail
cd "$(dirname "$0")/.."
job=examples/fashion-mnist-mlp.yaml
port=7070
workers=2
shards=1
for arg in "$@"; do
  case $arg in
    --port=*) port=${arg#--port=} ;;
    --workers=*) workers=${arg#--workers=} ;;
    --shards=*) shards=${arg#--shards=} ;;
    *) job=$arg ;;
  esac
done
deploy/build.sh
bin=build
mkdir -p out/logs
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo "interrupted: stopping the cluster" >&2; exit 130' INT TERM

server_flags=()
((shards > 1)) && server_flags+=(--noshard)
$bin/server/tally-server --port="$port" "${server_flags[@]}" > out/logs/server.log 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  $bin/client/tally --server="localhost:$port" health >/dev/null 2>&1 && break
  sleep 0.1
done
if ((shards > 1)); then
  for i in $(seq "$shards"); do
    $bin/server/tally-server --port=$((port + i)) --coordinator="localhost:$port" \
      --advertise="localhost:$((port + i))" > "out/logs/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 50); do
    (($($bin/client/tally --server="localhost:$port" shards | grep -c " live ") == shards)) && break
    sleep 0.1
  done
  # Split the job over all of them (a small model would stay on one).
  spec=out/logs/$(basename "$job")
  sed -e "s/^training:\$/training:\n  shards: $shards/" \
      -e "s/^training: {\(.*\)}/training: {\1, shards: $shards}/" "$job" > "$spec"
  grep -q "shards: $shards" "$spec" || { echo "cannot add training.shards to $job" >&2; exit 2; }
  job=$spec
fi
for i in $(seq "$workers"); do
  $bin/worker/tally-worker --server="localhost:$port" --devices=cpu:1 --name="worker$i" \
    > "out/logs/worker$i.log" 2>&1 &
  pids+=($!)
done
submitted=$($bin/client/tally --server="localhost:$port" submit "$job")
id=${submitted%%$'\n'*}
echo "submitted $id ($job); logs in out/logs/"
((shards > 1)) && $bin/client/tally --server="localhost:$port" shards
status=0
$bin/client/tally --server="localhost:$port" watch "$id" || status=$?
name=$(basename "$job" .yaml)
$bin/client/tally --server="localhost:$port" status "$id" --json > "out/$name.json"
$bin/client/tally --server="localhost:$port" fetch "$id" --output="out/$name.safetensors"
exit $status
