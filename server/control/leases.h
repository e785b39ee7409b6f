// Leases: who is registered with the coordinator (workers, shard
// processes), under which incarnation, and until when. A holder renews its
// lease with every heartbeat; one whose lease runs out is expired at the
// next tick, and must register again, getting a new incarnation.
// Incarnations are random 63-bit numbers from the kernel (getrandom): a
// peer cannot guess another's from its own, and one from before a
// coordinator restart is stale after it (a repeat is a 2^-63 chance).
//
// Not thread-safe: the coordinator's lock guards it.
#ifndef TALLY_SERVER_CONTROL_LEASES_H_
#define TALLY_SERVER_CONTROL_LEASES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tally {

class Leases {
 public:
  Leases(absl::Duration timeout, absl::Time now);

  absl::Duration timeout() const { return timeout_; }

  // A new holder (or a new incarnation of `id`); its incarnation. A lease
  // granted `forever` never runs out (the coordinator's own shard).
  int64_t Grant(const std::string& id, absl::Time now, bool forever = false);
  // kFailedPrecondition + REGISTER_AGAIN unless (id, incarnation) is the
  // live registration.
  absl::Status Check(const std::string& id, int64_t incarnation) const;
  // Check, then extends the lease from `now`.
  absl::Status Renew(const std::string& id, int64_t incarnation,
                     absl::Time now);
  // The holders whose lease ran out before `now`, no longer holders.
  std::vector<std::string> Expire(absl::Time now);
  // (id, incarnation)'s lease runs out at `now`: Check and Renew refuse it
  // from now on, and the next Expire drops it. False when that is not the
  // live registration.
  bool End(const std::string& id, int64_t incarnation, absl::Time now);
  void Revoke(const std::string& id);

 private:
  struct Lease {
    int64_t incarnation = 0;
    absl::Time expiry;
    bool ended = false;  // End: refused from now on, dropped by Expire
  };
  // A fresh random incarnation, positive, not held by anyone now.
  int64_t NewIncarnation() const;

  const absl::Duration timeout_;
  std::map<std::string, Lease> leases_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_LEASES_H_
