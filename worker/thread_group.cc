#include "worker/thread_group.h"

#include "absl/strings/str_cat.h"

namespace tally {

ThreadGroup::ThreadGroup(int size) {
  {
    absl::MutexLock lock(&mu_);
    results_.resize(size);
  }
  threads_.reserve(size);
  for (int i = 0; i < size; ++i) threads_.emplace_back([this, i] { Loop(i); });
}

ThreadGroup::~ThreadGroup() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadGroup::Loop(int index) {
  uint64_t seen = 0;
  while (true) {
    std::shared_ptr<const Task> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || generation_ != seen;
      };
      // Idle threads re-check periodically; a round wakes them at once.
      while (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1))) {
      }
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    absl::Status s = (*task)(index);
    absl::MutexLock lock(&mu_);
    results_[index] = std::move(s);
    --pending_;
  }
}

absl::Status ThreadGroup::Run(Task task, absl::Duration timeout,
                              std::vector<absl::Status>* statuses) {
  absl::MutexLock lock(&mu_);
  if (broken_) {
    return absl::FailedPreconditionError(
        "a previous round of the device threads never finished");
  }
  task_ = std::make_shared<const Task>(std::move(task));
  for (absl::Status& s : results_) s = absl::OkStatus();
  pending_ = size();
  ++generation_;
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    broken_ = true;
    return absl::DeadlineExceededError(absl::StrCat(
        pending_, " of ", size(), " device threads did not finish within ",
        absl::FormatDuration(timeout)));
  }
  if (statuses != nullptr) *statuses = results_;
  for (const absl::Status& s : results_) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tally
