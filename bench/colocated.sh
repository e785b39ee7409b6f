#!/usr/bin/env bash
# A worker and a shard on one machine: loopback TCP against a Unix-domain
# socket and against memory the shard shares with the worker (the Exchange
# stream over loopback TCP, its values in a shared region: tally-worker's
# default), the same server build on each, alternating, REPEATS runs
# (default 5), medians. Two models, driven by the worker's own parameter client
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
run() {  # address in out steps [flags]
  $B/bench/tally-bench-shard-pushpull --server="$1" --submit --shards=1 --workers=1 \
    --in="$2" --out="$3" --steps="$4" ${5:-}
}
for k in tcp uds shm; do for f in big small; do : > "$tmp/${k}_$f"; done; done
for ((r = 0; r < repeats; r++)); do
  tcp=127.0.0.1:$((7700 + r)) uds=unix:$tmp/s:$((7720 + r))
  # Shared regions for the 67 MB model too (its range is above the default
  # 16 MiB); the TCP runs never ask for one.
  $B/server/tally-server --listen=127.0.0.1 --port=$((7700 + r)) --lease_timeout_ms=600000 \
    --shared_memory_max_bytes=134217728 > /dev/null 2>&1 &
  pids=($!)
  $B/server/tally-server --listen="unix:$tmp/s" --port=$((7720 + r)) --insecure --lease_timeout_ms=600000 > /dev/null 2>&1 &
  pids+=($!)
  for a in "$tcp" "$uds"; do
    for _ in $(seq 100); do $B/client/tally --server="$a" health >/dev/null 2>&1 && break; sleep 0.05; done
  done
  order=(tcp uds shm)
  ((r % 3 == 1)) && order=(uds shm tcp)  # none always goes first
  ((r % 3 == 2)) && order=(shm tcp uds)
  for kind in "${order[@]}"; do
    a=$([[ $kind == uds ]] && echo "$uds" || echo "$tcp")
    flags=$([[ $kind == shm ]] && echo "--shared_memory" || true)
    field "$(run "$a" 4096 4096 11 "$flags")" gb_per_sec >> "$tmp/${kind}_big"
    s=$(field "$(run "$a" 784 300 301 "$flags")" seconds)
    awk -v s="$s" 'BEGIN {print s * 1000 / 300}' >> "$tmp/${kind}_small"
  done
  kill "${pids[@]}"; wait 2>/dev/null || true
  pids=()
done
printf "%-30s %12s %12s %8s %12s %8s\n" "" "loopback TCP" "Unix socket" "UDS/TCP" "shared mem" "shm/TCP"
tb=$(median < "$tmp/tcp_big"); ub=$(median < "$tmp/uds_big"); sb=$(median < "$tmp/shm_big")
ts=$(median < "$tmp/tcp_small"); us=$(median < "$tmp/uds_small"); ss=$(median < "$tmp/shm_small")
printf "%-30s %12.3f %12.3f %8.2f %12.3f %8.2f\n" "67 MB push+pull, GB/s" \
  "$tb" "$ub" "$(ratio "$ub" "$tb")" "$sb" "$(ratio "$sb" "$tb")"
printf "%-30s %12.3f %12.3f %8.2f %12.3f %8.2f\n" "0.94 MB push+pull round, ms" \
  "$ts" "$us" "$(ratio "$us" "$ts")" "$ss" "$(ratio "$ss" "$ts")"
for k in tcp uds shm; do
  echo "all runs ($k): big $(paste -sd' ' "$tmp/${k}_big"); small $(paste -sd' ' "$tmp/${k}_small")"
done
