#include "worker/thread_group.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace tally {

namespace {

constexpr auto kSpin = std::chrono::microseconds(2000);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls `done` for up to kSpin; true if it became true.
template <typename F>
bool SpinUntil(F done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  int n = 0;
  while (!done()) {
    CpuRelax();
    if ((++n & 63) == 0 && std::chrono::steady_clock::now() > until)
      return false;
  }
  return true;
}

}  // namespace

ThreadGroup::ThreadGroup(int size) {
  {
    absl::MutexLock lock(&mu_);
    results_.resize(size);
  }
  size_ = size;
  threads_.reserve(size - 1);
  // Index 0 runs on the caller of Run(), which would otherwise only wait.
  for (int i = 1; i < size; ++i) threads_.emplace_back([this, i] { Loop(i); });
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
    SpinUntil([&] { return posted_.load(std::memory_order_acquire) != seen; });
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
    remaining_.store(pending_, std::memory_order_release);
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
  pending_ = size() - 1;
  remaining_.store(pending_, std::memory_order_release);
  ++generation_;
  posted_.store(generation_, std::memory_order_release);
  std::shared_ptr<const Task> mine = task_;
  mu_.Unlock();
  absl::Status own = (*mine)(0);
  SpinUntil([&] { return remaining_.load(std::memory_order_acquire) == 0; });
  mu_.Lock();
  results_[0] = std::move(own);
  auto done = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
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
