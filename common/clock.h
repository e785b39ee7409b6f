// Time as a seam: servers read time through a Clock so that tests advance a
// FakeClock instead of sleeping through lease timeouts.
#ifndef TALLY_COMMON_CLOCK_H_
#define TALLY_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tally {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;  // thread-safe
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1))
      : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_COMMON_CLOCK_H_
