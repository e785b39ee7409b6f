// The contract between tally-server's two wings: the control plane
// (server/control/: the coordinator, which decides) and the data plane
// (server/data/: parameter shards, which hold and step the weights). The
// control wing reaches the data wing only through ShardControl, which the
// server's start-up code hands it: in process for the coordinator's own
// shard (server/data/local_shard_control.h), over ShardService for a shard
// process (server/control/remote_shard_control.h). The seam also lets tests
// replace a shard.
//
// Besides the interface, the vocabulary both wings speak: a push's
// metadata, a member as the coordinator decides it, a member's progress as
// a shard reports it, a range's state, and its one codec (RangeStateCodec
// below) to and from the wire's v1::RangeState.
//
// Every ShardControl call is bounded (`wait`, or the control plane's
// default of a few seconds); a shard that does not answer is kUnavailable
// or kDeadlineExceeded and the coordinator tries again later. Thread-safe.
#ifndef TALLY_SERVER_SHARD_CONTROL_H_
#define TALLY_SERVER_SHARD_CONTROL_H_

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/optim/optimizer.h"
#include "proto/tally.pb.h"

namespace tally {

struct PushMeta {
  std::string worker_id;
  int64_t incarnation = 0;
  int64_t step = 0;
  int64_t base_version = 0;
  int64_t samples = 0;
  double loss_sum = 0.0;
  int64_t correct = 0;
  // A Python model's buffers after the step (PushHeader.buffers); null:
  // none.
  std::shared_ptr<const std::string> buffers;
};

// A job's embedding table on one shard (server/data/sparse_table.h).
struct TableMetrics {
  std::string name;
  int64_t rows = 0;           // held here now
  int64_t bytes = 0;          // their values and optimizer slots
  int64_t rows_pulled = 0;    // rows sent to workers
  int64_t rows_created = 0;   // of those, made at that pull (misses)
  int64_t rows_pushed = 0;    // row gradients received
  int64_t rows_applied = 0;   // rows the optimizer stepped
  int64_t rows_evicted = 0;   // dynamic: rows dropped, not stepped lately
  int64_t rows_filtered = 0;  // dynamic: pulls of ids without a row yet
                              // (min_count), read as initial values
  int64_t pulled_bytes = 0;   // of row values sent (rows * dim * 4)
  int64_t pushed_bytes = 0;   // of row gradients received
  int64_t pull_wire_bytes = 0;  // whole PullRows answers (with row numbers)
  int64_t push_wire_bytes = 0;  // whole PushRows requests
};

struct ShardMetrics {
  int64_t version = 0;
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 0;
  double loss = 0.0;      // last closed step
  double accuracy = 0.0;  // last closed step
  double samples_per_sec = 0.0;
  int64_t samples = 0;
  int64_t rejected_pushes = 0;
  int64_t stale_pushes = 0;  // refused: staler than max_staleness
  int64_t late_pushes = 0;   // came after their step closed
  int64_t sum_resets = 0;    // streamed sums dropped (PUSH_AGAIN)
  int members = 0;
  double train_seconds = 0.0;  // first schedule (pull) to last close, or now
  std::vector<TableMetrics> tables;  // the job's tables' rows held here
};

// One member as the coordinator decides it.
struct MemberSpec {
  std::string worker_id;
  int64_t incarnation = 0;
  int rank = 0;                  // the order of summation
  int64_t join_step = 0;         // required from this step
  int64_t leave_step = kNoStep;  // ... up to this one, excluded
  // Its push of leave_step - 1 was committed as nothing on some shard (it
  // was refused there): a shard that staged it drops it.
  bool last_refused = false;
  static constexpr int64_t kNoStep = INT64_MAX;
};

// A member's progress on this shard, for the coordinator's decisions.
struct MemberProgress {
  std::string worker_id;
  int64_t incarnation = 0;
  int64_t pushed_step = -1;     // last step it pushed (staged or settled)
  int64_t committed_step = -1;  // last step it committed
  // The step its last served pull was for (WhenClock), -1 before; and
  // whether a pull of it waits here now.
  int64_t clock = -1;
  bool waiting = false;
  bool last_refused = false;  // its commit of committed_step said: nothing
};

struct HoldReport {
  int64_t version = 0;
  std::vector<MemberProgress> members;
};

// What a checkpoint keeps of a shard: the weights of the last closed step
// with the optimizer state that goes with them, and the metrics (version,
// schedule, counters; members and samples_per_sec are not restored). The
// open step's partial sum is not kept: after a restart that step is
// computed again.
struct ShardState {
  ShardMetrics metrics;  // metrics.version: the version of `weights`
  bool retired = false;
  std::shared_ptr<const std::vector<float>> weights;  // of `version`
  OptimizerState optimizer;                           // empty once retired
  // The range at offset 0 of a Python model: its buffer region (empty:
  // not set yet).
  std::shared_ptr<const std::string> buffers;
  // A job with tables checkpointed by its shards (--table_dir): the files
  // that hold its rows at `version` (a range's save: its own chain; a
  // job's checkpoint: every range's, in shard-map order).
  std::vector<std::string> table_files;
};

// A version a primary made, as its backup makes it again (replicated
// ranges, docs/cluster.md): the step it closed (the version it made is
// step + 1), what its optimizer stepped with, and the buffer region after
// it. Both copies step the same optimizer with the same mean from the same
// state, so they hold the same bits.
struct ClosedStep {
  int64_t step = 0;
  int64_t samples = 0;  // 0: the weights stayed (nothing counted)
  double loss_sum = 0.0;
  int64_t correct = 0;
  // The mean gradient the optimizer stepped with (the range's length);
  // null when samples == 0.
  std::shared_ptr<const std::vector<float>> mean;
  // The buffer region after the step (null: the range keeps none).
  std::shared_ptr<const std::string> buffers;
};

// A job's new plan, set with its membership (a worker joined: the schedule
// changed, ParameterShard::SetMembers). plan 0: unchanged.
struct PlanChange {
  int64_t plan = 0;
  int64_t total_steps = 0;
};

class ShardControl {
 public:
  virtual ~ShardControl() = default;
  virtual absl::Status Install(const v1::InstallRangeRequest& req) = 0;
  // These name the placement they are about (map_version; 0: any): a range
  // placed again since is not touched (kNotFound).
  virtual absl::StatusOr<HoldReport> Hold(const std::string& job_id,
                                          int64_t map_version,
                                          int64_t hold_id,
                                          absl::Duration hold) = 0;
  virtual absl::Status SetMembers(const std::string& job_id,
                                  int64_t map_version,
                                  const std::vector<MemberSpec>& members,
                                  int64_t hold_id,
                                  const PlanChange& plan = {}) = 0;
  virtual absl::Status Retire(const std::string& job_id,
                              int64_t map_version) = 0;
  // Forgets the job's range (`ended`: the job is over, ShardHost::Drop). A
  // shard process is told by its next heartbeat answer instead
  // (drop_jobs): this is a no-op for it.
  virtual void Drop(const std::string& job_id, bool ended) = 0;
  // The range's state at exactly `version`, waiting at most `wait` for it.
  // `count` is the range's length as placed: a shard that sends more than
  // that many values in any part is cut off at once (kDataLoss), so a
  // rogue shard process cannot make the caller hold more than the range.
  virtual absl::StatusOr<ShardState> Save(const std::string& job_id,
                                          int64_t map_version, int64_t version,
                                          int64_t count, absl::Duration wait,
                                          bool weights_only) = 0;
  // An ended job's table rows held here (ShardHost::ReadTable): up to
  // `max_rows` from `start` on, in order (the caller checks that they
  // are: a shard process's answer is not trusted).
  virtual absl::StatusOr<v1::ReadTableResponse> ReadTable(
      const std::string& job_id, int64_t map_version, int table,
      int64_t start, int64_t max_rows) = 0;
  // The shard's ranges and their progress.
  virtual absl::StatusOr<std::vector<v1::RangeStatus>> Status() = 0;
  // Replicated ranges (docs/cluster.md; ShardHost::Promote, SetBackup):
  // the job's backup copy here becomes its primary (its version); the
  // primary copy here sends its closed steps to `backup_address` from
  // `from_version` on (empty: to none). A shard without them (a test's)
  // answers kUnimplemented.
  virtual absl::StatusOr<int64_t> Promote(const std::string& /*job_id*/,
                                          int64_t /*map_version*/) {
    return absl::UnimplementedError("no replicated ranges here");
  }
  virtual absl::Status SetBackup(const std::string& /*job_id*/,
                                 int64_t /*map_version*/,
                                 const std::string& /*backup_address*/,
                                 int64_t /*from_version*/) {
    return absl::UnimplementedError("no replicated ranges here");
  }
  // The primary copy here saves its state as it is (no hold) and sends
  // every version it makes from then on to `backup_address`, without
  // waiting for it until the backup is in step (ShardHost::SeedBackup);
  // the state, for installing the backup. `count` as Save's.
  virtual absl::StatusOr<ShardState> SeedBackup(
      const std::string& /*job_id*/, int64_t /*map_version*/,
      const std::string& /*backup_address*/, int64_t /*count*/) {
    return absl::UnimplementedError("no replicated ranges here");
  }
  // Whether Status is cheap and live (in process) rather than remote.
  virtual bool local() const = 0;
};

// Members and their progress on the wire (SetRangeMembers, HoldRange).
MemberSpec FromProto(const v1::MemberSpec& m);
v1::MemberSpec ToProto(const MemberSpec& m);
MemberProgress FromProto(const v1::MemberProgress& m);
v1::MemberProgress ToProto(const MemberProgress& m);

// RangeStateCodec: the one conversion between a range's state and the
// wire's v1::RangeState, used by every install, save and checkpoint of a
// range. The record is the version, the counters, the optimizer's step and
// the buffer region (1 MiB at most: ParseJobSpec's max_buffer_bytes);
// the tensors are the weights and each optimizer slot, `count` float32
// values each. Streams send the record in their first message and the
// tensors as parts (part 0 the weights, part k the slot k - 1).
void EncodeRangeRecord(const ShardState& state, v1::RangeState* out);
void DecodeRangeRecord(const v1::RangeState& in, ShardState* out);
// A job's figures as clients see them (JobMetrics: step, samples, loss,
// accuracy, train seconds, rejected pushes) from a record's, and back.
void FiguresToJob(const ShardMetrics& in, v1::JobMetrics* out);
ShardMetrics FiguresOfJob(const v1::JobMetrics& in);
// The record and the tensors (state.weights must be set).
void EncodeRangeState(const ShardState& state, v1::RangeState* out);
// kInvalidArgument when a tensor is not `count` values.
absl::StatusOr<ShardState> DecodeRangeState(const v1::RangeState& in,
                                            int64_t count);

}  // namespace tally

#endif  // TALLY_SERVER_SHARD_CONTROL_H_
