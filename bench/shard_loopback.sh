#!/usr/bin/env bash
# One machine, no network limit: does splitting a job over two shard
# processes on the same host cost anything? The coordinator
# (tally-server --noshard) and 1 or 2 shard processes on localhost; WORKERS
# (default 2) tally-bench-shard-pushpull clients push and pull a 67 MB model
# (a 4096 x 4096 linear layer), 10 steps; the figure is their summed push +
# pull GB/s. Medians of REPEATS (default 3) alternating runs. On a 2-core
# machine every process competes for the same two cores: this measures the
# overhead of the split, not a gain.
#   bench/shard_loopback.sh [REPEATS] [WORKERS]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
workers=${2:-2}
B=$(pwd)/build
tmp=$(mktemp -d)
pids=()
stop() {
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  pids=()
}
trap 'stop; rm -rf "$tmp"' EXIT
. bench/lib.sh  # median, ratio
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

run() {  # shards -> aggregate GB/s
  local k=$1 port
  port=$(free_port)
  "$B/server/tally-server" --listen=127.0.0.1 --port="$port" --noshard \
    --lease_timeout_ms=600000 > "$tmp/coord.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    "$B/client/tally" --server="127.0.0.1:$port" health > /dev/null 2>&1 && break
    sleep 0.05
  done
  for i in $(seq "$k"); do
    local sp
    sp=$(free_port)
    "$B/server/tally-server" --listen=127.0.0.1 --port="$sp" --coordinator="127.0.0.1:$port" \
      --advertise="127.0.0.1:$sp" --lease_timeout_ms=600000 > "$tmp/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 100); do
    (($("$B/client/tally" --server="127.0.0.1:$port" shards | grep -c " live ") == k)) && break
    sleep 0.05
  done
  local clients=()
  for w in $(seq "$workers"); do
    local submit=false
    [[ $w == 1 ]] && submit=true
    timeout 300 "$B/bench/tally-bench-shard-pushpull" --server="127.0.0.1:$port" \
      --name="w$w" --submit=$submit --shards="$k" --workers="$workers" --steps=10 \
      > "$tmp/c$w.json" 2> "$tmp/c$w.err" &
    clients+=($!)
  done
  for c in "${clients[@]}"; do wait "$c" || { cat "$tmp"/c*.err >&2; exit 1; }; done
  stop
  python3 -c "import json,sys; print(sum(json.load(open(f))['gb_per_sec'] for f in sys.argv[1:]))" "$tmp"/c*.json
  rm -f "$tmp"/c*.json
}

: > "$tmp/one"; : > "$tmp/two"
for ((r = 0; r < repeats; r++)); do
  run 1 >> "$tmp/one"
  run 2 >> "$tmp/two"
done
one=$(median < "$tmp/one"); two=$(median < "$tmp/two")
printf "loopback, %d workers, 67 MB model, medians of %d\n" "$workers" "$repeats"
printf "%-32s %8s\n" "shards on this host" "GB/s"
printf "%-32s %8.3f\n" "1" "$one"
printf "%-32s %8.3f\n" "2" "$two"
printf "%-32s %8.2f\n" "2 / 1" "$(ratio "$two" "$one")"
