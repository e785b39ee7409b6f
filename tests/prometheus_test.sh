#!/usr/bin/env bash
# A real Prometheus scrapes a live local cluster: tally-server and two
# tally-worker daemons with --metrics_port, Prometheus (Debian's package)
# scraping all three every 250 ms while a job trains. The test queries
# Prometheus's HTTP API for a Tally series that grew during the job, and
# `promtool check metrics` finds nothing to say about any endpoint.
# Skips (77) without prometheus and promtool.
#   prometheus_test.sh BUILD_DIR
set -euo pipefail
build=$1
command -v prometheus > /dev/null && command -v promtool > /dev/null ||
  { echo "SKIP: needs prometheus and promtool (apt-get install prometheus)"; exit 77; }
. "$(dirname "${BASH_SOURCE[0]}")/process_helpers.sh"
port=$(free_port); sm=$(free_port); w1=$(free_port); w2=$(free_port); pp=$(free_port)
addr=127.0.0.1:$port
tally() { "$build/client/tally" --server="$addr" "$@"; }

"$build/server/tally-server" --listen=127.0.0.1 --port="$port" --metrics_port="$sm" \
  > "$dir/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do tally health > /dev/null 2>&1 && break; sleep 0.05; done
for w in 1 2; do
  mp=$([[ $w == 1 ]] && echo "$w1" || echo "$w2")
  "$build/worker/tally-worker" --server="$addr" --devices=cpu:1 --name="w$w" --health_port=-1 \
    --metrics_port="$mp" > "$dir/w$w.log" 2>&1 &
  pids+=($!)
done
cat > "$dir/prometheus.yml" <<YAML
global: {scrape_interval: 250ms, scrape_timeout: 200ms}
scrape_configs:
  - job_name: tally
    static_configs:
      - targets: ['127.0.0.1:$sm', '127.0.0.1:$w1', '127.0.0.1:$w2']
YAML
promtool check config "$dir/prometheus.yml" > /dev/null || fail "promtool check config"
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$pp" > "$dir/prometheus.log" 2>&1 &
pids+=($!)
query() {  # PromQL -> the first sample's value, or empty
  curl -s --get "http://127.0.0.1:$pp/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
for _ in $(seq 100); do [[ $(query 'count(up == 1)' 2> /dev/null) == 3 ]] && break; sleep 0.1; done
[[ $(query 'count(up == 1)') == 3 ]] || fail "Prometheus does not see the three endpoints up"

# Ten times the shared long job (which ends in about 10 s on two idle
# cores): still training when it is cancelled below, however fast the
# machine.
sed 's/epochs: 120,/epochs: 1200,/' "$(dirname "$0")/long-synthetic.yaml" > "$dir/longer.yaml"
grep -q "epochs: 1200," "$dir/longer.yaml" || fail "long-synthetic.yaml has no 'epochs: 120,'"
id=$(tally submit "$dir/longer.yaml") || fail "submit: $id"
id=${id%%$'\n'*}
# While the job runs: every endpoint passes promtool, and the job's step
# counter, as Prometheus stored it, grows.
for ep in "$sm" "$w1" "$w2"; do
  curl -sf "http://127.0.0.1:$ep/metrics" > "$dir/m.txt" || fail "no /metrics on $ep"
  out=$(promtool check metrics < "$dir/m.txt" 2>&1) || fail "promtool check metrics on $ep: $out"
  [[ -z $out ]] || fail "promtool check metrics on $ep says: $out"
done
first=""
for _ in $(seq 100); do
  first=$(query "tally_job_steps_total{job_id=\"$id\"}")
  [[ -n $first && $first != 0 ]] && break
  sleep 0.1
done
[[ -n $first ]] || fail "Prometheus has no tally_job_steps_total for $id"
sleep 1.5
grew=$(query "max_over_time(tally_job_steps_total{job_id=\"$id\"}[1m]) > $first")
[[ -n $grew ]] || fail "tally_job_steps_total did not grow past $first"
pushes=$(query 'sum(tally_pushes_total{result="ok"})')
worker_steps=$(query 'sum(tally_worker_steps_total)')
[[ -n $pushes && $pushes != 0 && -n $worker_steps && $worker_steps != 0 ]] ||
  fail "push and worker step counters: '$pushes' '$worker_steps'"
echo "prometheus: $id at step $first then $grew; $pushes pushes, $worker_steps worker steps scraped"
tally cancel "$id" > /dev/null
