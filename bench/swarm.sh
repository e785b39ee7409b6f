#!/usr/bin/env bash
# What a coordinator and its shards cost as workers grow: a swarm of light
# workers (tally-bench-swarm: real registrations, heartbeats, pushes, pulls
# and commits over gRPC, each worker on connections of its own, a gradient
# made once instead of a model) against one coordinator (--noshard: all its
# work is the control plane) and SHARDS shard processes, on this host's
# loopback. The swarm runs in ceil(N / 64) processes. On two cores the
# swarm's own scheduling dominates what a worker sees, so the figures are
# the servers':
#   publish p50/p99   from a step's last push to its version published, on
#                     the shards (tally_step_publish_seconds, buckets 1.25x),
#                     over the same window as the CPU, in ms
#   close p50/p99     the same from the step's last commit (on one shard the
#                     push is its own commit; on several the commits come
#                     with the members' next pulls, so publish includes the
#                     swarm's own round trip and close does not)
#   coord cpu         the coordinator's CPU (user + system) over the steady
#                     part of the job (steps 10 to STEPS - 10), % of a core
#   coord rss         its resident memory at the end, MiB
#   shard cpu/rss     the same for each shard (the busiest one)
#   hb/s, hb B/s      heartbeats a second and their message bytes a second
#                     (request and answer as protobuf encodes them, before
#                     HTTP/2 framing), over the swarm's run
#   dropped           lease expiries at the coordinator (0: nobody that
#                     lived was dropped)
# Then the idle rows: N workers registered and heartbeating, no job, the
# coordinator's memory per worker ((RSS with N - RSS before) / N), in
# plaintext and with mTLS. Then the death row: one worker of N dies at
# step 20, the seconds until the step closes without it (lease
# --lease_timeout_ms, 3000 by default).
#   bench/swarm.sh [N ...]            (default 16 64 128 256)
#   SHARDS="1 2 4" STEPS=200 PARAMS=16384 TLS="0 1" PARTS="rows idle death"
#   SERVER_FLAGS=... (the coordinator's, e.g. --lease_timeout_ms=10000)
#   SHARD_FLAGS=...  (the shards', e.g. --streamed_sums_min_bytes=0)
set -euo pipefail
cd "$(dirname "$0")/.."
B=$PWD/build
PY=/usr/bin/python3
[[ -x $B/bench/tally-bench-swarm ]] || { echo "build first: deploy/build.sh" >&2; exit 1; }
sizes=("$@")
((${#sizes[@]})) || sizes=(16 64 128 256)
steps=${STEPS:-200}
params=${PARAMS:-16384}
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
. bench/lib.sh  # median, ratio
deploy/make-certs.sh "$tmp/certs" > /dev/null 2>&1
tls_flags=()
# The servers on one core, the swarm on the others (with two or more): what
# the servers do is then measured apart from the swarm's own scheduling.
SERVER_CPU="" SWARM_CPU=""
if (($(nproc) >= 2)) && command -v taskset > /dev/null; then
  SERVER_CPU="taskset -c 0"
  SWARM_CPU="taskset -c 1-$(($(nproc) - 1))"
fi

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }     # CPU, 1/100 s
rss_mib() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
client() { "$B/client/tally" "${tls_flags[@]}" --server="127.0.0.1:$cport" "$@"; }
# Steps the first shard has published, from its metrics endpoint: read
# there rather than by `tally status`, which would cost the coordinator a
# connection (a TLS handshake) and a 256-worker status five times a second.
job_step() {
  curl -s "127.0.0.1:$((cport + 1010))/metrics" |
    awk '/^tally_step_publish_seconds_count/ {n = $2} END {print n + 0}'
}

# A coordinator and $1 shards; sets cport, coord, shard_pids.
start_servers() {
  local k=$1 i
  cport=$((7700 + RANDOM % 200))
  $SERVER_CPU "$B/server/tally-server" "${tls_flags[@]}" --listen=127.0.0.1 --port=$cport --noshard \
    --metrics_port=$((cport + 1000)) ${SERVER_FLAGS:-} > "$tmp/coord.log" 2>&1 &
  coord=$!
  pids+=($coord)
  for _ in $(seq 100); do client health > /dev/null 2>&1 && break; sleep 0.1; done
  shard_pids=()
  for ((i = 0; i < k; i++)); do
    $SERVER_CPU "$B/server/tally-server" "${tls_flags[@]}" --listen=127.0.0.1 --port=$((cport + 10 + i)) \
      --coordinator=127.0.0.1:$cport --advertise=127.0.0.1:$((cport + 10 + i)) \
      --metrics_port=$((cport + 1010 + i)) ${SHARD_FLAGS:-} \
      > "$tmp/shard$i.log" 2>&1 &
    shard_pids+=($!)
    pids+=($!)
  done
  sleep 1  # the shards register
}

# Starts N light workers in processes of at most 64; extra flags go to all,
# FIRST_FLAGS to the first, which submits the job unless IDLE is set.
start_swarm() {  # N [flags...]
  local n=$1 procs per i first
  shift
  procs=$(((n + 63) / 64)); per=$((n / procs))
  swarm_pids=()
  rm -f "$tmp"/swarm*.json  # an earlier run's processes' figures
  for ((i = 0; i < procs; i++)); do
    local count=$per
    ((i == procs - 1)) && count=$((n - per * (procs - 1)))
    first=()
    ((i == 0)) && [[ ! ${IDLE:-} ]] && first=(--submit --job_workers=$n ${FIRST_FLAGS:-})
    $SWARM_CPU "$B/bench/tally-bench-swarm" "${tls_flags[@]}" --server=127.0.0.1:$cport --name=s$i \
      --workers=$count "${first[@]}" "$@" > "$tmp/swarm$i.json" 2> "$tmp/swarm$i.log" &
    swarm_pids+=($!)
    pids+=($!)
  done
}

# Every shard's buckets of histogram NAME, summed: "le count" lines.
publish_buckets() {  # NAME
  local i
  for ((i = 0; i < ${#shard_pids[@]}; i++)); do
    curl -s "127.0.0.1:$((cport + 1010 + i))/metrics" | grep "^$1_bucket"
  done | sed -E 's/.*le="([^"]+)"} ([0-9.e+]+)/\1 \2/' |
    awk '{s[$1] += $2} END {for (k in s) print k, s[k]}'
}
# p50 and p99 (ms) and the count of what closed between two bucket files.
publish_quantiles() {  # BEFORE AFTER
  $PY - "$1" "$2" <<'PYEOF'
import sys
def load(f):
    b = {}
    for line in open(f):
        le, n = line.split()
        b[float('inf') if le == '+Inf' else float(le)] = float(n)
    return b
before, after = load(sys.argv[1]), load(sys.argv[2])
b = {le: after[le] - before.get(le, 0) for le in after}
bounds = sorted(b)
total = b.get(float('inf'), 0)
def q(p):
    want, lo, prev = p * total, 0.0, 0.0
    for le in bounds:
        if b[le] >= want:
            if le == float('inf'):
                return lo * 1e3
            frac = (want - prev) / (b[le] - prev) if b[le] > prev else 1
            return (lo + frac * (le - lo)) * 1e3
        lo, prev = le, b[le]
print('%.2f %.2f %d' % (q(0.5), q(0.99), total) if total else 'nan nan 0')
PYEOF
}

run_row() {  # N K -> one table row
  local n=$1 k=$2 c0 c1 s0=() s1=() t0 t1 i busiest=0 bt=0 hb=0 hbb=0 expiries
  start_servers "$k"
  start_swarm "$n" --shards="$k" --steps="$steps" --params="$params"
  until (($(job_step) >= 10)); do sleep 0.2; kill -0 "${swarm_pids[0]}" 2>/dev/null || break; done
  t0=$(date +%s.%N); c0=$(ticks "$coord")
  publish_buckets tally_step_publish_seconds > "$tmp/pub0"
  publish_buckets tally_step_close_seconds > "$tmp/close0"
  for i in "${!shard_pids[@]}"; do s0+=("$(ticks "${shard_pids[$i]}")"); done
  until (($(job_step) >= steps - 10)); do sleep 0.2; kill -0 "${swarm_pids[0]}" 2>/dev/null || break; done
  t1=$(date +%s.%N); c1=$(ticks "$coord")
  publish_buckets tally_step_publish_seconds > "$tmp/pub1"
  publish_buckets tally_step_close_seconds > "$tmp/close1"
  for i in "${!shard_pids[@]}"; do
    s1+=("$(ticks "${shard_pids[$i]}")")
    if ((s1[i] - s0[i] >= bt)); then bt=$((s1[i] - s0[i])); busiest=$i; fi
  done
  local crss srss
  crss=$(rss_mib "$coord"); srss=$(rss_mib "${shard_pids[$busiest]}")
  for p in "${swarm_pids[@]}"; do wait "$p" || { echo "swarm failed:" >&2; cat "$tmp"/swarm*.log >&2; exit 1; }; done
  read -r p50 p99 closes < <(publish_quantiles "$tmp/pub0" "$tmp/pub1")
  read -r c50 c99 _ < <(publish_quantiles "$tmp/close0" "$tmp/close1")
  expiries=$(curl -s "127.0.0.1:$((cport + 1000))/metrics" | awk '/^tally_lease_expiries_total/ {print $2}')
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')
  # Heartbeats a second and their message bytes a second (request and
  # answer, as protobuf encodes them): the swarm's counts over its run.
  read -r hb hbb < <(cat "$tmp"/swarm*.json | $PY -c "
import json, sys
r = [json.loads(l) for l in sys.stdin if l.strip()]
print('%.0f %.0f' % (sum(x['heartbeats'] / x['seconds'] for x in r),
                     sum(x['heartbeat_bytes'] / x['seconds'] for x in r)))")
  printf "%5d %3d %5s %8.2f %8.2f %8.2f %8.2f %8.1f %8.1f %8.1f %8.1f %7s %9.0f %7s\n" "$n" "$k" "${TLS_ON:-no}" \
    "$p50" "$p99" "$c50" "$c99" "$(awk -v t=$((c1 - c0)) -v s="$secs" 'BEGIN {print t / s}')" "$crss" \
    "$(awk -v t="$bt" -v s="$secs" 'BEGIN {print t / s}')" "$srss" "$hb" \
    "$hbb" "${expiries:-?}"
  stop_all
}

idle_row() {  # N -> N, RSS before, RSS with N, KiB per worker
  local n=$1 before after
  start_servers 1
  sleep 1
  before=$(awk '/^VmRSS/ {print $2}' "/proc/$coord/status")
  IDLE=1 start_swarm "$n" --idle=8
  sleep 6
  after=$(awk '/^VmRSS/ {print $2}' "/proc/$coord/status")
  for p in "${swarm_pids[@]}"; do wait "$p" || true; done
  printf "%5d %5s %10.1f %10.1f %12.1f\n" "$n" "${TLS_ON:-no}" "$(awk -v k="$before" 'BEGIN {print k / 1024}')" \
    "$(awk -v k="$after" 'BEGIN {print k / 1024}')" "$(awk -v a="$before" -v b="$after" -v n="$n" 'BEGIN {print (b - a) / n}')"
  stop_all
}

death_row() {  # N -> seconds from the death to the step closing without it
  local n=$1
  start_servers 1
  FIRST_FLAGS="--kill=1 --kill_at=20" start_swarm "$n" --shards=1 --steps=40 --params="$params"
  for p in "${swarm_pids[@]}"; do wait "$p" || { cat "$tmp"/swarm*.log >&2; exit 1; }; done
  printf "%5d %8.3f\n" "$n" "$($PY -c "import json; print(json.load(open('$tmp/swarm0.json'))['death_to_close_seconds'])")"
  stop_all
}

parts=${PARTS:-rows idle death}
for tls in ${TLS:-0 1}; do
  if [[ $tls == 1 ]]; then
    tls_flags=(--tls_ca="$tmp/certs/ca.pem" --tls_cert="$tmp/certs/node.pem" --tls_key="$tmp/certs/node.key")
    TLS_ON=mtls
  else
    tls_flags=(); TLS_ON=no
  fi
  if [[ $parts == *rows* ]]; then
    echo "## ${steps} steps, ${params} parameters, tls: $TLS_ON ${SERVER_FLAGS:-}"
    printf "%5s %3s %5s %8s %8s %8s %8s %8s %8s %8s %8s %7s %9s %7s\n" N K tls pub_p50 pub_p99 \
      cls_p50 cls_p99 coord% coordMiB shard% shardMiB hb/s hbB/s dropped
    for n in "${sizes[@]}"; do
      for k in ${SHARDS:-1 2 4}; do run_row "$n" "$k"; done
    done
    echo
  fi
  if [[ $parts == *idle* ]]; then
    printf "%5s %5s %10s %10s %12s\n" N tls rss0_MiB rssN_MiB KiB/worker
    for n in "${sizes[@]}"; do idle_row "$n"; done
    echo
  fi
done
if [[ $parts == *death* ]]; then
  TLS_ON=no tls_flags=()
  printf "%5s %8s\n" N death_to_close_s
  for n in "${sizes[@]}"; do death_row "$n"; done
fi
