#!/usr/bin/env bash
# What mTLS and token checks cost, side by side in one run: push + pull of a
# 67 MB model (one 4096 x 4096 linear layer, 10 steps, one client) through
# tally-server on loopback, and the two-worker cluster training the MLP
# example for one epoch (mean samples/s of the job), each plaintext and with
# TLS + tokens (certificates from deploy/make-certs.sh). As root, push + pull
# also across a link held to RATE (default 2gbit; two network namespaces, a
# veth pair and a token-bucket filter), where the link, not the CPU, is the
# limit, as between machines. REPEATS (default 3) alternating runs, medians.
#   bench/tls_cost.sh [REPEATS] [RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
rate=${2:-2gbit}
tag=t$$
hosts=(tally-tsrv-$tag tally-tcli-$tag)
addrs=(10.233.0.1 10.233.0.2)
B=build
PY=/usr/bin/python3
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for h in "${hosts[@]}"; do ip netns del "$h" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
. bench/lib.sh  # median, ratio, linked_hosts
deploy/make-certs.sh "$tmp/certs" "${addrs[0]}" > /dev/null
c=$tmp/certs
tls=(--tls_ca="$c/ca.pem" --tls_cert="$c/node.pem" --tls_key="$c/node.key")
port=7700

# server_flags/client_flags for a mode: plain or tls.
flags() {
  if [[ $1 == tls ]]; then
    server=("${tls[@]}" --tokens="$c/tokens.txt")
    client=("${tls[@]}" --token_file="$c/admin.token")
    worker=("${tls[@]}" --token_file="$c/worker.token")
  else
    server=() client=() worker=()
  fi
}
start_server() {  # mode [flags]
  port=$((port + 1))
  flags "$1"
  $B/server/tally-server --listen=127.0.0.1 --port=$port "${server[@]}" "${@:2}" > "$tmp/server.log" 2>&1 &
  pids=($!)
  for _ in $(seq 100); do
    $B/client/tally --server=127.0.0.1:$port "${client[@]}" health > /dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "server did not start" >&2; exit 1
}
pushpull() {  # mode -> GB/s
  start_server "$1" --lease_timeout_ms=600000
  $B/bench/tally-bench-pushpull --server=127.0.0.1:$port "${client[@]}" --steps=10 > "$tmp/p.json"
  $PY -c "import json; print(json.load(open('$tmp/p.json'))['gb_per_sec'])"
  kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true
}
cluster() {  # mode -> samples/s
  start_server "$1"
  for i in 1 2; do
    $B/worker/tally-worker --server=127.0.0.1:$port "${worker[@]}" --devices=cpu:1 --quiet \
      --health_port=-1 > "$tmp/w$i.log" 2>&1 &
    pids+=($!)
  done
  local out id
  out=$($B/client/tally --server=127.0.0.1:$port "${client[@]}" submit "$tmp/mlp.yaml" --wait) ||
    { echo "job failed: $out" >&2; exit 1; }
  id=${out%%$'\n'*}
  $B/client/tally --server=127.0.0.1:$port "${client[@]}" status "$id" --json |
    $PY -c "import json,sys; print(json.load(sys.stdin)['metrics']['mean_samples_per_sec'])"
  kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true
}
linked() {  # mode -> GB/s, server and client on two hosts joined by the link
  flags "$1"
  ip netns exec "${hosts[0]}" $B/server/tally-server --listen="${addrs[0]}" --port=7070 \
    --lease_timeout_ms=600000 "${server[@]}" $([[ $1 == plain ]] && echo --insecure) \
    > "$tmp/server.log" 2>&1 &
  pids=($!)
  for _ in $(seq 100); do
    ip netns exec "${hosts[1]}" $B/client/tally --server="${addrs[0]}:7070" "${client[@]}" health \
      > /dev/null 2>&1 && break
    sleep 0.05
  done
  ip netns exec "${hosts[1]}" $B/bench/tally-bench-pushpull --server="${addrs[0]}:7070" \
    "${client[@]}" --steps=10 > "$tmp/p.json"
  $PY -c "import json; print(json.load(open('$tmp/p.json'))['gb_per_sec'])"
  kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true
}
link=0
if [[ $(id -u) == 0 ]] && command -v tc > /dev/null &&
   linked_hosts "${hosts[@]}" "${addrs[@]}" "$rate" "$tag" 2> /dev/null; then
  link=1
fi
sed -e 's/epochs: 2/epochs: 1/' examples/fashion-mnist-mlp.yaml > "$tmp/mlp.yaml"
for f in pp_plain pp_tls cl_plain cl_tls ln_plain ln_tls; do : > "$tmp/$f"; done
for ((r = 0; r < repeats; r++)); do
  pushpull plain >> "$tmp/pp_plain"
  pushpull tls >> "$tmp/pp_tls"
  cluster plain >> "$tmp/cl_plain"
  cluster tls >> "$tmp/cl_tls"
  if ((link)); then
    linked plain >> "$tmp/ln_plain"
    linked tls >> "$tmp/ln_tls"
  fi
done
pp_plain=$(median < "$tmp/pp_plain"); pp_tls=$(median < "$tmp/pp_tls")
cl_plain=$(median < "$tmp/cl_plain"); cl_tls=$(median < "$tmp/cl_tls")
printf '%-46s %12s %12s %8s\n' "" plaintext "TLS+tokens" "TLS/plain"
printf '%-46s %12.3f %12.3f %8.2f\n' "push+pull, 67 MB model, loopback (GB/s)" "$pp_plain" "$pp_tls" "$(ratio "$pp_tls" "$pp_plain")"
printf '%-46s %12.0f %12.0f %8.2f\n' "2-worker cluster, MLP, 1 epoch (samples/s)" "$cl_plain" "$cl_tls" "$(ratio "$cl_tls" "$cl_plain")"
if ((link)); then
  ln_plain=$(median < "$tmp/ln_plain"); ln_tls=$(median < "$tmp/ln_tls")
  printf '%-46s %12.3f %12.3f %8.2f\n' "push+pull, 67 MB, link held to $rate (GB/s)" "$ln_plain" "$ln_tls" "$(ratio "$ln_tls" "$ln_plain")"
fi
