// One range of one job's parameters on one server: master weights,
// optimizer state, bulk-synchronous aggregation and versioned pulls. A job
// split over several shards has one ParameterShard per range, each on its
// own server; they agree on every step because membership is not theirs to
// decide (see below).
//
// A step, on every shard alike. Step t is open while version() == t.
//   1. Accept: a member's push of step t (its batch's mean gradient over
//      this range, with its sample count) is checked and staged whole, one
//      staged push per member and open step.
//   2. Commit: once the member's push of t reached every shard, its next
//      pull says so (committed step t, and whether it contributed: a push
//      refused as non-finite on any shard contributes on none).
//   3. Close: when every member required at t has committed t, the staged
//      gradients are summed in rank order (so every shard count and arrival
//      order gives bit-identical sums), weighted by samples and divided by
//      their total; the optimizer runs, the version becomes t + 1 and
//      waiting pulls are released.
// Streamed sums (bsp without backup workers, the default): instead of
// staging a push whole, the shard adds it to the step's one sum block by
// block as it arrives (BeginStreamed, AddStreamed, FinishStreamed), each
// element in rank order, so the sum is bit for bit the staged one. A block
// whose range a lower rank has not added yet waits (its reader stops
// reading: back-pressure, no buffer). A push already in the sum that can
// no longer count (refused part-way as non-finite, its member left, or
// committed as not contributed) cannot be taken out again: the step's sum
// is dropped and every member whose push was in it pushes again
// (ABORTED + PUSH_AGAIN on its push or pull). Memory: one sum per shard
// instead of one buffer per member (docs/decisions.md).
//
// A step never closes on the strength of pushes alone: a worker that dies
// between its pushes to two shards has committed on neither, so no shard
// counts a push another shard lacks.
//
// Buffers (a Python model's running statistics; Options::buffer_bytes):
// the range at offset 0 keeps a buffer region. A push may carry the
// pusher's buffers after its step's forward pass; when the step closes,
// the region becomes those of the lowest rank whose push of it counted
// (async: a push applied from the lowest member's rank), as DDP's
// broadcast_buffers makes rank 0's every rank's. Pulls return the region
// with the weights. It is never summed nor stepped.
//
// The job's consistency rule (Options::consistency, docs/cluster.md;
// StepRules) changes what is open and when things close:
//   bsp     as above: one open step; with backup_workers b, a step closes
//           once all but b required members committed it, and the others'
//           pushes of it are late (STEP_CLOSED, counted).
//   ssp(s)  steps version() .. version() + s are open: a member may push
//           step c computed from any version in [c - s, c]; steps still
//           close in order, each once every required member committed it.
//           ssp(0) is bsp.
//   async   no step is shared: a member's pushes are its own clock, each
//           committed push is applied on its own (in commit order) and is
//           one version.
// A gradient computed from version b and applied as version v has
// staleness v - b (ssp: its step minus b); with lr_scaling it weighs
// 1 / max(1, staleness) of its samples, and beyond max_staleness it is
// refused (STALE_GRADIENT, counted).
//
// Membership is the coordinator's: SetMembers gives every member with the
// steps it belongs to, [join_step, leave_step). To change it consistently
// the coordinator first Holds every shard of the job (no step closes; each
// reports its version and every member's progress), decides the steps from
// all the reports, then sets them everywhere, which releases the hold. A
// hold not released by its deadline lapses (the old membership stands).
// AddMember/RemoveMember are the one-shard forms of the same decisions.
//
// The shard holds the lock and the step protocol (check a push, accept
// it, commit, close the step, advance the version) and owns its parts, each
// a class of its own that it guards with its lock: the members and their
// staged pushes (ShardMembers), the consistency rule's checks (StepRules),
// the streamed sum (StreamedSum), the staging buffers (StagingPool), the
// rows of its tables (RowStaging), the waiters (VersionWaiters), the
// schedule and plan (ShardSchedule), the weights and their bfloat16 copy
// (PublishedWeights), the version pulls are given and the backup copy
// kept in step (RangeReplication), and its figures (ShardStats).
//
// Replicated ranges (Options::forward, Options::backup; RangeReplication,
// docs/cluster.md): a primary hands every version it makes to its forward
// call, which sends it to the range's backup, and publishes it to pulls
// (WhenVersion, Snapshot) only once Acknowledge says the backup holds it;
// until then pulls see the last version acknowledged. The backup takes no
// member's push: ApplyClosed steps its optimizer with the primary's mean,
// so that both hold the same bits, and Promote makes it the primary when
// its primary is gone. A version made and not yet acknowledged keeps its
// weights while a later one is stepped (a copy per step).
//
// Thread-safe: every method may be called from any thread. Callbacks given
// to WhenVersion run without the shard's lock held.
#ifndef TALLY_SERVER_DATA_SHARD_H_
#define TALLY_SERVER_DATA_SHARD_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/optim/optimizer.h"
#include "common/spec/consistency.h"
#include "server/data/published_weights.h"
#include "server/data/range_replication.h"
#include "server/data/row_staging.h"
#include "server/data/shard_member.h"
#include "server/data/shard_members.h"
#include "server/data/shard_schedule.h"
#include "server/data/shard_stats.h"
#include "server/data/sparse_table.h"
#include "server/data/staging_pool.h"
#include "server/data/step_rules.h"
#include "server/data/streamed_sum.h"
#include "server/data/version_waiters.h"
#include "server/shard_control.h"

namespace tally {

class ParameterShard {
 public:
  // What a range is given at construction; nothing changes it later.
  struct Options {
    Options();  // the defaults below (declared: a default argument names it)
    // The job's consistency rule (default: bsp).
    ConsistencySpec consistency;
    // Pushes of more samples than this (the job's batch size) are refused,
    // so the weighted sums and counters stay bounded. 0: no bound.
    int64_t max_samples = 0;
    // The range keeps the job's buffer region (above): pushes may carry
    // buffers of exactly `buffer_bytes` bytes. 0: it keeps none, and a push
    // with buffers is refused (kInvalidArgument).
    int64_t buffer_bytes = 0;
    // Whether pushes of the open step are summed as they arrive where the
    // rule allows (streamed sums, above). Such a range makes its sum
    // buffer at construction, not at the step's first push.
    bool streamed_sums = true;
    // The plan the range is installed with (a restored one carries none of
    // its own).
    int64_t plan = 0;
    // Called, without the shard's lock, for every step that closes (bsp
    // and ssp; async has no steps) with the seconds from the step's last
    // push, and from its last commit, to its version being published.
    std::function<void(const PublishTimes&)> publish_observer;
    // The job's embedding tables (model.embeddings): the rows this range's
    // slot owns. Null: the job has none.
    std::shared_ptr<SparseTables> tables;
    // A replicated range's primary: called under the range's lock (it must
    // only queue) with every version the range makes, in order; each is
    // published once Acknowledge reaches it. Null: each is published as it
    // is made.
    std::function<void(ClosedStep)> forward;
    // The range is a backup copy (above): no pushes, ApplyClosed.
    bool backup = false;
  };

  // `weights` are the initial weights (the shard owns them from now on).
  ParameterShard(std::vector<float> weights,
                 std::unique_ptr<Optimizer> optimizer, const Clock* clock,
                 Options options = {});
  ParameterShard(const ParameterShard&) = delete;
  ParameterShard& operator=(const ParameterShard&) = delete;

  // What a checkpoint takes of the job's tables with the range's state
  // (SparseTables::TakeSave), filled in by Save under the same lock: the
  // rows as of the state's version.
  struct TableCapture {
    bool base = false;  // every row, not a delta
    bool taken = false;
    TableRowsFile file;
  };
  // A consistent copy for a checkpoint (the optimizer state is copied; the
  // weights are the immutable snapshot), and the tables' rows into
  // `capture` when given and the job has tables.
  ShardState Save(TableCapture* capture = nullptr) const;
  // The state at exactly version `v`, for a checkpoint consistent across a
  // job's shards: if the shard is below v, it closes steps up to v and no
  // further until the state is taken. Calls done(state), or
  // done(kFailedPrecondition + STEP_CLOSED(its version)) when the shard is
  // past v already, or done(kDeadlineExceeded) at `deadline` (checked by
  // ExpireWaiters).
  void SaveAt(int64_t v, absl::Time deadline,
              std::function<void(absl::StatusOr<ShardState>)> done,
              std::shared_ptr<TableCapture> capture = nullptr);
  // A shard that goes on from `state`, with no members yet. `optimizer` is
  // a fresh one for the job; it takes state.optimizer (kInvalidArgument when
  // that does not fit), or stays fresh when that has no step and no slots
  // (initial weights given). A retired state gives a retired shard.
  static absl::StatusOr<std::unique_ptr<ParameterShard>> Restore(
      const ShardState& state, std::unique_ptr<Optimizer> optimizer,
      const Clock* clock, Options options = {});

  int64_t num_params() const { return num_params_; }

  // Members, keyed by worker id, as the coordinator decided (see above): a
  // worker missing from `members` is no member any more; its staged push
  // goes. A member's staged push for a step at or past its leave step goes;
  // one for the step before it counts as committed (another shard counted
  // it, so this one has it too). With `hold_id`, releases that hold:
  // kFailedPrecondition (nothing changed) when that hold is not the one in
  // force (it lapsed, or another replaced it). With a plan (a worker
  // joined: the job's plan `plan.plan` runs `plan.total_steps` versions),
  // the plan and the members are taken together or not at all: an older
  // or the same plan changes nothing; kInvalidArgument when the range is
  // past that total already.
  absl::Status SetMembers(const std::vector<MemberSpec>& members,
                          int64_t hold_id = 0, const PlanChange& plan = {});
  // Freezes step closing until SetMembers(…, hold_id) or `deadline` (checked
  // by ExpireWaiters), and reports the version and each member's progress.
  HoldReport Hold(int64_t hold_id, absl::Time deadline);

  // One-shard membership: joins at the open step, or the next one if the
  // open step already has pushes; leaves before the open step, or after it
  // if it already committed it. A new incarnation replaces the old one.
  void AddMember(const std::string& worker_id, int64_t incarnation);
  void RemoveMember(const std::string& worker_id);
  // OK when (worker_id, incarnation) is a member; else kPermissionDenied +
  // NOT_A_MEMBER, or kFailedPrecondition with JOB_ENDED (retired) or
  // REGISTER_AGAIN (another incarnation is the member).
  absl::Status CheckMember(const std::string& worker_id,
                           int64_t incarnation) const;

  // Sets the schedule (total steps, steps per epoch) the first time (the
  // coordinator does, when the job starts); later calls must agree:
  // kFailedPrecondition + SCHEDULE_MISMATCH otherwise, changing nothing.
  // `fingerprint` (a worker's dataset files; empty: no claim) likewise: the
  // first fixes it, another is refused. A claim names the plan it follows
  // (Schedule.plan): an older one than the range's is refused with
  // kAborted + PLAN_CHANGED (the step: the range's plan), a newer one with
  // kUnavailable (the plan is on its way here), before its totals are
  // compared.
  absl::Status SetSchedule(int64_t total_steps, int64_t steps_per_epoch,
                           const std::string& fingerprint = "",
                           int64_t plan = 0);

  // The range as its status shows it, taken at once: the members as the
  // coordinator decided them, every member's progress (for the straggler
  // report), and the steps it closed lately, by membership (bsp, ssp): runs
  // of steps closed with the same members, oldest first, the last
  // ShardStats::kMaxSpans.
  struct Report {
    std::vector<MemberSpec> members;
    std::vector<MemberProgress> progress;
    std::vector<ClosedSpan> closed;
  };
  Report Describe() const;

  // Checks a push before its data is read (codes and their ErrorReason,
  // proto/errors.h):
  //   kFailedPrecondition + JOB_ENDED      the job ended (retired)
  //   kPermissionDenied + NOT_A_MEMBER     not a member (or past its leave)
  //   kFailedPrecondition + REGISTER_AGAIN stale incarnation
  //   kAborted + STEP_CLOSED(version)      the step closed without this push,
  //                                        or training is over: pull, go on
  //   kAborted + STEP_NOT_OPEN(version)  a step beyond the open one
  //   kAborted + JOIN_LATER(join step)   required only from then
  //   kAborted + STALE_GRADIENT(version)   staler than max_staleness
  //   kInvalidArgument                     negative samples, a base version
  //                                        the rule does not allow, buffers
  //                                        of another size (or none kept)
  // OK with *duplicate = true when this worker already pushed this step.
  absl::Status CheckPush(const PushMeta& meta, bool* duplicate) const;

  // Stages a complete, validated push: `grads` (num_params() floats, from
  // AcquireStaging; null when meta.samples == 0) is kept until the step
  // closes. Re-checks as CheckPush; a duplicate is acknowledged
  // (*duplicate = true) and its buffer handed back.
  absl::Status Accept(const PushMeta& meta,
                      std::unique_ptr<std::vector<float>> grads,
                      bool* duplicate);
  // Accept with a copy of `grads` (tests, benchmarks).
  absl::Status Accept(const PushMeta& meta, const float* grads,
                      bool* duplicate);

  // Whether pushes of the open step are summed as they arrive (streamed
  // sums, above) rather than staged: bsp (ssp(0)) without backup workers,
  // unless Options::streamed_sums is false.
  bool StreamsPushes() const;

  // A push with samples > 0 whose header CheckPush passed (not a
  // duplicate), to be streamed: its token for AddStreamed and
  // FinishStreamed. A push begun again (a retry of a broken stream) goes on
  // where the last one stopped. Errors as CheckPush, and kInvalidArgument
  // for a push after its member's commit of the step.
  absl::StatusOr<int64_t> BeginStreamed(const PushMeta& meta);
  // Adds values [local, local + n) of the push (decoded, finite; indices
  // into this range) to the step's sum. True once added (or already in);
  // false when a lower rank's push of that range is not in yet: `wake` is
  // kept and called once, without the shard's lock, when something changed
  // (then call again). The push was validated by BeginStreamed and is not
  // again: only the shard, the member and the token are looked at
  // (StreamedSum::Find). kAborted + PUSH_AGAIN: the sum was dropped or
  // moved on (push the step again); kFailedPrecondition + REGISTER_AGAIN or
  // kPermissionDenied + NOT_A_MEMBER: the member changed; the shard's
  // closing status once it is closed.
  absl::StatusOr<bool> AddStreamed(const PushMeta& meta, int64_t token,
                                   int64_t local, int64_t n,
                                   const float* values,
                                   std::function<void()> wake);
  // The push's end, once every element was added (else kInvalidArgument,
  // the rest still welcome); *duplicate when another stream of it finished
  // it first. Checked as AddStreamed.
  absl::Status FinishStreamed(const PushMeta& meta, int64_t token,
                              bool* duplicate);

  // The member says its push of `step` reached every shard (a pull carries
  // this); with contributed = false it counts as nothing here either. A
  // commit for a step that is not open, or from a non-member, changes
  // nothing. False (nothing recorded: send it again) only in async while
  // the coordinator holds the job: a commit that reached one shard before
  // its new membership and another after could count on one only.
  bool Commit(const std::string& worker_id, int64_t incarnation, int64_t step,
              bool contributed);

  // Counts a refused push (non-finite values, ...). When the pusher is a
  // required member of the open step, its push is settled as nothing here.
  void Reject(const PushMeta& meta);

  // A member's pull of rows as it comes, before it waits for its version
  // (a waiting pull holds its request): CheckMember's codes;
  // kInvalidArgument for a job without tables here, or a request
  // SparseTables::CheckRequest refuses (too many blocks or values, rows
  // outside their table or not this slot's, a row listed twice).
  absl::Status CheckPullRows(const v1::PullRowsRequest& req) const;
  // A member's pull of rows (call once WhenVersion saw the version it
  // wants): the rows as of the current version, made where missing.
  // CheckPullRows' codes (checked again); kResourceExhausted past the
  // table budget.
  absl::Status ReadRows(const v1::PullRowsRequest& req,
                        v1::PullRowsResponse* resp);
  // A member's row gradients of a step, staged until the step closes; when
  // it does, those of the members whose push of it counted are summed in
  // rank order, weighted by samples and divided by the step's samples, as
  // the dense gradient is, and each table's optimizer steps the rows.
  // Piece 0 replaces what the member staged for the step (*replaced),
  // later pieces add to it (piece k again replaces piece k). With
  // tables: async (ConsistencySpec::tables_async) each piece is stepped
  // as it comes instead, with the member's own mean gradients, once (a
  // piece sent again is not stepped again). Codes: CheckMember's;
  // kAborted + STEP_CLOSED,
  // STEP_NOT_OPEN or JOIN_LATER as for a push; kFailedPrecondition when
  // the member committed the step already; kInvalidArgument for a
  // request SparseTables::CheckRequest refuses (as CheckPullRows), values
  // of another size, samples outside [0, the batch size], and +
  // NON_FINITE for a NaN or infinity.
  absl::Status StageRows(const v1::PushRowsRequest& req, bool* replaced);

  int64_t version() const;
  // The current weights and their version (an immutable snapshot), the
  // job's step count (0 until a worker set the schedule) and the buffer
  // region of that version (null while it has none); any out pointer may
  // be null.
  std::shared_ptr<const std::vector<float>> Snapshot(
      int64_t* version, int64_t* total_steps = nullptr,
      std::shared_ptr<const std::string>* buffers = nullptr) const;
  ShardMetrics Metrics() const;
  // The bfloat16 encoding of the snapshot Snapshot() returned with
  // `version`: made once per version, however many workers pull it in
  // bfloat16 (the latest is kept: half the range's float32 bytes). Keyed by
  // the version: snapshot buffers are reused for later versions.
  std::shared_ptr<const std::vector<uint16_t>> Bfloat16Of(
      const std::shared_ptr<const std::vector<float>>& snapshot,
      int64_t version);

  // Staging buffers of num_params() floats for pushes in flight or staged,
  // recycled (StagingPool). At most (2 + s) * members + 4 are out at once
  // (s: the ssp staleness, else 0), so that a flood of open push streams
  // cannot exhaust the server's memory (kResourceExhausted beyond that).
  absl::StatusOr<std::unique_ptr<std::vector<float>>> AcquireStaging();
  void ReleaseStaging(std::unique_ptr<std::vector<float>> buffer);

  // WhenVersion for member `worker_id` about to compute step `clock`: the
  // version the consistency rule lets it start from (bsp: clock; ssp(s):
  // clock - s; async: none), and at least `min_version`. The member's
  // progress says it waits meanwhile, and then the step it got weights
  // for (bsp, ssp: the clock or the version, if that is past it).
  void WhenClock(const std::string& worker_id, int64_t clock,
                 int64_t min_version, absl::Time deadline,
                 std::function<void(absl::Status)> done);
  // Calls `done(OK)` once version() >= v, or `done(kDeadlineExceeded)` at
  // `deadline` (checked by ExpireWaiters), or done(kFailedPrecondition +
  // JOB_ENDED) for a wait still held when Retire runs (a wait begun after
  // it lasts to its deadline). The first call starts the training
  // clock. A member's wait (`worker_id`, WhenClock's) for a step its push
  // is no longer in (the sum was dropped) is kAborted + PUSH_AGAIN, at once
  // or when the sum drops.
  void WhenVersion(int64_t v, absl::Time deadline,
                   std::function<void(absl::Status)> done,
                   const std::string& worker_id = "");
  // Releases waiters and a hold whose deadlines passed.
  void ExpireWaiters();

  // ---- Replication (above) ----
  // The primary's backup holds every version up to `version`: they are
  // published. An older acknowledgement changes nothing.
  // `sender`: the forwarder's id as StartForwarding or SaveForBackup named
  // it (0: Options::forward's); another's changes nothing. While a new
  // backup catches up, an acknowledgement of the range's version makes it
  // in step instead (every version is published already).
  void Acknowledge(int64_t version, int64_t sender = 0);
  // Whether versions wait for Acknowledge (a forward call was given and not
  // stopped). Stopped (the backup is gone): every version made is
  // published now, and later ones as they are made, unforwarded.
  void StopForwarding();
  // A backup holds this range's state at `from_version` already: versions
  // made from now on go to `forward` and wait for Acknowledge.
  // kFailedPrecondition when the range is at another version (it moved
  // on: seed the backup again), or is itself a backup.
  absl::Status StartForwarding(int64_t from_version,
                               std::function<void(ClosedStep)> forward,
                               int64_t sender = 0);
  // A new backup is made from the state returned (this range's current
  // one, with no hold): every version made from now on goes to `forward`
  // and is published at once while the backup catches up; once
  // Acknowledge reaches the range's version, the backup is in step and
  // later versions wait for it. kFailedPrecondition on a backup copy, a
  // retired range, or one whose versions wait for another backup.
  absl::StatusOr<ShardState> SaveForBackup(
      std::function<void(ClosedStep)> forward, int64_t sender = 0);
  // A backup makes the version after `step.step` as its primary made it.
  // OK for a step it made already (a forward sent again). kFailedPrecondition
  // + STEP_NOT_OPEN (its version) for a step past its version (it lacks
  // the steps between: seed it again), kFailedPrecondition for a range that
  // is no backup or ended, kInvalidArgument for a mean of another length.
  absl::Status ApplyClosed(const ClosedStep& step);
  // A backup becomes the primary (its primary is gone): it takes the
  // members' pushes from now on, from its version. A member that waits
  // for a later version without having pushed the open step here (its
  // push went to the lost primary alone) is told PUSH_AGAIN, as is one
  // whose commit comes without its push.
  void Promote();
  // The range's copies, as its status shows them.
  struct Copies {
    bool backup = false;  // this is the backup copy
    // A primary whose backup holds every version it made.
    bool backup_in_step = false;
    // The version pulls are given: version(), or less while versions
    // wait for their backup.
    int64_t published_version = 0;
  };
  Copies copies() const;
  // The range is gone from its server: waiters are released with `why` (a
  // range that moves elsewhere says kUnavailable: retry), and every later
  // wait (WhenVersion, SaveAt) fails with it at once, so nothing waits on a
  // range nobody ticks any more.
  void Close(absl::Status why);

  // The job ended: waiters are released (kFailedPrecondition + JOB_ENDED),
  // aggregation and optimizer memory freed, keeping only the final weights
  // (for fetching); later pushes get kFailedPrecondition. Returns the
  // job's tables as they ended (frozen: SparseTables::Freeze), which
  // outlive the range; null without tables.
  std::shared_ptr<const SparseTables> Retire();

 private:
  using Ready = ReadyCalls;

  // Closes every step that may close (async: applies committed pushes)
  // unless a hold or a save is in force; collects released waiters into
  // `ready` (run them after unlocking).
  void MaybeCloseLocked(Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the open step (bsp, ssp) if it may: its sum (streamed, or of
  // the staged pushes) becomes the mean the optimizer steps with, its rows
  // are applied and its buffers taken; false if not.
  bool CloseStepLocked(Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Steps the optimizer with `mean` (if tally.samples > 0) and makes the
  // weights version + 1: published at once, or forwarded (the forward call
  // is made under the lock, in order: it must only queue) and published
  // once acknowledged.
  void AdvanceLocked(const StepTally& tally, const float* mean)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckMember's codes, and kUnavailable on a backup (its primary takes
  // the pushes: the worker's map is stale).
  absl::Status CheckMemberLocked(const std::string& worker_id,
                                 int64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ShardMetrics MetricsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ShardState SaveLocked(TableCapture* capture) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t num_params_;
  const Clock* clock_;  // borrowed
  // The job's rule and bounds: fixed at construction, read without the lock.
  const StepRules rules_;

  mutable absl::Mutex mu_;
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  PublishedWeights weights_ ABSL_GUARDED_BY(mu_);
  ShardSchedule schedule_ ABSL_GUARDED_BY(mu_);
  StagingPool pool_ ABSL_GUARDED_BY(mu_);
  ShardMembers members_ ABSL_GUARDED_BY(mu_);
  VersionWaiters waiters_ ABSL_GUARDED_BY(mu_);
  StreamedSum sum_ ABSL_GUARDED_BY(mu_);
  RowStaging rows_ ABSL_GUARDED_BY(mu_);
  ShardStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const std::string> buffers_ ABSL_GUARDED_BY(mu_);
  // The version pulls are given, and the copies kept in step.
  RangeReplication replica_ ABSL_GUARDED_BY(mu_);
  // async: committed pushes in commit order, applied as holds allow.
  std::deque<StagedPush> apply_queue_ ABSL_GUARDED_BY(mu_);
  int64_t hold_id_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no hold
  absl::Time hold_deadline_ ABSL_GUARDED_BY(mu_);
  // Versions a SaveAt waits for: no step closes at or past the lowest.
  std::multiset<int64_t> save_at_ ABSL_GUARDED_BY(mu_);
  bool retired_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // not OK once Closed
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARD_H_
