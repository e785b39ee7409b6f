// The members of a range's job, as the coordinator decided them (see
// ParameterShard: SetMembers), with what each pushed that waits for its
// step: the membership decisions (who joins, who leaves, what a leaver's
// last push counts as), the members a step needs to close, the staged sum
// of their pushes, and their buffers and rows once a step closes.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock.
#ifndef TALLY_SERVER_DATA_SHARD_MEMBERS_H_
#define TALLY_SERVER_DATA_SHARD_MEMBERS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/data/shard_member.h"
#include "server/data/staging_pool.h"
#include "server/data/step_rules.h"
#include "server/shard_control.h"

namespace tally {

class ShardMembers {
 public:
  using Map = std::map<std::string, ShardMember>;

  // `pool` is borrowed (its owner's): staged pushes go back to it.
  explicit ShardMembers(StagingPool* pool) : pool_(pool) {}
  ShardMembers(const ShardMembers&) = delete;
  ShardMembers& operator=(const ShardMembers&) = delete;

  Map& all() { return members_; }
  const Map& all() const { return members_; }
  size_t size() const { return members_.size(); }
  // The member `id` (it must be one).
  ShardMember& at(const std::string& id) { return members_.at(id); }

  // OK when (worker_id, incarnation) is a member at `version` of a range
  // not `retired`; else ParameterShard::CheckMember's codes.
  absl::Status Check(const std::string& worker_id, int64_t incarnation,
                     int64_t version, bool retired) const;
  // The members are `specs` from now on (ParameterShard::SetMembers): a
  // worker missing from them is one no more and its staged pushes go; a
  // member's staged push at or past its leave step goes; one for the step
  // before counts as committed. `async`: a leaver is out at once, its last
  // push queued to `apply_queue` unless another shard had its commit.
  void Set(const std::vector<MemberSpec>& specs, bool async,
           std::deque<StagedPush>* apply_queue);
  std::vector<MemberSpec> Specs() const;
  std::vector<MemberProgress> Progress() const;

  // Whether step `version` may close: every member it requires committed
  // it but at most `backups` (at least one did). Then the required ones,
  // in the order of summation (rank, then id), into *required.
  bool ReadyToClose(int64_t version, int64_t backups,
                    std::vector<ShardMember*>* required);
  // The staged pushes of `required` (in rank order) for step `version`,
  // weighted by samples and staleness: their sum, made in the first one's
  // buffer (null when none contributed), and their figures into *tally. A
  // backup's late push is dropped and counted.
  std::unique_ptr<std::vector<float>> SumStaged(
      const std::vector<ShardMember*>& required, int64_t version,
      const StepRules& rules, PushCounts* counts, StepTally* tally);
  // Keeps member m's push `meta` (its gradients `grads`, null without
  // samples) until its step closes, in place of one staged before.
  void Stage(ShardMember& m, const PushMeta& meta,
             std::unique_ptr<std::vector<float>> grads);
  // Every member's staged pushes of steps up to `step` go.
  void ReleaseStaged(int64_t step);
  // Member m's staged pushes go (all of them, or that of `step`).
  void Unstage(ShardMember& m);
  void Unstage(ShardMember& m, int64_t step);
  // async: member m's commit of `step` makes its push (nothing unless
  // `contributed`) one version to apply, with its buffers; what it pushed
  // before and never committed goes.
  StagedPush QueueCommitted(ShardMember& m, int64_t step, bool contributed);

  // Keeps a push's buffers with its member until its step closes.
  void KeepBuffers(const PushMeta& meta);
  // The buffers of closing step `version`: the first of `required` (in
  // rank order) whose push of it counted and carried buffers become
  // *region; every member's of the step and before go.
  void TakeBuffers(const std::vector<ShardMember*>& required, int64_t version,
                   std::shared_ptr<const std::string>* region);
  // Whether no member ranks below `rank` (async: whose buffers count).
  bool Lowest(int rank) const;

  // Step `version` closed: its rows and those before go from every member,
  // and the members whose last step it was leave.
  void EraseRows(int64_t version);
  void DropLeavers(int64_t version);
  // The job ended: every staged push goes, and every member.
  void Retire();

 private:
  StagingPool* const pool_;
  Map members_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARD_MEMBERS_H_
