#include "server/data/version_waiters.h"

#include "absl/strings/str_cat.h"

namespace tally {

void RunReady(ReadyCalls& ready) {
  for (auto& [fn, status] : ready) fn(status);
}

void VersionWaiters::Add(int64_t version, absl::Time deadline,
                         std::function<void(absl::Status)> done,
                         std::string worker_id) {
  waiters_.push_back(
      {version, deadline, std::move(done), std::move(worker_id)});
}

void VersionWaiters::Release(int64_t version, ReadyCalls* ready) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->version <= version) {
      ready->emplace_back(std::move(it->done), absl::OkStatus());
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void VersionWaiters::Expire(absl::Time now, int64_t at, ReadyCalls* ready) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->deadline <= now) {
      ready->emplace_back(
          std::move(it->done),
          absl::DeadlineExceededError(absl::StrCat(
              "version ", it->version, " not reached in time (at ", at, ")")));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void VersionWaiters::Cancel(const absl::Status& why, ReadyCalls* ready) {
  for (Waiter& w : waiters_) ready->emplace_back(std::move(w.done), why);
  waiters_.clear();
}

void VersionWaiters::Fail(const std::set<std::string>& ids, int64_t version,
                          const absl::Status& why, ReadyCalls* ready) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->version > version && ids.count(it->worker_id) > 0) {
      ready->emplace_back(std::move(it->done), why);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace tally
