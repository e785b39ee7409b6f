#!/usr/bin/env bash
# A worker and a shard on one machine: loopback TCP against a Unix-domain
# socket, the same server build on each, alternating, REPEATS runs (default
# 5), medians. Two models, driven by the worker's own parameter client
# (tally-bench-shard-pushpull, one shard, one worker):
#   67 MB (4096 x 4096)   push+pull GB/s, 10 timed rounds
#   0.94 MB (784 x 300)   ms per push+pull round, 300 timed rounds (the MLP
#                         example's size: per-message costs, not bytes)
# gRPC listens on a Unix socket when the address is unix:PATH; tally-server
# builds its address as LISTEN:PORT, so --listen=unix:DIR/s makes the socket
# DIR/s:PORT (and needs --insecure: the server only knows loopback by IP).
#   bench/colocated.sh [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-5}
B=build
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
. bench/lib.sh  # median, ratio
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
run() {  # address in out steps
  $B/bench/tally-bench-shard-pushpull --server="$1" --submit --shards=1 --workers=1 \
    --in="$2" --out="$3" --steps="$4"
}
for f in tcp_big uds_big tcp_small uds_small; do : > "$tmp/$f"; done
for ((r = 0; r < repeats; r++)); do
  tcp=127.0.0.1:$((7700 + r)) uds=unix:$tmp/s:$((7720 + r))
  $B/server/tally-server --listen=127.0.0.1 --port=$((7700 + r)) --lease_timeout_ms=600000 > /dev/null 2>&1 &
  pids=($!)
  $B/server/tally-server --listen="unix:$tmp/s" --port=$((7720 + r)) --insecure --lease_timeout_ms=600000 > /dev/null 2>&1 &
  pids+=($!)
  for a in "$tcp" "$uds"; do
    for _ in $(seq 100); do $B/client/tally --server="$a" health >/dev/null 2>&1 && break; sleep 0.05; done
  done
  order=(tcp uds)
  ((r % 2)) && order=(uds tcp)  # neither always goes first
  for kind in "${order[@]}"; do
    a=$([[ $kind == tcp ]] && echo "$tcp" || echo "$uds")
    field "$(run "$a" 4096 4096 11)" gb_per_sec >> "$tmp/${kind}_big"
    s=$(field "$(run "$a" 784 300 301)" seconds)
    awk -v s="$s" 'BEGIN {print s * 1000 / 300}' >> "$tmp/${kind}_small"
  done
  kill "${pids[@]}"; wait 2>/dev/null || true
  pids=()
done
printf "%-34s %12s %12s %8s\n" "" "loopback TCP" "Unix socket" "UDS/TCP"
tb=$(median < "$tmp/tcp_big"); ub=$(median < "$tmp/uds_big")
ts=$(median < "$tmp/tcp_small"); us=$(median < "$tmp/uds_small")
printf "%-34s %12.3f %12.3f %8.2f\n" "67 MB push+pull, GB/s" "$tb" "$ub" "$(ratio "$ub" "$tb")"
printf "%-34s %12.3f %12.3f %8.2f\n" "0.94 MB push+pull round, ms" "$ts" "$us" "$(ratio "$us" "$ts")"
echo "all runs (tcp/uds): big $(paste -sd' ' "$tmp/tcp_big") / $(paste -sd' ' "$tmp/uds_big");" \
  "small $(paste -sd' ' "$tmp/tcp_small") / $(paste -sd' ' "$tmp/uds_small")"
