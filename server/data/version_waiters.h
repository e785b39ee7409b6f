// Those waiting for a range's version (pulls, saves): each is released
// once the version is reached, at its deadline, or when the range ends.
// Their callbacks are collected (ReadyCalls) under the owner's lock and run
// after it is released.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock.
#ifndef TALLY_SERVER_DATA_VERSION_WAITERS_H_
#define TALLY_SERVER_DATA_VERSION_WAITERS_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tally {

// Callbacks and what to call them with, run without the owner's lock.
using ReadyCalls =
    std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>;
void RunReady(ReadyCalls& ready);

class VersionWaiters {
 public:
  // Waits for `version` until `deadline`; `worker_id` names a member's
  // wait (empty: anyone's).
  void Add(int64_t version, absl::Time deadline,
           std::function<void(absl::Status)> done, std::string worker_id);
  // Those waiting for `version` or an earlier one: called with OK.
  void Release(int64_t version, ReadyCalls* ready);
  // Those whose deadline is at or before `now`: kDeadlineExceeded, naming
  // the version they waited for and `at` (the range's).
  void Expire(absl::Time now, int64_t at, ReadyCalls* ready);
  // Every one, with `why`.
  void Cancel(const absl::Status& why, ReadyCalls* ready);
  // The waits of the members in `ids` for a version past `version`, with
  // `why`.
  void Fail(const std::set<std::string>& ids, int64_t version,
            const absl::Status& why, ReadyCalls* ready);
  size_t size() const { return waiters_.size(); }

 private:
  struct Waiter {
    int64_t version;
    absl::Time deadline;
    std::function<void(absl::Status)> done;
    std::string worker_id;
  };
  std::vector<Waiter> waiters_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_VERSION_WAITERS_H_
