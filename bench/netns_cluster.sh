#!/usr/bin/env bash
# The MLP and CNN examples on two tally-worker daemons against DDP-gloo,
# each process on a network host of its own: namespaces joined by veth
# pairs to a bridge, plain TCP, so nothing is shared between a worker and
# its shard but the network (every process still shares this machine's
# cores).
#   tally   tally-server (coordinator and its shard) on host srv, one
#           tally-worker (cpu:1) on each of hosts w1 and w2; a warm-up job
#           of 4 steps first, so that both daemons have loaded the data and
#           the timed job starts with both ready;
#   ddp     bench/pytorch_ddp.py rank 0 on w1, rank 1 on w2
#           (GLOO_SOCKET_IFNAME=eth0, one rank per namespace), timed after
#           a barrier that follows loading.
# One epoch of Fashion-MNIST, batch 64 per worker, SGD(lr 0.02, momentum
# 0.9), one thread per process, alternating runs, REPEATS of each (default
# 3), medians. Tally's samples/s are the job's mean over its training. With
# RATE (e.g. 1gbit) every host's link is held to it by tbf.
# Needs root and iproute2.
#   bench/netns_cluster.sh [REPEATS]     ROWS="mlp cnn" (the default)
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
B=$PWD/build
PY=/usr/bin/python3
[[ -x $B/worker/tally-worker ]] || { echo "build first: deploy/build.sh" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
. bench/lib.sh
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
three_hosts nc$$ "${RATE:-}"

tally_run() {  # spec -> samples/s test_accuracy
  local server=${addrs[0]}:7480 i out id
  on "${hosts[0]}" "$B/server/tally-server" --listen=0.0.0.0 --port=7480 --insecure \
    > "$tmp/server.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    on "${hosts[0]}" "$B/client/tally" --server="$server" health > /dev/null 2>&1 && break
    sleep 0.1
  done
  for i in 1 2; do
    on "${hosts[$i]}" "$B/worker/tally-worker" --server="$server" --devices=cpu:1 --quiet \
      --health_port=-1 > "$tmp/w$i.log" 2>&1 &
    pids+=($!)
  done
  sed -e 's/^training:/training:\n  max_steps: 4/' "$1" > "$tmp/warmup.yaml"
  out=$(on "${hosts[0]}" "$B/client/tally" --server="$server" submit "$tmp/warmup.yaml" --wait) ||
    { echo "warm-up job failed: $out" >&2; exit 1; }
  out=$(on "${hosts[0]}" "$B/client/tally" --server="$server" submit "$1" --wait) ||
    { echo "job failed: $out" >&2; exit 1; }
  id=${out%%$'\n'*}
  on "${hosts[0]}" "$B/client/tally" --server="$server" status "$id" --json |
    $PY -c "import json,sys; m=json.load(sys.stdin)['metrics']; print(m['mean_samples_per_sec'], m['test_accuracy'])"
  stop_pids
}

ddp_run() {  # model -> samples/s test_accuracy
  local port=$((29600 + RANDOM % 1000))
  on "${hosts[2]}" env GLOO_SOCKET_IFNAME=eth0 $PY bench/pytorch_ddp.py --model="$1" \
    --procs=2 --rank=1 --master="${addrs[1]}" --port=$port > /dev/null 2> "$tmp/ddp1.log" &
  pids+=($!)
  on "${hosts[1]}" env GLOO_SOCKET_IFNAME=eth0 $PY bench/pytorch_ddp.py --model="$1" \
    --procs=2 --rank=0 --master="${addrs[1]}" --port=$port 2> "$tmp/ddp0.log" |
    $PY -c "import json,sys; r=json.load(sys.stdin); print(r['samples_per_sec'], r['test_accuracy'])"
  stop_pids
}

printf "%-6s %12s %12s %8s %10s %10s   %s\n" model tally_sps ddp_sps ratio tally_acc ddp_acc runs
for model in ${ROWS:-mlp cnn}; do
  sed -e 's/epochs: 2/epochs: 1/' "examples/fashion-mnist-$model.yaml" > "$tmp/$model.yaml"
  : > "$tmp/t"; : > "$tmp/d"
  for ((r = 0; r < repeats; r++)); do
    tally_run "$tmp/$model.yaml" > "$tmp/r"; read -r sps tacc < "$tmp/r"; echo "$sps" >> "$tmp/t"
    ddp_run "$model" > "$tmp/r"; read -r dps dacc < "$tmp/r"; echo "$dps" >> "$tmp/d"
  done
  t=$(median < "$tmp/t"); d=$(median < "$tmp/d")
  printf "%-6s %12.0f %12.0f %8.2f %10.4f %10.4f   Tally %s; DDP %s\n" "$model" "$t" "$d" \
    "$(ratio "$t" "$d")" "$tacc" "$dacc" "$(paste -sd' ' "$tmp/t")" "$(paste -sd' ' "$tmp/d")"
done
