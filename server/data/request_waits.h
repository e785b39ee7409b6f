// How long a shard holds a request for what it waits on: a version to
// pull (weights or rows), a version to save, a hold of its ranges, a
// worker's answer to an offer of shared memory. One named bound each,
// where literals in each handler used to disagree (a weights pull waited
// up to ten minutes, a pull of rows one).
#ifndef TALLY_SERVER_DATA_REQUEST_WAITS_H_
#define TALLY_SERVER_DATA_REQUEST_WAITS_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace tally {

struct RequestWaits {
  // A pull or a save that names no wait (max_wait_ms 0).
  absl::Duration usual = absl::Seconds(30);
  // The most any pull (PullWeights, an Exchange pull, PullRows) or save
  // (SaveRange) is held, whatever it asks.
  absl::Duration most = absl::Minutes(10);
  // The most a HoldRange holds a range still.
  absl::Duration hold_most = absl::Minutes(1);
  // How long the shard's descriptor of a region offered to a worker stays
  // open for the worker to map it (SharedMemorySession): one that has not
  // answered by then has no more use of it.
  absl::Duration offer_answer = absl::Seconds(5);

  // What a request asking `asked_ms` (0: nothing said) is given.
  absl::Duration For(int64_t asked_ms) const {
    return asked_ms > 0 ? std::min(absl::Milliseconds(asked_ms), most) : usual;
  }
  // A hold of `asked_ms`, at least none and at most hold_most.
  absl::Duration Hold(int64_t asked_ms) const {
    return std::clamp(absl::Milliseconds(asked_ms), absl::ZeroDuration(),
                      hold_most);
  }
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_REQUEST_WAITS_H_
