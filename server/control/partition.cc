#include "server/control/partition.h"

#include <algorithm>

namespace tally {

std::vector<std::pair<int64_t, int64_t>> PartitionRanges(int64_t n, int k) {
  k = std::max(1, k);
  std::vector<std::pair<int64_t, int64_t>> out;
  auto bound = [n, k](int64_t i) {
    return static_cast<int64_t>(static_cast<__int128>(i) * n / k);
  };
  for (int i = 0; i < k; ++i) {
    const int64_t begin = bound(i), end = bound(i + 1);
    out.emplace_back(begin, end - begin);
  }
  return out;
}

int ShardCount(int64_t n, int wanted, int live) {
  // Never more ranges than elements: a range is never empty.
  if (wanted > 0) {
    return live >= wanted ? static_cast<int>(std::min<int64_t>(wanted, n)) : 0;
  }
  if (live <= 0) return 0;
  const int64_t by_size = std::max<int64_t>(1, n / kMinRangeElements);
  return static_cast<int>(std::min<int64_t>(live, by_size));
}

}  // namespace tally
