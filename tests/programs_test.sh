#!/usr/bin/env bash
# What a newcomer meets first: every program's --help lists its flags with
# their help text, and a plaintext tally-server started with no flags runs
# (on loopback, its default without TLS) and says its own lease; a shard
# process names the coordinator's, not a flag's default.
#   programs_test.sh BUILD_DIR
set -euo pipefail
build=$1
. "$(dirname "${BASH_SOURCE[0]}")/process_helpers.sh"

check_help() {  # binary flag...
  local bin=$1 out
  shift
  out=$("$build/$bin" --help 2>&1 || true)
  [[ $out != *"No flags matched"* ]] || fail "$bin --help: No flags matched"
  for flag in "$@"; do
    grep -q -- "-$flag (" <<< "$out" || fail "$bin --help does not list --$flag: $out"
  done
  # Each flag with its help text, not a bare name.
  grep -q "default:" <<< "$out" || fail "$bin --help has no defaults: $out"
}
check_help server/tally-server port listen state_dir coordinator tokens tls_ca \
  lease_timeout_ms max_queued_jobs_per_submitter http_port metrics_port
check_help worker/tally-worker server devices name health_port tls_cert token_file standalone
check_help client/tally server timeout_s token_file tls_key

wait_line() {  # file pattern
  for _ in $(seq 100); do grep -q "$2" "$1" && return 0; sleep 0.05; done
  fail "no '$2' in $1: $(cat "$1")"
}
port=$(free_port)
"$build/server/tally-server" --port="$port" --lease_timeout_ms=1500 > "$dir/coord.log" 2>&1 &
pids+=($!)
wait_line "$dir/coord.log" "listening on"
grep -q "listening on 127.0.0.1:$port (plaintext; lease 1500 ms; coordinator and shard, data plane on port $((port + 1)))" "$dir/coord.log" ||
  fail "a plaintext server should listen on loopback by default: $(cat "$dir/coord.log")"
shard_port=$(free_port)
"$build/server/tally-server" --coordinator="127.0.0.1:$port" --port="$shard_port" \
  --advertise="127.0.0.1:$shard_port" > "$dir/shard.log" 2>&1 &
pids+=($!)
wait_line "$dir/shard.log" "registered with"
grep -q "listening on 127.0.0.1:$shard_port (plaintext; shard of 127.0.0.1:$port)" "$dir/shard.log" ||
  fail "shard start-up line: $(cat "$dir/shard.log")"
grep -q "lease 1500 ms" "$dir/shard.log" || fail "the shard does not say the coordinator's lease: $(cat "$dir/shard.log")"
grep -q "lease 3000" "$dir/shard.log" && fail "the shard prints its own flag's lease: $(cat "$dir/shard.log")"
echo "programs: --help lists the flags; loopback by default; the shard says the coordinator's lease"
