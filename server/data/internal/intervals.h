// A merged set of [begin, end) element ranges: what of a push arrived, or
// what of it is in a step's sum.
#ifndef TALLY_SERVER_DATA_INTERNAL_INTERVALS_H_
#define TALLY_SERVER_DATA_INTERNAL_INTERVALS_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

namespace tally::internal {

class Intervals {
 public:
  void Add(int64_t b, int64_t e) {
    if (b >= e) return;
    auto it = ranges_.upper_bound(b);
    if (it != ranges_.begin() && std::prev(it)->second >= b) --it;
    while (it != ranges_.end() && it->first <= e) {
      b = std::min(b, it->first);
      e = std::max(e, it->second);
      covered_ -= it->second - it->first;
      it = ranges_.erase(it);
    }
    ranges_[b] = e;
    covered_ += e - b;
  }
  // Every element of [b, e) is in the set.
  bool Covers(int64_t b, int64_t e) const {
    if (b >= e) return true;
    auto it = ranges_.upper_bound(b);
    if (it == ranges_.begin()) return false;
    --it;
    return it->first <= b && it->second >= e;
  }
  // The parts of [b, e) not in the set, in order.
  std::vector<std::pair<int64_t, int64_t>> Gaps(int64_t b, int64_t e) const {
    std::vector<std::pair<int64_t, int64_t>> out;
    auto it = ranges_.upper_bound(b);
    if (it != ranges_.begin() && std::prev(it)->second > b) --it;
    for (; b < e && it != ranges_.end() && it->first < e; ++it) {
      if (it->first > b) out.emplace_back(b, it->first);
      b = std::max(b, it->second);
    }
    if (b < e) out.emplace_back(b, e);
    return out;
  }
  int64_t covered() const { return covered_; }
  bool empty() const { return covered_ == 0; }
  void Clear() {
    ranges_.clear();
    covered_ = 0;
  }

 private:
  std::map<int64_t, int64_t> ranges_;  // begin -> end, disjoint, not touching
  int64_t covered_ = 0;
};

}  // namespace tally::internal

#endif  // TALLY_SERVER_DATA_INTERNAL_INTERVALS_H_
