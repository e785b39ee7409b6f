// A fixed set of persistent threads that run one function per thread per
// round, as parallel_apply does per step, without creating threads per step.
//
// Run() is called from one thread at a time (the step driver). Each round
// has a deadline: a round that does not finish in time returns
// kDeadlineExceeded and the group refuses further rounds (its threads may
// still be inside the late function, which stays alive until they leave it).
#ifndef TALLY_WORKER_THREAD_GROUP_H_
#define TALLY_WORKER_THREAD_GROUP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tally {

class ThreadGroup {
 public:
  using Task = std::function<absl::Status(int index)>;

  explicit ThreadGroup(int size);
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  ~ThreadGroup();  // stops and joins the threads

  int size() const { return size_; }

  // Runs task(i) for every i in [0, size()): index 0 on the calling thread
  // (which would otherwise only wait), the others on their own threads, and
  // waits for all of them. Returns the first non-OK status in thread order
  // (others are logged into `statuses` when given), or kDeadlineExceeded after
  // `timeout`.
  absl::Status Run(Task task, absl::Duration timeout,
                   std::vector<absl::Status>* statuses = nullptr);

 private:
  void Loop(int index);

  // Rounds are typically a millisecond apart. Waking a halted virtual CPU
  // can take as long, so both sides first poll these atomics for a short
  // while (kSpin) before blocking on the mutex.
  std::atomic<uint64_t> posted_{0};  // mirrors generation_
  std::atomic<int> remaining_{0};    // mirrors pending_

  absl::Mutex mu_;
  std::shared_ptr<const Task> task_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  int size_ = 0;
  std::vector<std::thread> threads_;  // indices 1 .. size_-1
};

}  // namespace tally

#endif  // TALLY_WORKER_THREAD_GROUP_H_
