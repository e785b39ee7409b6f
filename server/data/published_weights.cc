#include "server/data/published_weights.h"

#include <algorithm>
#include <atomic>
#include <utility>

namespace tally {

float* PublishedWeights::Writable() {
  if (current_.use_count() > 1) {
    std::shared_ptr<std::vector<float>> fresh;
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      if (it->use_count() == 1) {
        fresh = std::move(*it);
        spares_.erase(it);
        break;
      }
    }
    if (fresh == nullptr) {
      fresh = std::make_shared<std::vector<float>>(current_->size());
    }
    // Its last readers let go with a release decrement: their reads come
    // before the copy's writes.
    std::atomic_thread_fence(std::memory_order_acquire);
    std::copy(current_->begin(), current_->end(), fresh->begin());
    // Kept for reuse once its readers are done (a few at most).
    if (spares_.size() < 2) spares_.push_back(current_);
    current_ = std::move(fresh);
  }
  // Readers let go with a release decrement: their reads come before the
  // caller's writes.
  std::atomic_thread_fence(std::memory_order_acquire);
  return current_->data();
}

std::shared_ptr<const std::vector<uint16_t>> PublishedWeights::Bfloat16Of(
    const std::vector<float>& snapshot, int64_t version) const {
  if (bf16_ != nullptr && bf16_version_ == version &&
      bf16_->size() == snapshot.size())
    return bf16_;
  return nullptr;
}

void PublishedWeights::KeepBfloat16(
    int64_t version, std::shared_ptr<const std::vector<uint16_t>> encoded) {
  bf16_version_ = version;
  bf16_ = std::move(encoded);
}

void PublishedWeights::Retire() {
  spares_.clear();
  bf16_.reset();
}

}  // namespace tally
