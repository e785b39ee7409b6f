#!/usr/bin/env bash
# Tally between machines against PyTorch DDP-gloo and iperf3: every process
# on a network host of its own (namespaces joined by veth pairs to a
# bridge, plain TCP), so nothing is shared between a worker and a shard on
# another host but the network (every process still shares this machine's
# cores). Three tables, each from alternating runs in one go:
#
#   plain      no rate limit: tally-server (coordinator and its shard) on
#              host srv, one tally-worker (cpu:1) on each of hosts w1 and
#              w2; DDP-gloo rank 0 on w1, rank 1 on w2. With every process
#              on two cores, this measures what the TCP path costs in CPU.
#   colocated  every link held to RATE (default 1gbit) by tbf, the
#              coordinator alone on srv (--noshard) and a shard process on
#              each worker's host, the job split over both (training.shards:
#              2, as BytePS places its servers); DDP-gloo as above on the
#              same links. Beside the samples/s: Tally's step, and the floor
#              it is held to, compute + the bytes a host's link carries in
#              a step / RATE (each direction: its worker's push to the other
#              shard and its shard's answer to the other worker's pull, 4 N
#              bytes for a vector of N floats split in two).
#   replicas   (not in the default TABLES) the colocated cluster with no
#              rate limit, the job on one range (training.shards: 1),
#              alternating training.replicas: 1 and 2: with 2 the range's
#              backup is on the other worker's host, and each step's mean
#              (4 N bytes) goes from the primary to it before the version
#              is published (docs/cluster.md, "Replicated ranges").
#   pushpull   no rate limit, two hosts: tally-bench-shard-pushpull (the
#              worker's own parameter client: push step t, pull version
#              t + 1 with the commit) against tally-server on the other host,
#              a 67 MB model (one 4096 x 4096 linear layer), against one
#              iperf3 TCP stream between the same hosts.
#
# Tally: a warm-up job of 4 steps first, so that both daemons have loaded
# the data and the timed job starts with both ready; its samples/s are the
# job's mean over its training. DDP (bench/pytorch_ddp.py,
# GLOO_SOCKET_IFNAME=eth0, one rank per namespace) is timed after a barrier
# that follows loading. One epoch of Fashion-MNIST, batch 64 per worker,
# SGD(lr 0.02, momentum 0.9), one thread per process
# (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1), REPEATS rounds (default 3),
# medians. Needs root, iproute2 and iperf3.
#   bench/netns_cluster.sh [REPEATS]
#   TABLES="plain colocated pushpull" (the default; or replicas)  ROWS="mlp cnn"  RATE=1gbit
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
B=$PWD/build
PY=/usr/bin/python3
[[ -x $B/worker/tally-worker ]] || { echo "build first: deploy/build.sh" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "needs iperf3 (deploy/install-deps.sh --with-torch)" >&2; exit 1; }
. bench/lib.sh
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
rate=${RATE:-1gbit}
server=10.233.0.1:7480

wait_health() {  # the coordinator answers
  for _ in $(seq 100); do
    on "${hosts[0]}" "$B/client/tally" --server="$server" health > /dev/null 2>&1 && return
    sleep 0.1
  done
  echo "tally-server did not start" >&2; exit 1
}

# Starts the cluster of a table: the coordinator (with its shard for
# plain), then for colocated a shard on each worker host, then a worker on
# each.
start_cluster() {  # plain|colocated
  local i flags=()
  [[ $1 == colocated ]] && flags=(--noshard)
  on "${hosts[0]}" "$B/server/tally-server" --listen=0.0.0.0 --port=7480 --insecure \
    "${flags[@]}" > "$tmp/server.log" 2>&1 &
  pids+=($!)
  wait_health
  for i in 1 2; do
    if [[ $1 == colocated ]]; then
      on "${hosts[$i]}" "$B/server/tally-server" --listen=0.0.0.0 --port=7481 --insecure \
        --coordinator="$server" --advertise="${addrs[$i]}:7481" > "$tmp/shard$i.log" 2>&1 &
      pids+=($!)
    fi
    on "${hosts[$i]}" "$B/worker/tally-worker" --server="$server" --devices=cpu:1 --quiet \
      --health_port=-1 > "$tmp/w$i.log" 2>&1 &
    pids+=($!)
  done
}

# One timed Tally job: "samples/s test_accuracy step_seconds compute_seconds
# num_params".
tally_run() {  # spec plain|colocated
  local out id
  start_cluster "$2"
  sed -e 's/^training:/training:\n  max_steps: 4/' "$1" > "$tmp/warmup.yaml"
  out=$(on "${hosts[0]}" "$B/client/tally" --server="$server" submit "$tmp/warmup.yaml" --wait) ||
    { echo "warm-up job failed: $out" >&2; exit 1; }
  out=$(on "${hosts[0]}" "$B/client/tally" --server="$server" submit "$1" --wait) ||
    { echo "job failed: $out" >&2; exit 1; }
  id=${out%%$'\n'*}
  on "${hosts[0]}" "$B/client/tally" --server="$server" status "$id" --json | $PY -c "
import json, sys
j = json.load(sys.stdin); m = j['metrics']
steps = int(m['step'])
compute = sum(p['compute_seconds'] for p in m['progress']) / len(m['progress'])
print(m['mean_samples_per_sec'], m['test_accuracy'], m['train_seconds'] / steps, compute,
      j['num_params'])"
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

# Bits per second of a tc rate ("1gbit", "500mbit").
rate_bps() {
  $PY -c "
import re, sys
m = re.fullmatch(r'([0-9.]+)([kmg]?)bit', sys.argv[1].lower())
print(float(m.group(1)) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[m.group(2)])" "$1"
}

cluster_table() {  # plain|colocated
  local mode=$1 model r sps tacc step comp n dps dacc t d
  if [[ $mode == plain ]]; then
    echo "## plain: server + 2 workers on 3 hosts, no rate limit"
    printf "%-6s %10s %10s %7s %9s %9s   %s\n" model tally_sps ddp_sps ratio tally_acc ddp_acc runs
  else
    echo "## colocated: coordinator + a shard on each of 2 worker hosts, links at $rate"
    printf "%-6s %10s %10s %7s %9s %9s %8s %9s %8s   %s\n" model tally_sps ddp_sps ratio \
      tally_acc ddp_acc step_ms floor_ms step/flr runs
  fi
  for model in ${ROWS:-mlp cnn}; do
    sed -e 's/epochs: 2/epochs: 1/' "examples/fashion-mnist-$model.yaml" > "$tmp/$model.yaml"
    [[ $mode == colocated ]] && sed -i -e 's/^training:/training:\n  shards: 2/' "$tmp/$model.yaml"
    : > "$tmp/t"; : > "$tmp/d"; : > "$tmp/s"; : > "$tmp/c"
    for ((r = 0; r < repeats; r++)); do
      tally_run "$tmp/$model.yaml" "$mode" > "$tmp/r"
      read -r sps tacc step comp n < "$tmp/r"
      echo "$sps" >> "$tmp/t"; echo "$step" >> "$tmp/s"; echo "$comp" >> "$tmp/c"
      ddp_run "$model" > "$tmp/r"; read -r dps dacc < "$tmp/r"; echo "$dps" >> "$tmp/d"
    done
    t=$(median < "$tmp/t"); d=$(median < "$tmp/d")
    if [[ $mode == plain ]]; then
      printf "%-6s %10.0f %10.0f %7.2f %9.4f %9.4f   Tally %s; DDP %s\n" "$model" "$t" "$d" \
        "$(ratio "$t" "$d")" "$tacc" "$dacc" "$(paste -sd' ' "$tmp/t")" "$(paste -sd' ' "$tmp/d")"
    else
      local s c floor
      s=$(median < "$tmp/s"); c=$(median < "$tmp/c")
      floor=$(awk -v c="$c" -v n="$n" -v bps="$(rate_bps "$rate")" 'BEGIN {print c + 4 * n * 8 / bps}')
      printf "%-6s %10.0f %10.0f %7.2f %9.4f %9.4f %8.2f %9.2f %8.2f   Tally %s; DDP %s; compute ms %s\n" \
        "$model" "$t" "$d" "$(ratio "$t" "$d")" "$tacc" "$dacc" "$(awk -v s="$s" 'BEGIN {print s * 1e3}')" \
        "$(awk -v f="$floor" 'BEGIN {print f * 1e3}')" "$(ratio "$s" "$floor")" \
        "$(paste -sd' ' "$tmp/t")" "$(paste -sd' ' "$tmp/d")" "$(awk -v c="$c" 'BEGIN {print c * 1e3}')"
    fi
  done
}

replicas_table() {
  local model r sps tacc step comp n a b
  echo "## replicas: coordinator + a shard on each of 2 worker hosts, no rate limit, one range"
  printf "%-6s %10s %10s %7s %13s   %s\n" model r1_sps r2_sps r2/r1 mean_MB/step runs
  for model in ${ROWS:-mlp cnn}; do
    sed -e 's/epochs: 2/epochs: 1/' -e 's/^training:/training:\n  shards: 1/' \
      "examples/fashion-mnist-$model.yaml" > "$tmp/$model-r2.yaml"
    # Two copies are the default: one is asked for.
    sed -e 's/^training:/training:\n  replicas: 1/' "$tmp/$model-r2.yaml" > "$tmp/$model-r1.yaml"
    : > "$tmp/r1"; : > "$tmp/r2"
    for ((r = 0; r < repeats; r++)); do
      tally_run "$tmp/$model-r1.yaml" colocated > "$tmp/r"
      read -r sps tacc step comp n < "$tmp/r"; echo "$sps" >> "$tmp/r1"
      tally_run "$tmp/$model-r2.yaml" colocated > "$tmp/r"
      read -r sps tacc step comp n < "$tmp/r"; echo "$sps" >> "$tmp/r2"
    done
    a=$(median < "$tmp/r1"); b=$(median < "$tmp/r2")
    printf "%-6s %10.0f %10.0f %7.2f %13.3f   replicas 1: %s; replicas 2: %s\n" "$model" "$a" "$b" \
      "$(ratio "$b" "$a")" "$(awk -v n="$n" 'BEGIN {print 4 * n / 1e6}')" \
      "$(paste -sd' ' "$tmp/r1")" "$(paste -sd' ' "$tmp/r2")"
  done
}

pushpull_table() {
  local r port
  echo "## pushpull: 67 MB push + pull between 2 hosts, no rate limit"
  : > "$tmp/t"; : > "$tmp/i"
  for ((r = 0; r < repeats; r++)); do
    port=$((7490 + r))
    on "${hosts[0]}" "$B/server/tally-server" --listen=0.0.0.0 --port=$port --insecure \
      --lease_timeout_ms=600000 > "$tmp/server.log" 2>&1 &
    pids+=($!)
    server=10.233.0.1:$port wait_health
    on "${hosts[1]}" "$B/bench/tally-bench-shard-pushpull" --server="10.233.0.1:$port" --submit \
      --shards=1 --workers=1 --steps=11 > "$tmp/p.json"
    $PY -c "import json; print(json.load(open('$tmp/p.json'))['gb_per_sec'])" >> "$tmp/t"
    stop_pids
    on "${hosts[0]}" iperf3 -s -1 -p $((5301 + r)) > /dev/null 2>&1 &
    pids+=($!)
    sleep 0.5
    on "${hosts[1]}" iperf3 -c 10.233.0.1 -p $((5301 + r)) -t 3 -J > "$tmp/i.json"
    iperf_gbps "$tmp/i.json" >> "$tmp/i"
    stop_pids
  done
  local t i
  t=$(median < "$tmp/t"); i=$(median < "$tmp/i")
  printf "%-10s %10s %10s %7s   %s\n" path tally_GB/s iperf3_GB/s ratio runs
  printf "%-10s %10.3f %10.3f %7.2f   Tally %s; iperf3 %s\n" 67MB "$t" "$i" "$(ratio "$t" "$i")" \
    "$(paste -sd' ' "$tmp/t")" "$(paste -sd' ' "$tmp/i")"
}

for table in ${TABLES:-plain colocated pushpull}; do
  case $table in
    plain) three_hosts "n$$a" ""; cluster_table plain ;;
    colocated) three_hosts "n$$b" "$rate"; cluster_table colocated ;;
    pushpull) three_hosts "n$$c" ""; pushpull_table ;;
    replicas) three_hosts "n$$d" ""; replicas_table ;;
    *) echo "unknown table $table (plain, colocated, pushpull, replicas)" >&2; exit 2 ;;
  esac
  three_hosts_cleanup
  trap - EXIT
  echo
done
