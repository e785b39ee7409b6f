// A fixed set of persistent threads that run one function per thread per
// round, as parallel_apply does per step, without creating threads per step.
//
// Run() is called from one thread at a time (the step driver). Each round
// has a deadline: a round that does not finish in time returns
// kDeadlineExceeded and the group refuses further rounds (its threads may
// still be inside the late function, which stays alive until they leave it).
#ifndef TALLY_WORKER_THREAD_GROUP_H_
#define TALLY_WORKER_THREAD_GROUP_H_

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

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs task(i) on thread i for every i in [0, size()) and waits for all of
  // them. Returns the first non-OK status in thread order (others are logged
  // into `statuses` when given), or kDeadlineExceeded after `timeout`.
  absl::Status Run(Task task, absl::Duration timeout,
                   std::vector<absl::Status>* statuses = nullptr);

 private:
  void Loop(int index);

  absl::Mutex mu_;
  std::shared_ptr<const Task> task_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tally

#endif  // TALLY_WORKER_THREAD_GROUP_H_
