#include "server/control/leases.h"

#include <sys/random.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/errors.h"

namespace tally {

Leases::Leases(absl::Duration timeout, absl::Time) : timeout_(timeout) {}

int64_t Leases::NewIncarnation() const {
  while (true) {
    uint64_t bits = 0;
    char* p = reinterpret_cast<char*>(&bits);
    size_t got = 0;
    while (got < sizeof(bits)) {
      const ssize_t n = getrandom(p + got, sizeof(bits) - got, 0);
      if (n > 0) got += static_cast<size_t>(n);
    }
    const int64_t v = static_cast<int64_t>(bits >> 1);
    if (v == 0) continue;
    bool taken = false;
    for (const auto& [id, l] : leases_) taken = taken || l.incarnation == v;
    if (!taken) return v;
  }
}

int64_t Leases::Grant(const std::string& id, absl::Time now, bool forever) {
  const int64_t incarnation = NewIncarnation();
  Lease& l = leases_[id];
  l.incarnation = incarnation;
  l.expiry = forever ? absl::InfiniteFuture() : now + timeout_;
  return l.incarnation;
}

absl::Status Leases::Check(const std::string& id, int64_t incarnation) const {
  auto it = leases_.find(id);
  if (it == leases_.end()) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "unknown ", Quoted(id),
                          " (lease expired or server restarted): register "
                          "again")),
                      v1::REGISTER_AGAIN);
  }
  if (it->second.incarnation != incarnation) {
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("stale incarnation ", incarnation,
                                       " of ", Quoted(id), ": register again")),
                      v1::REGISTER_AGAIN);
  }
  if (it->second.ended) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          Quoted(id), "'s connection closed (its lease "
                          "ended): register again")),
                      v1::REGISTER_AGAIN);
  }
  return absl::OkStatus();
}

absl::Status Leases::Renew(const std::string& id, int64_t incarnation,
                           absl::Time now) {
  if (absl::Status s = Check(id, incarnation); !s.ok()) return s;
  Lease& l = leases_.at(id);
  if (l.expiry != absl::InfiniteFuture()) l.expiry = now + timeout_;
  return absl::OkStatus();
}

bool Leases::End(const std::string& id, int64_t incarnation, absl::Time now) {
  if (!Check(id, incarnation).ok()) return false;
  Lease& l = leases_.at(id);
  if (l.expiry == absl::InfiniteFuture()) return false;
  l.expiry = std::min(l.expiry, now - absl::Nanoseconds(1));
  l.ended = true;  // not renewed again
  return true;
}

std::vector<std::string> Leases::Expire(absl::Time now) {
  std::vector<std::string> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expiry < now) {
      out.push_back(it->first);
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void Leases::Revoke(const std::string& id) { leases_.erase(id); }

}  // namespace tally
