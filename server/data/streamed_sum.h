// The open step's one sum, made as pushes arrive (streamed sums,
// ParameterShard): each member's push is a part, added block by block,
// each element in rank order, so the sum is bit for bit the staged one. A
// block whose range a lower rank has not added yet waits (its wake call is
// kept: back-pressure, no buffer). A part that can no longer count once
// something of it is in the sum drops the sum: every other member whose
// push was in it pushes again (PUSH_AGAIN), and the sum's generation moves
// on, so that their tokens go stale.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock,
// and with it the members, staging pool and waiters it borrows.
#ifndef TALLY_SERVER_DATA_STREAMED_SUM_H_
#define TALLY_SERVER_DATA_STREAMED_SUM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/data/internal/intervals.h"
#include "server/data/shard_member.h"
#include "server/data/shard_members.h"
#include "server/data/staging_pool.h"
#include "server/data/version_waiters.h"
#include "server/shard_control.h"

namespace tally {

class StreamedSum {
 public:
  // One member's push of the open step in the sum.
  struct Part {
    int64_t incarnation = 0;
    int64_t samples = 0;
    double loss_sum = 0.0;
    int64_t correct = 0;
    float weight = 0;           // samples, scaled by staleness
    internal::Intervals added;  // what of it is in the sum
    bool complete = false;      // pushed whole (FinishStreamed, Accept)
    // Accept's whole push, added once its turn comes.
    std::unique_ptr<std::vector<float>> whole;
  };

  // A sum of `num_params` values; `on`: the range sums its pushes so. The
  // members, pool and waiters are borrowed (the owner's).
  StreamedSum(int64_t num_params, bool on, ShardMembers* members,
              StagingPool* pool, VersionWaiters* waiters)
      : num_params_(num_params),
        on_(on),
        members_(members),
        pool_(pool),
        waiters_(waiters) {}
  StreamedSum(const StreamedSum&) = delete;
  StreamedSum& operator=(const StreamedSum&) = delete;

  // Whether the range sums pushes so (false once it retired).
  bool on() const { return on_; }
  // A push's token: the sum it adds to (tokens of another are stale).
  int64_t generation() const { return generation_; }
  int64_t resets() const { return resets_; }
  bool HasPart(const std::string& id) const { return parts_.count(id) > 0; }
  // The closed step's sum, once Tally said it is whole.
  float* data() { return sum_->data(); }

  // kAborted + PUSH_AGAIN for step `version`.
  static absl::Status PushAgain(int64_t version);

  // A member's push `meta` (checked: not a duplicate, samples > 0) of
  // weight `weight` begins, or begins again: true when it is a new part,
  // false when the same push goes on where it stopped (a retry of a
  // broken stream). Another push of the member in its place goes first.
  bool Begin(const PushMeta& meta, float weight, int64_t version,
             ReadyCalls* ready);
  // The part that push `meta` of token `token` adds to: kAborted +
  // PUSH_AGAIN when the sum moved on or another push replaced it (a part
  // dropped before it added anything keeps the generation);
  // ParameterShard::CheckMember's codes for a member that changed. Null
  // with *duplicate when the member's push of the step is in already.
  absl::StatusOr<Part*> Find(const PushMeta& meta, int64_t token,
                             int64_t version, bool retired, bool* duplicate);
  // Adds values [local, local + n) of `id`'s push: true once in, false
  // when a lower rank has not added them yet (`wake` is kept and called
  // once something changed).
  absl::StatusOr<bool> Add(const std::string& id, Part& part, int64_t local,
                           int64_t n, const float* values,
                           std::function<void()> wake, int64_t version,
                           ReadyCalls* ready);
  // The push is whole: kInvalidArgument unless every value was added.
  absl::Status Finish(Part& part);
  // Accept's whole push `grads` of weight `weight`, added once its turn
  // comes (Progress); the member's earlier part goes first.
  void Keep(const PushMeta& meta, float weight,
            std::unique_ptr<std::vector<float>> grads, int64_t version,
            ReadyCalls* ready);

  // Adds the whole pushes whose turn came, lowest rank first; then every
  // waiting block's wake call goes into `ready`.
  void Progress(int64_t version, ReadyCalls* ready);
  // `id`'s push of the open step counts as nothing: its part goes (and the
  // sum with it if anything of it was added).
  void DropPart(const std::string& id, int64_t version, ReadyCalls* ready);
  // After a membership change: a part whose member is gone or no longer
  // required (or committed as nothing) drops the sum.
  void CheckParts(int64_t version, ReadyCalls* ready);
  // Step `version` closes with `required` (rank order, all committed):
  // their figures into *tally, and the parts go; false (the sum dropped)
  // when a committed push is not whole in the sum.
  bool Tally(const std::vector<ShardMember*>& required, int64_t version,
             StepTally* tally, ReadyCalls* ready);
  // The waiting blocks' wake calls, to call without the lock (the range
  // closed).
  std::vector<std::function<void()>> TakeParked();
  // The job ended: the sum and the parts go, and the range sums no more.
  // The waiting blocks' wake calls, to call without the lock.
  std::vector<std::function<void()>> Retire();

 private:
  // Whether member `id` may add [b, e) now: every lower rank required at
  // `version` has added it or contributes nothing; *first: nobody did.
  bool Turn(const std::string& id, int64_t b, int64_t e, int64_t version,
            bool* first) const;
  // Adds `g` (values of [b, e)) with the part's weight: the sum's first
  // values, or onto them.
  void SumIn(Part& part, int64_t b, int64_t e, const float* g, bool first);
  // Drops the sum: every part but `keep_out`'s must be pushed again (their
  // pushed and committed steps go back; their waits are told PUSH_AGAIN).
  // `keep_out` (may be empty) contributes nothing.
  void Reset(const std::string& keep_out, int64_t version, ReadyCalls* ready);
  // `id` (about to push) ranks below a push already partly in the sum:
  // the sum starts over.
  void RestartIfLate(const std::string& id, int64_t version, ReadyCalls* ready);

  const int64_t num_params_;
  bool on_;
  ShardMembers* const members_;
  StagingPool* const pool_;
  VersionWaiters* const waiters_;
  // Kept from step to step; a new generation at each close or drop.
  std::unique_ptr<std::vector<float>> sum_;
  int64_t generation_ = 1;
  std::map<std::string, Part> parts_;
  std::vector<std::function<void()>> parked_;
  int64_t resets_ = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_STREAMED_SUM_H_
