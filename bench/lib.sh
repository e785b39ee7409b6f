# Shared by the benchmark scripts (source it; it defines functions only).

# The median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# a / b.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {print a / b}'; }

# GB/s received in an `iperf3 -J` client report.
iperf_gbps() {
  python3 -c "import json; print(json.load(open('$1'))['end']['sum_received']['bits_per_second'] / 8e9)"
}

# Network hosts on one bridge: namespace HUB holds the bridge br0, and each
# HOST gets a veth to it named eth0 with the address 10.233.0.N/24, N its
# position from 1 (the namespaces must not exist yet; the caller deletes
# them). With RATE, each host's link is held to it by a token-bucket filter
# on both ends. Needs root and iproute2.
bridged_hosts() {  # TAG HUB RATE|"" HOST...
  local tag=$1 hub=$2 rate=$3 i=0 h
  shift 3
  ip netns add "$hub"
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for h in "$@"; do
    ip netns add "$h"
    ip link add "veth$i-$tag" type veth peer name "eth$i-$tag"
    ip link set "veth$i-$tag" netns "$hub"
    ip link set "eth$i-$tag" netns "$h"
    ip -n "$hub" link set "veth$i-$tag" master br0 up
    ip -n "$h" link set "eth$i-$tag" name eth0
    ip -n "$h" addr add "10.233.0.$((i + 1))/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    if [[ $rate ]]; then
      tc -n "$h" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
      tc -n "$hub" qdisc add dev "veth$i-$tag" root tbf rate "$rate" burst 256kb latency 50ms
    fi
    i=$((i + 1))
  done
}

# Three network hosts for a server and two workers, on one bridge: sets
# hub, hosts (srv, w1, w2), addrs, tmp and pids, and a trap that stops the
# processes in pids and deletes the namespaces and tmp on exit. stop_pids kills
# what pids holds; on HOST CMD... runs a command on a host.
three_hosts() {  # TAG RATE|""
  hub=tally-hub-$1
  hosts=(tally-srv-$1 tally-w1-$1 tally-w2-$1)
  addrs=(10.233.0.1 10.233.0.2 10.233.0.3)
  tmp=$(mktemp -d)
  pids=()
  trap three_hosts_cleanup EXIT
  bridged_hosts "$1" "$hub" "$2" "${hosts[@]}"
}
# A process started as `on HOST CMD &` is a child of the subshell that $!
# names: every process in the hosts' namespaces goes too.
stop_pids() {
  local p h
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for h in "${hosts[@]}"; do
    for p in $(ip netns pids "$h" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  done
  wait 2>/dev/null || true
  for _ in $(seq 50); do  # not our children: wait for them to go
    [[ $(for h in "${hosts[@]}"; do ip netns pids "$h" 2>/dev/null; done) ]] || break
    sleep 0.1
  done
  pids=()
}
three_hosts_cleanup() {
  stop_pids
  for h in "${hosts[@]}" "$hub"; do ip netns del "$h" 2>/dev/null || true; done
  rm -rf "$tmp"
}
on() { local h=$1; shift; ip netns exec "$h" "$@"; }

# Two network hosts joined by one link held to RATE: namespaces HOST_A and
# HOST_B (which must not exist yet; the caller deletes them), a veth pair
# named vs-TAG/vc-TAG, addresses ADDR_A and ADDR_B (/24), and a token-bucket
# filter on both ends. Needs root and iproute2.
linked_hosts() {  # HOST_A HOST_B ADDR_A ADDR_B RATE TAG
  local hosts=("$1" "$2") addrs=("$3" "$4") rate=$5 tag=$6 i h dev
  for h in "${hosts[@]}"; do ip netns add "$h"; done
  ip link add "vs-$tag" type veth peer name "vc-$tag"
  ip link set "vs-$tag" netns "${hosts[0]}"
  ip link set "vc-$tag" netns "${hosts[1]}"
  for i in 0 1; do
    h=${hosts[$i]}
    dev=$([[ $i == 0 ]] && echo "vs-$tag" || echo "vc-$tag")
    ip -n "$h" addr add "${addrs[$i]}/24" dev "$dev"
    ip -n "$h" link set "$dev" up
    ip -n "$h" link set lo up
    tc -n "$h" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms
  done
}

# The DLRM of examples/dlrm with ROWS rows a table, its tables built on the
# meta device (the workers never allocate them: their rows are the
# shards'), written to OUT.
dlrm_model() {  # ROWS OUT
  sed -e "s/ROWS, DIM = 13, 26, 20000, 16/ROWS, DIM = 13, 26, $1, 16/" \
      -e 's/nn.EmbeddingBag(rows, dim, mode="sum")/nn.EmbeddingBag(rows, dim, mode="sum", device="meta")/' \
      examples/dlrm/model.py > "$2"
  grep -q "ROWS, DIM = 13, 26, $1, 16" "$2" && grep -q 'device="meta"' "$2" ||
    { echo "examples/dlrm/model.py changed: fix dlrm_model in bench/lib.sh" >&2; exit 1; }
}

# The set-up of a benchmark of Python workers: a build with the binding in
# build/; sets B, PY (Debian's python3, which has torch), PYTHONPATH, tmp
# and pids, and a trap that stops what pids holds and removes tmp on exit.
python_bench() {
  B=build
  [[ -f $B/python/tally/engine.py ]] ||
    { echo "build first: deploy/build.sh --with-torch" >&2; exit 1; }
  tmp=$(mktemp -d)
  pids=()
  trap python_bench_cleanup EXIT
  export PYTHONPATH=$PWD/$B/python
  PY=/usr/bin/python3
}
python_bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}

# Writes to FILE a Python program that prints a job's step every 20 ms, as
# "TIME STEP" lines, until the job ends; with --events, then a JSON line of
# its events ([unix time, text] pairs). TLS files (and a token) as for
# tally.Client, when the cluster speaks mTLS:
#   $PY FILE COORD JOB_ID [--events] [CA CERT KEY TOKEN_FILE]
job_tracer() {  # FILE
  cat > "$1" <<'PYEOF'
import json, sys, time, tally
from tally import tally_pb2 as pb
args = [a for a in sys.argv[1:] if a != "--events"]
tls = dict(zip(("tls_ca", "tls_cert", "tls_key", "token_file"), args[2:]))
c = tally.Client(args[0], **tls)
while True:
    try:
        j = c.status(args[1])
    except tally.RpcError:
        time.sleep(0.02)
        continue
    print(f"{time.time():.3f} {j.metrics.step}", flush=True)
    if j.state not in (pb.PENDING, pb.RUNNING):
        break
    time.sleep(0.02)
if "--events" in sys.argv:
    print(json.dumps([(e.unix_time, e.text) for e in c.history(args[1]).events]), flush=True)
PYEOF
}
