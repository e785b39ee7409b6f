#!/usr/bin/env bash
# A swarm of 32 light workers (tally-bench-swarm: real registrations,
# heartbeats, pushes, pulls and commits over gRPC, each on connections of
# its own) against one coordinator and one shard process:
#   all     100 steps: every step closes with all 32 members (the job's
#           samples are 32 a step), nobody is dropped (no lease expired),
#           the job SUCCEEDS;
#   killed  one of the 32 dies at step 20 (its heartbeats stop, its
#           connections close): the step closes without it within the lease
#           and a little (the coordinator's tick and the membership change),
#           every other step with all, the job SUCCEEDS.
#   swarm_test.sh BUILD
set -euo pipefail
B=$(cd "$1" && pwd)
. "$(dirname "$0")/process_helpers.sh"  # dir, pids, fail, free_port
lease_ms=2000

start_servers() {  # sets port
  port=$(free_port)
  "$B/server/tally-server" --listen=127.0.0.1 --port="$port" --noshard \
    --lease_timeout_ms=$lease_ms --metrics_port=$((port + 1)) > "$dir/coord.log" 2>&1 &
  pids+=($!)
  local sp
  sp=$(free_port)
  "$B/server/tally-server" --listen=127.0.0.1 --port="$sp" --coordinator=127.0.0.1:"$port" \
    --advertise=127.0.0.1:"$sp" \
    > "$dir/shard.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [[ $("$B/client/tally" --server=127.0.0.1:"$port" shards 2>/dev/null) == *live* ]] && return
    sleep 0.1
  done
  fail "the shard did not register"
}
stop_servers() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
job_json() { "$B/client/tally" --server=127.0.0.1:"$port" status job-1 --json; }
field() { /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
expiries() {
  curl -s "127.0.0.1:$((port + 1))/metrics" | awk '/^tally_lease_expiries_total/ {print $2}'
}

# all
start_servers
"$B/bench/tally-bench-swarm" --server=127.0.0.1:"$port" --workers=32 --submit \
  --job_workers=32 --steps=100 --params=4096 > "$dir/all.json" 2> "$dir/all.log" ||
  fail "the swarm failed"
state=$(job_json | field "j['state']")
samples=$(job_json | field "j['metrics']['samples']")
[[ $state == SUCCEEDED ]] || fail "the job is $state"
[[ $samples == 3200 ]] || fail "$samples samples in 100 steps of 32 workers, want 3200"
[[ $(expiries) == 0 ]] || fail "$(expiries) leases expired in a swarm where nobody died"
echo "all: 32 workers, 100 steps, 3200 samples, no lease expired"
stop_servers

# killed
start_servers
"$B/bench/tally-bench-swarm" --server=127.0.0.1:"$port" --workers=32 --submit \
  --job_workers=32 --steps=40 --params=4096 --kill=1 --kill_at=20 \
  > "$dir/killed.json" 2> "$dir/killed.log" || fail "the swarm failed"
state=$(job_json | field "j['state']")
samples=$(job_json | field "j['metrics']['samples']")
closed=$(field "j['death_to_close_seconds']" < "$dir/killed.json")
[[ $state == SUCCEEDED ]] || fail "the job is $state"
# Steps 0..19 with 32, 20..39 with the 31 left.
[[ $samples == $((20 * 32 + 20 * 31)) ]] || fail "$samples samples, want $((20 * 32 + 20 * 31))"
[[ $(expiries) == 1 ]] || fail "$(expiries) leases expired, want the dead one's"
awk -v c="$closed" -v l="$lease_ms" 'BEGIN {exit !(c > 0 && c < l / 1000 + 1.5)}' ||
  fail "the step closed ${closed} s after the death (lease $((lease_ms / 1000)) s)"
echo "killed: the step closed ${closed} s after the death (lease $((lease_ms / 1000)) s)"
echo PASS
