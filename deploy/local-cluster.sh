#!/usr/bin/env bash
# The main job: a local Tally cluster on this machine. Installs and builds
# Tally, starts tally-server and two tally-worker daemons (cpu:1 each) on
# localhost, submits a job (default: the Fashion-MNIST MLP), watches it to the
# end, prints the final test accuracy, fetches the weights to out/, and stops
# everything, also on Ctrl-C. With --shards=N (N > 1) the coordinator holds
# no parameters and N shard processes (ports PORT+1 ...) split the job's
# between them (the spec gets `training.shards: N`). Every process speaks
# mTLS and the server checks bearer tokens: deploy/make-certs.sh makes the
# CA, certificate and tokens in out/certs the first time (the client below
# acts as the admin; give a colleague alice.token, a submitter's). While it
# runs, the dashboard is at http://127.0.0.1:PORT+1010/ (8080 by default)
# and the coordinator's metrics at http://127.0.0.1:PORT+2030/metrics (9100).
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
certs=out/certs
[[ -f $certs/tokens.txt ]] || deploy/make-certs.sh "$certs"
tls=(--tls_ca="$certs/ca.pem" --tls_cert="$certs/node.pem" --tls_key="$certs/node.key")
server_auth=("${tls[@]}" --tokens="$certs/tokens.txt" --token_file="$certs/admin.token")
tally() { $bin/client/tally --server="localhost:$port" "${tls[@]}" --token_file="$certs/admin.token" "$@"; }
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
$bin/server/tally-server "${server_auth[@]}" --port="$port" "${server_flags[@]}" \
  --http_port=$((port + 1010)) --metrics_port=$((port + 2030)) > out/logs/server.log 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  tally health >/dev/null 2>&1 && break
  sleep 0.1
done
if ((shards > 1)); then
  for i in $(seq "$shards"); do
    $bin/server/tally-server "${server_auth[@]}" --port=$((port + i)) --coordinator="localhost:$port" \
      --advertise="localhost:$((port + i))" > "out/logs/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 50); do
    (($(tally shards | grep -c " live ") == shards)) && break
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
  $bin/worker/tally-worker --server="localhost:$port" "${tls[@]}" --token_file="$certs/worker.token" --devices=cpu:1 --name="worker$i" \
    > "out/logs/worker$i.log" 2>&1 &
  pids+=($!)
done
submitted=$(tally submit "$job")
id=${submitted%%$'\n'*}
echo "submitted $id ($job); logs in out/logs/"
echo "dashboard: http://127.0.0.1:$((port + 1010))/#/job/$id   metrics: http://127.0.0.1:$((port + 2030))/metrics"
((shards > 1)) && tally shards
status=0
tally watch "$id" || status=$?
name=$(basename "$job" .yaml)
tally status "$id" --json > "out/$name.json"
tally fetch "$id" --output="out/$name.safetensors"
exit $status
