// How one range keeps its copies in step (docs/cluster.md, "Replicated
// ranges"). A primary with a backup hands every version it makes to its
// forward call (the sender to the backup's shard) and publishes it, the
// version pulls are given, only once the backup acknowledges it; until
// then pulls are given the last version acknowledged, whose weights are
// kept while later ones are stepped. A backup takes no member's push: it
// makes its versions from the closed steps its primary sends, and is
// promoted when the primary is gone. A range with no backup publishes each
// version as it is made. A new backup catches up first: made from the
// primary's state at some version (CatchUp), it is sent every version
// made since without the primary waiting for it, and once it acknowledges
// the primary's latest, it is in step and versions wait for it again.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock
// (the forward call runs under it, so that the steps reach the sender in
// the order they closed: it must only queue them).
#ifndef TALLY_SERVER_DATA_RANGE_REPLICATION_H_
#define TALLY_SERVER_DATA_RANGE_REPLICATION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/shard_control.h"

namespace tally {

class RangeReplication {
 public:
  // A version as pulls are given it; null weights: the range's current
  // ones (which holds no reader's reference).
  struct Version {
    int64_t version = 0;
    std::shared_ptr<const std::vector<float>> weights;
    std::shared_ptr<const std::string> buffers;
  };

  // `forward`: the primary's sender (null: no backup); `backup`: this
  // range is the backup copy.
  RangeReplication(std::function<void(ClosedStep)> forward, bool backup)
      : forward_(std::move(forward)), backup_(backup) {}
  RangeReplication(const RangeReplication&) = delete;
  RangeReplication& operator=(const RangeReplication&) = delete;

  bool backup() const { return backup_; }
  // Whether versions go to a backup (and, once it is in step, wait for
  // its acknowledgement).
  bool forwarding() const { return forward_ != nullptr; }
  // A backup that holds every version published (and the primary waits
  // for it to hold each later one): one to fail over to.
  bool in_step() const { return forwarding() && !catching_up_; }
  // A promoted backup, until its first step closes: a member may wait
  // there for a version past a step whose push reached only the lost
  // primary.
  bool taken_over() const { return taken_over_; }
  // The version pulls are given.
  const Version& published() const { return published_; }

  // The range goes on from `version` (restored): it is published.
  void Restored(int64_t version, std::shared_ptr<const std::string> buffers) {
    published_ = {version, nullptr, std::move(buffers)};
  }
  // The range is about to step its weights (`current`) into a new
  // version: while forwarding, the version being left keeps them, since
  // pulls may still be given it.
  void Leaving(const std::shared_ptr<const std::vector<float>>& current);
  // Version `version` was made, with `buffers`: published now, or, while
  // forwarding, `closed` (what the backup makes it from) goes to the
  // forward call and the version is published once acknowledged. A
  // promoted backup's first step has closed.
  void Made(int64_t version, std::shared_ptr<const std::string> buffers,
            ClosedStep closed);
  // The backup holds every version up to `version` (the range is at
  // `current`): they are published; a backup catching up that reached
  // `current` is in step. An acknowledgement from another sender than the
  // forward call in force (`sender`, as Start or CatchUp named it; 0: the
  // one given at construction) changes nothing: a sender replaced may
  // still answer. True when the published version moved.
  bool Acknowledge(int64_t version, int64_t current, int64_t sender);
  // The backup is gone: nothing more is forwarded, and the range's
  // current version (`version`, `buffers`) is published now. True when the
  // published version moved.
  bool Stop(int64_t version, std::shared_ptr<const std::string> buffers);
  // A new backup holds the range's state at `from_version`; the range is
  // at `version`. kFailedPrecondition on a backup, or when the range is
  // at another version or has versions still waiting (seed it again).
  absl::Status Start(int64_t version, int64_t from_version,
                     std::function<void(ClosedStep)> forward, int64_t sender);
  // A new backup is made from the range's state at `version`: every
  // version made from now on goes to `forward` and is published at once,
  // until Acknowledge reaches the range's version. kFailedPrecondition on
  // a backup, or while versions wait for another backup.
  absl::Status CatchUp(int64_t version, std::function<void(ClosedStep)> forward,
                       int64_t sender);
  // Whether a backup at `version` makes its next version from `step`:
  // OK (*made_already when it made that version before: a step sent
  // again); kFailedPrecondition on a primary, or + STEP_NOT_OPEN for a
  // step past `version`; kInvalidArgument for a mean that is not
  // `num_params` values or buffers that are not `buffer_bytes` bytes.
  absl::Status CheckClosed(const ClosedStep& step, int64_t version,
                           int64_t num_params, int64_t buffer_bytes,
                           bool* made_already) const;
  // The backup becomes the primary.
  void Promote() {
    backup_ = false;
    taken_over_ = true;
  }

 private:
  Version published_;
  // Versions made after published_, oldest first, waiting for their
  // acknowledgement (the last one's weights are null while they are the
  // range's current ones).
  std::deque<Version> unacked_;
  std::function<void(ClosedStep)> forward_;
  int64_t sender_ = 0;  // whose acknowledgements count
  bool catching_up_ = false;
  bool backup_ = false;
  bool taken_over_ = false;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_RANGE_REPLICATION_H_
