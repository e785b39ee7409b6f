#!/usr/bin/env bash
# Push + pull throughput of one job split over 1, 2 and 4 shard processes,
# where every process has a network host of its own whose link is held to
# RATE (default 1gbit). Nine hosts (Linux network namespaces) hang off one
# Linux bridge: the coordinator (tally-server --noshard), four shard hosts
# and four worker hosts; each host's link is shaped by a token-bucket filter
# on both of its ends (the host's side: what it sends; the bridge's side:
# what it receives), so a host moves at most RATE each way, as on a switch.
#
# For k = 1, 2, 4: the coordinator and k shards start fresh, four
# tally-bench-shard-pushpull clients (one per worker host) train one job of
# four workers on exactly k shards (a 4096 x 4096 linear layer, 67 MB), and
# the figure is the sum of their push + pull GB/s (float32 model bytes).
# iperf3 measures the same topology: four TCP streams at once, worker host
# w to shard host w % k, summed. Medians of REPEATS (default 1) runs.
# With four workers, one shard's link carries every worker's bytes, so the
# ideal is k x RATE up to the workers' own 4 x RATE.
# Needs root, iproute2 (ip, tc), iperf3, python3, and a build in build/.
#   bench/shard_scaling.sh [REPEATS] [RATE]
# Steps per run (the first is warm-up): STEPS_1, STEPS_2, STEPS_4 in the
# environment (defaults 4, 6, 8: about 15-20 s of transfers each at 1gbit).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-1}
rate=${2:-1gbit}
declare -A steps=([1]=${STEPS_1:-4} [2]=${STEPS_2:-6} [4]=${STEPS_4:-8})
B=$(pwd)/build
tag=c$$
bridge=tally-sbr-$tag
coord_ip=10.233.0.1
shard_ips=(10.233.0.11 10.233.0.12 10.233.0.13 10.233.0.14)
worker_ips=(10.233.0.21 10.233.0.22 10.233.0.23 10.233.0.24)
# Host i: its namespace and address (0: the coordinator, 1-4: shards,
# 5-8: workers).
hosts=("tally-scoord-$tag")
addrs=("$coord_ip" "${shard_ips[@]}" "${worker_ips[@]}")
for i in 0 1 2 3; do hosts+=("tally-sshard$i-$tag"); done
for i in 0 1 2 3; do hosts+=("tally-sworker$i-$tag"); done
coord=${hosts[0]}
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
command -v iperf3 > /dev/null || { echo "needs iperf3 (deploy/install-deps.sh --with-torch)" >&2; exit 1; }
for b in server/tally-server client/tally bench/tally-bench-shard-pushpull; do
  [[ -x $B/$b ]] || { echo "missing $B/$b: build first" >&2; exit 1; }
done
tmp=$(mktemp -d)
pids=()
# Stops what this script started and waits for it. SIGTERM first: a
# `timeout` passes it on to the program it runs, which SIGKILL would orphan;
# then SIGKILL, so the wait is bounded.
stop_all() {
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2> /dev/null || true; done
  sleep 0.3
  for p in ${pids[@]+"${pids[@]}"}; do kill -9 "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  pids=()
}
cleanup() {
  stop_all
  for h in "${hosts[@]}" "$bridge"; do ip netns del "$h" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
. bench/lib.sh  # median, ratio, iperf_gbps

fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log; do [[ -e $f ]] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
  exit 1
}
in_host() { local h=$1; shift; ip netns exec "$h" "$@"; }  # foreground only
tally() { in_host "$coord" "$B/client/tally" --server="$coord_ip:7070" "$@"; }

# The topology: a bridge in its own namespace, one veth pair per host.
ip netns add "$bridge"
ip -n "$bridge" link add name br0 type bridge
ip -n "$bridge" link set br0 up
for i in "${!hosts[@]}"; do
  h=${hosts[$i]}
  ip netns add "$h"
  # Made in the bridge's namespace, one end straight into the host's:
  # nothing touches the root namespace.
  ip -n "$bridge" link add "p$i-$tag" type veth peer name "h$i-$tag" netns "$h"
  ip -n "$bridge" link set "p$i-$tag" master br0
  ip -n "$bridge" link set "p$i-$tag" up
  ip -n "$h" addr add "${addrs[$i]}/24" dev "h$i-$tag"
  ip -n "$h" link set "h$i-$tag" up
  ip -n "$h" link set lo up
  tc -n "$h" qdisc add dev "h$i-$tag" root tbf rate "$rate" burst 256kb latency 50ms
  tc -n "$bridge" qdisc add dev "p$i-$tag" root tbf rate "$rate" burst 256kb latency 50ms
done

run_tally() {  # k -> appends the aggregate GB/s to $tmp/tally-k
  local k=$1 i
  ip netns exec "$coord" "$B/server/tally-server" --insecure --listen=$coord_ip --port=7070 --noshard \
    --lease_timeout_ms=600000 > "$tmp/coordinator.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do tally health > /dev/null 2>&1 && break; sleep 0.1; done
  tally health > /dev/null 2>&1 || fail "the coordinator did not come up"
  for ((i = 0; i < k; i++)); do
    ip netns exec "${hosts[$((1 + i))]}" "$B/server/tally-server" --insecure --listen="${shard_ips[$i]}" \
      --port=7071 --coordinator=$coord_ip:7070 --advertise="${shard_ips[$i]}:7071" \
      --lease_timeout_ms=600000 > "$tmp/shard$i.log" 2>&1 &
    pids+=($!)
  done
  local live=0
  for _ in $(seq 100); do
    live=$(tally shards 2> /dev/null | grep -c ' live ' || true)
    ((live >= k)) && break
    sleep 0.1
  done
  ((live >= k)) || fail "$live of $k shards live after 10 s"
  # One client per worker host; the first submits the job. `timeout` bounds
  # each (the job cannot start if a client is missing).
  local clients=()
  for i in 0 1 2 3; do
    ip netns exec "${hosts[$((5 + i))]}" timeout 300 "$B/bench/tally-bench-shard-pushpull" \
      --server=$coord_ip:7070 --name="w$i" --shards="$k" --workers=4 --steps="${steps[$k]}" \
      --submit="$([[ $i == 0 ]] && echo true || echo false)" > "$tmp/w$i.json" 2> "$tmp/w$i.log" &
    clients+=($!)
    pids+=($!)
  done
  for i in 0 1 2 3; do
    wait "${clients[$i]}" || fail "client w$i (k=$k) failed"
  done
  python3 -c "import json, sys; print(sum(json.load(open(f))['gb_per_sec'] for f in sys.argv[1:]))" \
    "$tmp"/w[0-3].json >> "$tmp/tally-$k"
  stop_all
}

run_iperf() {  # k -> appends the aggregate GB/s to $tmp/iperf-k
  local k=$1 w clients=()
  # A server per (shard host, worker) pair, each on its own port.
  for w in 0 1 2 3; do
    ip netns exec "${hosts[$((1 + w % k))]}" timeout 30 iperf3 -s -1 -p $((5301 + w)) \
      > /dev/null 2>&1 &
    pids+=($!)
  done
  sleep 0.5
  for w in 0 1 2 3; do
    ip netns exec "${hosts[$((5 + w))]}" timeout 20 iperf3 -c "${shard_ips[$((w % k))]}" \
      -p $((5301 + w)) -t 3 -J > "$tmp/i$w.json" 2> "$tmp/iperf$w.log" &
    clients+=($!)
    pids+=($!)
  done
  for w in 0 1 2 3; do
    wait "${clients[$w]}" || fail "iperf3 client $w (k=$k) failed: $(head -c 300 "$tmp/i$w.json")"
  done
  local sum=0
  for w in 0 1 2 3; do sum=$(awk -v a="$sum" -v b="$(iperf_gbps "$tmp/i$w.json")" 'BEGIN {print a + b}'); done
  echo "$sum" >> "$tmp/iperf-$k"
  stop_all
}

for ((r = 0; r < repeats; r++)); do
  for k in 1 2 4; do
    run_tally "$k"
    run_iperf "$k"
  done
done

printf "links held to %s; 4 workers; medians of %d run(s)\n" "$rate" "$repeats"
printf "%-7s %22s %22s %13s %20s\n" shards "Tally aggregate GB/s" "iperf3 aggregate GB/s" \
  "Tally/iperf3" "speed-up vs 1 shard"
base=$(median < "$tmp/tally-1")
for k in 1 2 4; do
  t=$(median < "$tmp/tally-$k"); i=$(median < "$tmp/iperf-$k")
  printf "%-7s %22.3f %22.3f %13.2f %20.2f\n" "$k" "$t" "$i" "$(ratio "$t" "$i")" "$(ratio "$t" "$base")"
done
