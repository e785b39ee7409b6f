#include "server/data/range_replication.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/errors.h"

namespace tally {

void RangeReplication::Leaving(
    const std::shared_ptr<const std::vector<float>>& current) {
  if (!in_step()) return;
  // Stepping then copies the weights first (PublishedWeights::Writable).
  Version& left = unacked_.empty() ? published_ : unacked_.back();
  if (left.weights == nullptr) left.weights = current;
}

void RangeReplication::Made(int64_t version,
                            std::shared_ptr<const std::string> buffers,
                            ClosedStep closed) {
  taken_over_ = false;  // every member pushed here since
  if (!in_step()) {
    published_ = {version, nullptr, std::move(buffers)};
    if (catching_up_) forward_(std::move(closed));
    return;
  }
  unacked_.push_back({version, nullptr, std::move(buffers)});
  forward_(std::move(closed));
}

bool RangeReplication::Acknowledge(int64_t version, int64_t current,
                                   int64_t sender) {
  if (!forwarding() || sender != sender_) return false;
  if (catching_up_) {
    // Every version made so far is published already.
    if (version >= current) catching_up_ = false;
    return false;
  }
  const int64_t before = published_.version;
  while (!unacked_.empty() && unacked_.front().version <= version) {
    published_ = std::move(unacked_.front());
    unacked_.pop_front();
  }
  return published_.version != before;
}

bool RangeReplication::Stop(int64_t version,
                            std::shared_ptr<const std::string> buffers) {
  forward_ = nullptr;
  catching_up_ = false;
  const int64_t before = published_.version;
  unacked_.clear();
  published_ = {version, nullptr, std::move(buffers)};
  return published_.version != before;
}

absl::Status RangeReplication::Start(int64_t version, int64_t from_version,
                                     std::function<void(ClosedStep)> forward,
                                     int64_t sender) {
  if (backup_)
    return absl::FailedPreconditionError("this range is a backup copy");
  if (version != from_version || published_.version != version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the range is at version ", version, ", not ", from_version,
        ": its new backup must be seeded again"));
  }
  forward_ = std::move(forward);
  sender_ = sender;
  catching_up_ = false;
  return absl::OkStatus();
}

absl::Status RangeReplication::CatchUp(int64_t version,
                                       std::function<void(ClosedStep)> forward,
                                       int64_t sender) {
  if (backup_)
    return absl::FailedPreconditionError("this range is a backup copy");
  if (!unacked_.empty() || published_.version != version) {
    return absl::FailedPreconditionError(
        "versions of this range still wait for another backup");
  }
  forward_ = std::move(forward);
  sender_ = sender;
  catching_up_ = true;
  return absl::OkStatus();
}

absl::Status RangeReplication::CheckClosed(const ClosedStep& step,
                                           int64_t version, int64_t num_params,
                                           int64_t buffer_bytes,
                                           bool* made_already) const {
  *made_already = false;
  if (!backup_)
    return absl::FailedPreconditionError("this range is no backup copy");
  if (step.step < version) {
    *made_already = true;
    return absl::OkStatus();
  }
  if (step.step > version) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "the backup is at version ", version, " and was sent step ",
            step.step, ": it lacks the steps between (seed it again)")),
        v1::STEP_NOT_OPEN, version);
  }
  if (step.samples > 0 &&
      (step.mean == nullptr ||
       static_cast<int64_t>(step.mean->size()) != num_params)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a closed step's mean must hold the range's ", num_params,
        " values"));
  }
  if (step.buffers != nullptr &&
      static_cast<int64_t>(step.buffers->size()) != buffer_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a closed step's buffer region must be the range's ",
                     buffer_bytes, " bytes, not ", step.buffers->size()));
  }
  return absl::OkStatus();
}

}  // namespace tally
