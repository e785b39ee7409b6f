#!/usr/bin/env bash
# Multi-host test: the coordinator, two parameter shard processes and two
# tally-worker daemons, each on its own network host (a Linux network
# namespace with its own address, joined by veth pairs to a bridge in a sixth
# namespace), train a job split over both shards to completion; the client
# runs on the coordinator's host. The topology is docker-compose.yml's. Every
# process speaks mTLS and the servers check tokens (certificates made here,
# with the hosts' addresses). Then a Python worker on a worker host trains
# a Python model the same way.
# Skips (77) where namespaces cannot be made (not root, no iproute2).
#   multihost_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
tag=t$$
hub=tally-hub-$tag
hosts=(tally-srv-$tag tally-w1-$tag tally-w2-$tag tally-s1-$tag tally-s2-$tag)
addrs=(10.231.0.1 10.231.0.2 10.231.0.3 10.231.0.4 10.231.0.5)

if [[ $(id -u) != 0 ]] || ! command -v ip > /dev/null; then
  echo "SKIP: multi-host test needs root and iproute2 (ip netns)"
  exit 77
fi
if ! ip netns add "$hub" 2> /dev/null; then
  echo "SKIP: cannot create network namespaces here"
  exit 77
fi
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2> /dev/null || true; done
  wait 2> /dev/null || true
  for h in "${hosts[@]}" "$hub"; do ip netns del "$h" 2> /dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$dir"/*.log; do echo "--- $f" >&2; tail -n 20 "$f" >&2; done
  exit 1
}

ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
for i in 0 1 2 3 4; do
  h=${hosts[$i]}
  ip netns add "$h"
  ip link add "veth$i-$tag" type veth peer name "eth0-$tag-$i"
  ip link set "veth$i-$tag" netns "$hub"
  ip link set "eth0-$tag-$i" netns "$h"
  ip -n "$hub" link set "veth$i-$tag" master br0 up
  ip -n "$h" link set "eth0-$tag-$i" name eth0
  ip -n "$h" addr add "${addrs[$i]}/24" dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$h" link set lo up
done

"$(dirname "$0")/../deploy/make-certs.sh" "$dir/certs" "${addrs[@]}" > /dev/null
c=$dir/certs
tls=(--tls_ca="$c/ca.pem" --tls_cert="$c/node.pem" --tls_key="$c/node.key")
server_auth=("${tls[@]}" --tokens="$c/tokens.txt" --token_file="$c/admin.token")
server=${addrs[0]}:7070
ip netns exec "${hosts[0]}" "$build/server/tally-server" "${server_auth[@]}" --port=7070 --lease_timeout_ms=2000 \
  --noshard > "$dir/server.log" 2>&1 &
pids+=($!)
for i in 3 4; do
  ip netns exec "${hosts[$i]}" "$build/server/tally-server" "${server_auth[@]}" --port=7070 --lease_timeout_ms=2000 \
    --coordinator="$server" --advertise="${addrs[$i]}:7070" > "$dir/shard$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 2; do
  ip netns exec "${hosts[$i]}" "$build/worker/tally-worker" --server="$server" "${tls[@]}" --token_file="$c/worker.token" --devices=cpu:1 \
    --name="host$i" --health_port=7071 > "$dir/worker$i.log" 2>&1 &
  pids+=($!)
done
client=("$build/client/tally" "${tls[@]}" --token_file="$c/admin.token")
on_server() { ip netns exec "${hosts[0]}" "${client[@]}" --server="$server" "$@"; }
for _ in $(seq 100); do on_server health > /dev/null 2>&1 && break; sleep 0.1; done
# A worker host reaches the server across the bridge.
ip netns exec "${hosts[1]}" "${client[@]}" --server="$server" health > /dev/null ||
  fail "the server is unreachable from a worker host"
# Each worker's own health endpoint answers across the network too.
for _ in $(seq 100); do
  ip netns exec "${hosts[0]}" "${client[@]}" --server="${addrs[1]}:7071" health > /dev/null 2>&1 && break
  sleep 0.1
done
ip netns exec "${hosts[0]}" "${client[@]}" --server="${addrs[1]}:7071" health > /dev/null ||
  fail "worker health endpoint unreachable"

# Both shards registered from their own hosts.
for _ in $(seq 100); do
  (( $(on_server shards 2> /dev/null | grep -c " live ") == 2 )) && break
  sleep 0.1
done
(( $(on_server shards | grep -c " live ") == 2 )) || fail "shards: $(on_server shards)"
sed 's/workers: 2}/workers: 2, shards: 2}/' examples/synthetic-2workers.yaml > "$dir/job.yaml"
grep -q "shards: 2" "$dir/job.yaml" || fail "could not make the two-shard spec"
out=$(on_server submit "$dir/job.yaml" --wait) || fail "job did not succeed: $out"
id=${out%%$'\n'*}
grep -q "(2 parameter shards)" "$dir/worker1.log" || fail "the job was not split over two shards"
grep -q "assigned $id" "$dir/worker1.log" || fail "host1 took no part"
grep -q "assigned $id" "$dir/worker2.log" || fail "host2 took no part"
echo "$out" | tail -n 2
echo "multihost: coordinator ${addrs[0]}, shards ${addrs[3]} and ${addrs[4]}, workers ${addrs[1]} and ${addrs[2]}: ok"

# A Python worker on host 2 (where a C++ worker runs too): a Python model's
# job goes to it alone, and its pushes and pulls cross the bridge over TCP
# to both shards (memory is shared only with a worker on the shard's own
# host), under the same mTLS and tokens. Where the binding was not built,
# or PyTorch is missing, this part is skipped.
if ! ls "$build"/python/tally/_native*.so > /dev/null 2>&1 ||
  ! /usr/bin/python3 -c "import torch" 2> /dev/null; then
  echo "multihost: no Python binding or PyTorch here: the Python worker part skipped"
  exit 0
fi
export PYTHONPATH=$build/python
ip netns exec "${hosts[2]}" /usr/bin/python3 -m tally.worker --server="$server" "${tls[@]}" \
  --token_file="$c/worker.token" --devices=cpu:1 --name=pyhost > "$dir/pyworker.log" 2>&1 &
pids+=($!)
printf '%s\n' 'from torch import nn' '' '' 'def make_model():' \
  '    return nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))' > "$dir/model.py"
printf '%s\n' 'name: py-multihost' \
  'model: {python: {file: model.py, build: make_model}}' \
  'dataset: {name: synthetic, train_size: 2048, test_size: 256, features: 32, classes: 4, seed: 1}' \
  'training: {epochs: 1, batch_size: 32, seed: 1, workers: 1, shards: 2}' \
  'optimizer: {type: sgd, lr: 0.05}' > "$dir/py.yaml"
out=$(ip netns exec "${hosts[0]}" /usr/bin/python3 -m tally submit "$dir/py.yaml" --server="$server" \
  "${tls[@]}" --token_file="$c/admin.token" --wait) || fail "the Python model's job: $out"
pyid=${out%%$'\n'*}
grep -q "assigned $pyid" "$dir/pyworker.log" || fail "the Python worker did not train $pyid"
if grep -q "assigned $pyid" "$dir/worker2.log"; then
  fail "a C++ worker was given the Python model"
fi
grep -q "(2 parameter shards)" "$dir/pyworker.log" || fail "the Python job was not split over two shards"
echo "$out" | tail -n 1
echo "multihost: a Python worker on ${addrs[2]} trained a Python model over TCP: ok"
