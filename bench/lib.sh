# Shared by the benchmark scripts (source it; it defines functions only).

# The median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# a / b.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {print a / b}'; }

# GB/s received in an `iperf3 -J` client report.
iperf_gbps() {
  python3 -c "import json; print(json.load(open('$1'))['end']['sum_received']['bits_per_second'] / 8e9)"
}
