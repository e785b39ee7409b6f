# Shared by the benchmark scripts (source it; it defines functions only).

# The median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# a / b.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {print a / b}'; }

# GB/s received in an `iperf3 -J` client report.
iperf_gbps() {
  python3 -c "import json; print(json.load(open('$1'))['end']['sum_received']['bits_per_second'] / 8e9)"
}

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
