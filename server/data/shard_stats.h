// A range's figures for ShardMetrics and the status pages: the last step's
// loss and accuracy, samples, refused pushes, the training clock, the
// samples/s of the last few seconds, the runs of steps closed with the same
// members, and each step's latency from its last push and last commit to
// its version being published.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock.
#ifndef TALLY_SERVER_DATA_SHARD_STATS_H_
#define TALLY_SERVER_DATA_SHARD_STATS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "server/data/shard_member.h"
#include "server/data/version_waiters.h"
#include "server/shard_control.h"

namespace tally {

// Pushes refused, and why (ShardMetrics' rejected, stale and late pushes).
struct PushCounts {
  int64_t rejected = 0;  // non-finite values, or a step whose mean was not
  int64_t stale = 0;     // staler than max_staleness
  int64_t late = 0;      // came after their step closed
};

// The seconds from a step's last push, and from its last commit, to its
// version being published (on one shard a push is its own commit; on
// several the commits come with the members' next pulls).
struct PublishTimes {
  double since_push = 0, since_commit = 0;
};

// A run of steps closed with the same members (bsp, ssp).
struct ClosedSpan {
  int64_t first_step = 0, end_step = 0;
  int members = 0;
  uint64_t members_hash = 0;  // FNV-1a of "id/incarnation\n" in rank order
  int64_t samples = 0;
};

class ShardStats {
 public:
  // The most recent runs kept.
  static constexpr size_t kMaxSpans = 32;

  // `clock` is borrowed. `steps`: the job's members share steps (bsp,
  // ssp), whose arrivals and publishing are timed for `observer` (may be
  // null), called for every step that closes.
  ShardStats(const Clock* clock, bool steps,
             std::function<void(const PublishTimes&)> observer);
  ShardStats(const ShardStats&) = delete;
  ShardStats& operator=(const ShardStats&) = delete;

  // A restored range goes on from `m`'s figures, its training time too.
  void GoOnFrom(const ShardMetrics& m);
  // Counted where a push is checked, which may be const.
  PushCounts* counts() const { return &counts_; }
  // The training clock starts (the first pull of the weights); once.
  void Start();
  // A push (or a commit) of `step` is whole here, the range being at
  // `version`.
  void Arrived(int64_t step, int64_t version, bool commit);
  // Step `version` closes with `required` (in rank order) and `samples`.
  void Closed(const std::vector<ShardMember*>& required, int64_t version,
              int64_t samples);
  // Step `closed` is published: the observer's call goes into `ready`.
  void Published(int64_t closed, ReadyCalls* ready);
  // A version was made of `tally`; `finished`: the job's last.
  void Advanced(const StepTally& tally, bool finished);
  std::vector<ClosedSpan> Spans() const {
    return {spans_.begin(), spans_.end()};
  }
  // Loss, accuracy, samples, counts, training time and throughput.
  void Fill(ShardMetrics* m) const;

 private:
  // When each open step's last push and last commit so far arrived.
  struct LastArrivals {
    absl::Time push = absl::InfinitePast(), commit = absl::InfinitePast();
  };
  const Clock* clock_;
  const bool steps_;
  const std::function<void(const PublishTimes&)> observer_;
  double last_loss_ = 0.0;
  double last_accuracy_ = 0.0;
  int64_t samples_total_ = 0;
  mutable PushCounts counts_;
  absl::Time started_ = absl::InfinitePast();
  absl::Time finished_ = absl::InfinitePast();
  // (close time, samples so far), about five seconds of them.
  std::vector<std::pair<absl::Time, int64_t>> closes_;
  std::map<int64_t, LastArrivals> last_at_;
  std::deque<ClosedSpan> spans_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARD_STATS_H_
