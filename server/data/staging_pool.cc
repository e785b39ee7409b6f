#include "server/data/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tally {

absl::StatusOr<StagingPool::Buffer> StagingPool::Acquire(int limit) {
  if (out_ >= limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        out_, " pushes already in flight for this job (limit ", limit, ")"));
  }
  ++out_;
  if (pool_.empty()) return Buffer();
  Buffer b = std::move(pool_.back());
  pool_.pop_back();
  return b;
}

StagingPool::Buffer StagingPool::Take() {
  ++out_;
  if (pool_.empty()) return std::make_unique<std::vector<float>>(num_params_);
  Buffer b = std::move(pool_.back());
  pool_.pop_back();
  return b;
}

void StagingPool::Release(Buffer b, size_t members) {
  if (b == nullptr) return;
  --out_;
  // As many as a step stages (a push a member), within 256 MiB: a step's
  // buffers come back for the next instead of being freed and made again,
  // zeroed, by the hundred (bench/swarm.sh: 256 members).
  constexpr int64_t kPoolBytes = int64_t{256} << 20;
  const size_t by_bytes = static_cast<size_t>(
      std::max<int64_t>(8, kPoolBytes / std::max<int64_t>(1, 4 * num_params_)));
  if (!closed_ && pool_.size() < std::min(members + 8, by_bytes))
    pool_.push_back(std::move(b));
}

void StagingPool::Prime(Buffer b) {
  if (pool_.empty() && !closed_) pool_.push_back(std::move(b));
}

void StagingPool::Close() {
  pool_.clear();
  closed_ = true;
}

}  // namespace tally
