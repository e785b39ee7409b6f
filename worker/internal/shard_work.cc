#include "worker/internal/shard_work.h"

#include <grpcpp/client_context.h>

#include <algorithm>

namespace tally {
namespace internal {

ShardWork::ShardWork(int parts, bool mixed_ok)
    : mixed_ok_(mixed_ok),
      pending_(parts),
      results_(parts),
      ranges_(parts),
      arrived_(parts, 0),
      ended_(parts, false) {}

void ShardWork::SetRange(int part, int64_t begin, int64_t end) {
  absl::MutexLock lock(&mu_);
  ranges_[part] = {begin, end};
  arrived_[part] = begin;
}

void ShardWork::Arrived(int part, int64_t upto) {
  absl::MutexLock lock(&mu_);
  arrived_[part] = std::max(arrived_[part], upto);
}

absl::Status ShardWork::WaitRange(int64_t begin, int64_t end,
                                  absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto there = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status_.ok()) return true;
    for (size_t p = 0; p < ranges_.size(); ++p) {
      const auto [b, e] = ranges_[p];
      if (e <= begin || b >= end || ended_[p]) continue;
      if (arrived_[p] < std::min(end, e)) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&there), deadline)) {
    return absl::DeadlineExceededError("the weights did not arrive in time");
  }
  return status_;
}

void ShardWork::Started(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  live_.push_back(ctx);
  if (cancelled_) ctx->TryCancel();
}

void ShardWork::Finished(int part, grpc::ClientContext* ctx,
                         const absl::Status& status, int64_t version,
                         bool cancel_others, bool committed) {
  absl::MutexLock lock(&mu_);
  live_.erase(std::find(live_.begin(), live_.end(), ctx));
  results_[part] = status;
  ended_[part] = true;
  if (status.ok() && committed) ++committed_;
  if (!status.ok()) {
    if (status_.ok()) {
      status_ = status;
      if (cancel_others) {
        for (grpc::ClientContext* c : live_) c->TryCancel();
      }
    }
  } else if (version_ < 0) {
    version_ = version;
  } else if (version_ != version) {
    mixed_versions_ = true;
    version_ = std::min(version_, version);
  }
  --pending_;
}

void ShardWork::Failed(int part, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  results_[part] = status;
  ended_[part] = true;
  if (status_.ok()) status_ = status;
  --pending_;
}

void ShardWork::Lend() {
  absl::MutexLock lock(&lent_mu_);
  ++lent_;
}

void ShardWork::Returned() {
  absl::MutexLock lock(&lent_mu_);
  --lent_;
}

absl::Status ShardWork::Wait(absl::Time deadline) {
  {
    absl::MutexLock lock(&lent_mu_);
    auto returned = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lent_mu_) {
      return lent_ == 0;
    };
    if (!lent_mu_.AwaitWithDeadline(absl::Condition(&returned), deadline)) {
      return absl::DeadlineExceededError(
          "gRPC did not let go of the pushed gradient in time");
    }
  }
  absl::MutexLock lock(&mu_);
  auto done = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError("the shards did not answer in time");
  }
  if (!status_.ok()) return status_;
  if (mixed_versions_ && !mixed_ok_) {
    return absl::AbortedError(
        "the shards answered different versions: pull again");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardWork::WaitVersion(absl::Time deadline) {
  if (absl::Status s = Wait(deadline); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return version_;
}

void ShardWork::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : live_) c->TryCancel();
}

bool ShardWork::Done() const {
  {
    absl::MutexLock lock(&lent_mu_);
    if (lent_ != 0) return false;
  }
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

std::vector<absl::Status> ShardWork::Results() const {
  absl::MutexLock lock(&mu_);
  return results_;
}

bool ShardWork::Committed() const {
  absl::MutexLock lock(&mu_);
  return pending_ == 0 && committed_ == static_cast<int>(results_.size());
}

}  // namespace internal
}  // namespace tally
