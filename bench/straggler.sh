#!/usr/bin/env bash
# Consistency modes against a real straggler, side by side in one run.
#
# tally-server and two tally-worker daemons (cpu:1 each) on localhost train
# the MLP example (Fashion-MNIST, 2 epochs, batch 64 per worker, SGD lr 0.02
# momentum 0.9). Worker w2 runs in a cgroup (v1 cpu controller) whose CFS
# quota gives it QUOTA percent of one CPU (default 15): the kernel slows it
# to about a third of its speed on this two-core machine. Each row is one job with the same spec but
# for training.consistency; the figures are the job's mean samples/s over
# its training, its final test accuracy, the pushes that came after their
# step had closed (backup workers) and the slowed worker's steps over the
# fast worker's near the end (its clock over the other's: in async, how much
# slower the quota made it; in bsp and ssp the rule holds them together).
# The first row runs without the quota; vs_bsp compares with the second.
#
# A second table gives both workers short random pauses instead (SIGSTOP for
# PAUSE ms, then running for an exponential time of mean RUN ms, each worker
# on its own; bench/jitter.py): no worker is slower on average, but at any
# moment one may be stopped. This is where ssp's bounded staleness helps.
#   bench/straggler.sh [QUOTA [PAUSE RUN]]     needs root (cgroup)
set -euo pipefail
cd "$(dirname "$0")/.."
quota=${1:-15}
jitter_pause=${2:-15}
jitter_run=${3:-20}
B=build
PY=/usr/bin/python3
tmp=$(mktemp -d)
cg=/sys/fs/cgroup/cpu/tally-straggler
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -d $cg ]] && rmdir "$cg" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[[ -d /sys/fs/cgroup/cpu ]] || { echo "needs the cgroup v1 cpu controller" >&2; exit 1; }
mkdir -p "$cg"
echo 100000 > "$cg/cpu.cfs_period_us"
port=7491

run() {  # spec slow(none|quota|jitter) port -> "samples/s accuracy versions late w2/w1"
  local port=$3
  echo -1 > "$cg/cpu.cfs_quota_us"
  $B/server/tally-server --listen=127.0.0.1 --port=$port > "$tmp/server.log" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do $B/client/tally --server=127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.05; done
  local w=() i
  for i in 1 2; do
    $B/worker/tally-worker --server=127.0.0.1:$port --devices=cpu:1 --name=w$i --quiet \
      --health_port=-1 > "$tmp/w$i.log" 2>&1 &
    w+=($!)
  done
  pids=("$sp" "${w[@]}")
  echo "${w[1]}" > "$cg/cgroup.procs"
  [[ $2 == quota ]] && echo $((quota * 1000)) > "$cg/cpu.cfs_quota_us"
  local id jitter=""
  id=$($B/client/tally --server=127.0.0.1:$port submit "$1")
  id=${id%%$'\n'*}
  if [[ $2 == jitter ]]; then
    $PY bench/jitter.py "$jitter_pause" "$jitter_run" "${w[@]}" &
    jitter=$!
    pids+=("$jitter")
  fi
  # Sample the workers' step times while the job runs.
  : > "$tmp/progress"
  while true; do
    $B/client/tally --server=127.0.0.1:$port status "$id" --json > "$tmp/status.json" || true
    local state
    state=$($PY -c "import json; print(json.load(open('$tmp/status.json'))['state'])" 2>/dev/null || echo "?")
    [[ $state == SUCCEEDED ]] && break
    [[ $state == FAILED || $state == CANCELLED ]] && { echo "job $state" >&2; exit 1; }
    $PY -c "
import json
m = json.load(open('$tmp/status.json'))['metrics']
p = {w['name']: int(w.get('clock', 0)) for w in m.get('progress', [])}
if p.get('w1', 0) > 0 and 'w2' in p:
    print(p['w2'] / p['w1'])" >> "$tmp/progress" 2>/dev/null || true
    sleep 0.5
  done
  $PY - "$tmp/status.json" "$tmp/progress" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))['metrics']
r = [float(x) for x in open(sys.argv[2]) if x.strip()]
slow = r[-1] if r else float('nan')  # the last look before the end
print(m['mean_samples_per_sec'], m['test_accuracy'], m['step'],
      m.get('late_pushes', 0), slow)
EOF
  [[ -n $jitter ]] && { kill "$jitter"; wait "$jitter" 2>/dev/null || true; }
  kill "$sp" "${w[@]}"; wait 2>/dev/null || true
  pids=()
}

spec_for() {  # row -> spec file with that training.consistency
  local row=$1 consistency="" spec="$tmp/spec.yaml"
  case $row in
    bsp*) [[ $row == *backup_workers* ]] && consistency="{backup_workers: ${row##*: }}" ;;
    ssp*) consistency="{mode: ssp, ${row#ssp, }}" ;;
    async) consistency="{mode: async}" ;;
    "async, lr_scaling: staleness") consistency="{mode: async, lr_scaling: staleness}" ;;
  esac
  cp examples/fashion-mnist-mlp.yaml "$spec"
  if [[ -n $consistency ]]; then
    sed -i "s/^  workers: 2 .*/  workers: 2\n  consistency: $consistency/" "$spec"
    grep -q "consistency:" "$spec" || { echo "could not set the consistency" >&2; exit 1; }
  fi
  echo "$spec"
}

table() {  # slow_mode row... (slow_mode: quota | jitter)
  local slow=$1 base="" row spec sps acc versions late ratio vs s
  shift
  printf "%-34s %12s %9s %9s %6s %9s\n" consistency samples/s vs_bsp test_acc late w2/w1
  for row in "$@"; do
    spec=$(spec_for "${row% (no straggler)}")
    s=$slow
    [[ $row == *"(no straggler)" ]] && s=none
    port=$((port + 1))
    read -r sps acc versions late ratio < <(run "$spec" "$s" "$port")
    [[ $row == bsp ]] && base=$sps
    vs="-"
    [[ -n $base ]] && vs=$(awk -v a="$sps" -v b="$base" 'BEGIN {printf "%.2f", a / b}')
    printf "%-34s %12.0f %9s %9.4f %6d %9.2f\n" "$row" "$sps" "$vs" "$acc" "$late" "$ratio"
  done
}

echo "One persistent straggler: w2 held to ${quota}% of a CPU (CFS quota)"
table quota "bsp (no straggler)" "bsp" "bsp, backup_workers: 1" "ssp, staleness: 2" \
  "ssp, staleness: 4" "async" "async, lr_scaling: staleness"
echo
echo "Transient stragglers: each worker paused (SIGSTOP) ${jitter_pause} ms at random, every ${jitter_run} ms on average"
table jitter "bsp" "ssp, staleness: 2" "ssp, staleness: 4" "ssp, staleness: 8" "async"
echo "(w2/w1: w2's clock over w1's near the end; in bsp and ssp the rule holds them together)"
