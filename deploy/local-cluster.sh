#!/usr/bin/env bash
# The main job: a local Tally cluster on this machine. Installs and builds
# Tally, starts tally-server and two tally-worker daemons (cpu:1 each) on
# localhost, submits a job (default: the Fashion-MNIST MLP), watches it to the
# end, prints the final test accuracy, fetches the weights to out/, and stops
# everything, also on Ctrl-C.
#   deploy/local-cluster.sh [JOB_SPEC] [--port=7070] [--workers=2]
set -euo pipefail
cd "$(dirname "$0")/.."
job=examples/fashion-mnist-mlp.yaml
port=7070
workers=2
for arg in "$@"; do
  case $arg in
    --port=*) port=${arg#--port=} ;;
    --workers=*) workers=${arg#--workers=} ;;
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

$bin/server/tally-server --port="$port" > out/logs/server.log 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  $bin/client/tally --server="localhost:$port" health >/dev/null 2>&1 && break
  sleep 0.1
done
for i in $(seq "$workers"); do
  $bin/worker/tally-worker --server="localhost:$port" --devices=cpu:1 --name="worker$i" \
    > "out/logs/worker$i.log" 2>&1 &
  pids+=($!)
done
submitted=$($bin/client/tally --server="localhost:$port" submit "$job")
id=${submitted%%$'\n'*}
echo "submitted $id ($job); logs in out/logs/"
status=0
$bin/client/tally --server="localhost:$port" watch "$id" || status=$?
name=$(basename "$job" .yaml)
$bin/client/tally --server="localhost:$port" status "$id" --json > "out/$name.json"
$bin/client/tally --server="localhost:$port" fetch "$id" --output="out/$name.safetensors"
exit $status
