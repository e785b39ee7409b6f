// The parameter ranges one tally-server process holds: for each job placed
// here, one ParameterShard over [offset, offset + count) of the job's flat
// vector. The coordinator installs, re-members, saves and retires ranges
// (through ShardControl: in process for its own host, over ShardService for
// a shard process); workers push and pull through ParameterService, which
// finds the range here.
//
// Chunk offsets on the wire are offsets into the whole flat vector; a range
// accepts only chunks inside it.
//
// Thread-safe. Callbacks run without the host's lock held.
#ifndef TALLY_SERVER_DATA_SHARD_HOST_H_
#define TALLY_SERVER_DATA_SHARD_HOST_H_

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
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
#include "common/spec/job_spec.h"
#include "proto/tally.pb.h"
#include "proto/transport.h"
#include "server/data/request_waits.h"
#include "server/data/shard.h"

namespace tally {

class RangeForwarder;

// A range of a job, as the data path sees it.
struct Range {
  std::string job_id;
  int64_t map_version = 0;
  int64_t offset = 0;
  int64_t count = 0;
  std::shared_ptr<ParameterShard> shard;
  // A replicated range (docs/cluster.md): whether this copy is the backup,
  // and its peer's data address (a primary's backup, a backup's primary;
  // empty: none). A primary's sender of its closed steps; null: none.
  bool backup = false;
  std::string peer_address;
  std::shared_ptr<RangeForwarder> forwarder;
};

// MemberSpec <-> its wire form.

class ShardHost {
 public:
  // Shared memory with workers (Options::shared_memory_max_bytes): at most
  // kMaxSharedRegions regions and kMaxSharedBytes at once, and
  // kMaxSharedRegionsPerWorker for one worker of a job (its stream and the
  // one replacing it). A region holds one push and one pull of the range:
  // twice its size, counted in both processes' memory.
  static constexpr int kMaxSharedRegions = 256;
  static constexpr int kMaxSharedRegionsPerWorker = 2;
  static constexpr int64_t kMaxSharedBytes = int64_t{1} << 30;
  // What pulls of rows waiting for their version (ParameterService.
  // PullRows) may hold by default: each keeps its request until it is
  // answered (at most about 2 MiB once checked: SparseTables::
  // kMaxValuesPerMessage row numbers), so a job's worker may have
  // kMaxWaitingRowBytesPerWorker of them waiting here and all of them
  // together kMaxWaitingRowBytes.
  static constexpr int64_t kMaxWaitingRowBytes = int64_t{256} << 20;
  static constexpr int64_t kMaxWaitingRowBytesPerWorker = int64_t{64} << 20;

  // What a host is given at construction; nothing changes it later.
  struct Options {
    Options();  // the defaults below (declared: a default argument names it)
    // Whether ranges sum pushes as they arrive where their job allows
    // (ParameterShard::Options::streamed_sums): ranges of at least
    // `streamed_sums_min_elements` values, or whose job's workers (its
    // most, if it may grow) would stage that many in all (smaller ones
    // stage each push whole, which costs little memory there and was
    // faster).
    bool streamed_sums = true;
    int64_t streamed_sums_min_elements = 0;
    // The bytes every job's embedding tables here may take together
    // (--max_table_bytes; 0: unbounded).
    int64_t max_table_bytes = 0;
    // Given to every range (ParameterShard::Options::publish_observer):
    // the metrics' publish latency. Null: none.
    std::function<void(const PublishTimes&)> publish_observer;
    // Where this shard checkpoints its ranges' tables (--table_dir; empty:
    // they are not): a directory every shard of the cluster reads at the
    // same path, since a range placed again elsewhere loads its rows from
    // the files the lost one wrote. Under it, a directory a job, removed
    // when the job ends.
    std::string table_dir;
    // Whether an Exchange stream may share memory with its worker
    // (proto/shared_memory.h): for ranges of at most this many bytes (4
    // bytes a value; 0: never), within kMaxSharedBytes / 2.
    int64_t shared_memory_max_bytes = 0;
    // What pulls of rows waiting here may hold: a job's worker's, and all
    // of them together.
    int64_t waiting_rows_per_worker = kMaxWaitingRowBytesPerWorker;
    int64_t waiting_rows_in_all = kMaxWaitingRowBytes;
    // How long this host's services hold a request for what it waits on.
    RequestWaits waits;
    // How a replicated range's primary dials its backup's shard, and the
    // host a backup address of the form ":port" is on (the coordinator's
    // own shard: the coordinator's host).
    TransportOptions transport;
    std::string coordinator_host;
  };

  // `clock` is borrowed (null: real time); specs are checked against
  // `limits` before a range is allocated.
  explicit ShardHost(const Clock* clock, const SpecLimits& limits = {},
                     Options options = {});
  ShardHost(const ShardHost&) = delete;
  ShardHost& operator=(const ShardHost&) = delete;

  // How long this host's services hold a request for what it waits on.
  const RequestWaits& waits() const { return waits_; }

  // A region for a stream of `owner` (a job's worker) over a range of
  // `count` values may be made now: true, and counted until
  // ReleaseSharedRegion(owner, count); false when sharing is off, the range
  // too large, or too many (or too much) are live.
  bool ReserveSharedRegion(const std::string& owner, int64_t count);
  void ReleaseSharedRegion(const std::string& owner, int64_t count);
  // Regions live now; bytes of values pushed and pulled through them.
  int shared_regions() const;
  void CountShared(int64_t pushed, int64_t pulled) {
    shared_pushed_ += pushed;
    shared_pulled_ += pulled;
  }
  int64_t shared_pushed_bytes() const { return shared_pushed_; }
  int64_t shared_pulled_bytes() const { return shared_pulled_; }

  // Counts `bytes` for a waiting pull of rows of `owner` (a job's worker)
  // until ReleaseWaitingRows(owner, bytes); kResourceExhausted +
  // PULLS_WAITING, naming the bound (Options::waiting_rows_*), when they
  // would take the owner's or everyone's past it (nothing counted then).
  absl::Status ReserveWaitingRows(const std::string& owner, int64_t bytes);
  void ReleaseWaitingRows(const std::string& owner, int64_t bytes);
  // The bytes counted now.
  int64_t waiting_row_bytes() const;

  // Creates the job's range, or replaces it when the request's map version
  // is newer (the job was re-placed); the same or an older version is a
  // no-op. Initial weights from the spec's seed, or req.state. A backup
  // copy (req.backup), or a primary that sends its closed steps to
  // req.backup_address. kInvalidArgument when the spec, range or state
  // does not fit.
  absl::Status Install(const v1::InstallRangeRequest& req);
  // Replicated ranges (docs/cluster.md). kNotFound as Find, and
  // kFailedPrecondition when the job's copy here is not a backup (Promote,
  // ApplyClosed) or not a primary (SetBackup).
  // The backup copy becomes the primary; its version.
  absl::StatusOr<int64_t> Promote(const std::string& job_id,
                                  int64_t map_version);
  // The primary copy's backup from now on (seeded at `from_version`), or
  // none (an empty address: every version is published as it is made).
  absl::Status SetBackup(const std::string& job_id, int64_t map_version,
                         const std::string& backup_address,
                         int64_t from_version);
  // A new backup of the primary copy here, at `backup_address`: the
  // range's state as it is, for installing the backup, and from it on
  // every version the range makes is sent there, published without
  // waiting until the backup is in step (ParameterShard::SaveForBackup;
  // RangeStatus.backup_in_step says when it is).
  absl::StatusOr<ShardState> SeedBackup(const std::string& job_id,
                                        int64_t map_version,
                                        const std::string& backup_address);
  // A closed step of the primary, made on the backup copy; its version
  // after it (ParameterShard::ApplyClosed's codes).
  absl::StatusOr<int64_t> ApplyClosed(const std::string& job_id,
                                      int64_t map_version,
                                      const ClosedStep& step);
  // These name the placement they are about (map_version; 0: any):
  // kNotFound when the job has no range here placed at that version.
  absl::StatusOr<HoldReport> Hold(const std::string& job_id,
                                  int64_t map_version, int64_t hold_id,
                                  absl::Duration hold);
  // With a plan (a worker joined), the range takes it first.
  absl::Status SetMembers(const std::string& job_id, int64_t map_version,
                          const std::vector<MemberSpec>& members,
                          int64_t hold_id, const PlanChange& plan = {});
  // The job ended: waiters are released (JOB_ENDED), pushes refused; the
  // final weights stay for saving until Drop.
  absl::Status Retire(const std::string& job_id, int64_t map_version);
  // An ended job's table rows, for export (tally fetch): up to `max_rows`
  // of table `table`'s rows from `start` on, in order, as this range's
  // slot held them when the job was retired (at placement `map_version`).
  // Ended jobs' tables stay here, counted in --max_table_bytes, until the
  // process exits, kKeptEndedTables later jobs' have ended, or a live
  // job's new rows need their room (oldest first). kNotFound when they are
  // gone or were never here; kInvalidArgument for a table the job does not
  // have or more than SparseTables::kMaxValuesPerMessage values.
  static constexpr int kKeptEndedTables = 16;
  // *total: the rows of the table held here.
  absl::Status ReadTable(const std::string& job_id, int64_t map_version,
                         int table, int64_t start, int64_t max_rows,
                         std::vector<int64_t>* rows, std::string* values,
                         int64_t* total) const;

  // Forgets the job's range. With `ended`, the job is over: pushes and
  // pulls of it are answered JOB_ENDED from now on (kNotFound otherwise,
  // as for a job never placed here).
  // With `map_version`, only a range placed at that version or before.
  void Drop(const std::string& job_id, bool ended,
            int64_t map_version = INT64_MAX);
  // Forgets every range (the coordinator will place its jobs again).
  void DropAll();
  // The range's state at version `v` (ParameterShard::SaveAt). Unless
  // `weights_only`, a range with tables and a table_dir writes its rows
  // there first (a base, or the rows changed since its last file) and
  // the state names its chain of files (ShardState.table_files); a write
  // that fails fails the save (the next one writes a base).
  void SaveAt(const std::string& job_id, int64_t map_version, int64_t v,
              absl::Time deadline,
              std::function<void(absl::StatusOr<ShardState>)> done,
              bool weights_only = false);

  // For the data path: kNotFound when the job has no range here (or, with
  // a map_version, none placed at that version: the job moved since).
  absl::StatusOr<Range> Find(const std::string& job_id,
                             int64_t map_version = 0) const;
  std::vector<v1::RangeStatus> Status() const;

  // Releases timed-out waits and lapsed holds. Call every ~100 ms.
  void Tick();

 private:
  const RequestWaits waits_;
  // Install's range: from the spec's initial weights, or from the state
  // the request carries (a Python model's always), checked against it,
  // with `options` and the job's tables.
  absl::StatusOr<std::shared_ptr<ParameterShard>> MakeShard(
      const v1::InstallRangeRequest& req, const JobSpec& spec,
      ParameterShard::Options options);
  // The job's tables (model.embeddings), on the range's slot; null when
  // it has none.
  absl::StatusOr<std::shared_ptr<SparseTables>> MakeTables(
      const v1::InstallRangeRequest& req, const JobSpec& spec);
  // What a range of the request's job is made with.
  ParameterShard::Options RangeOptions(const v1::InstallRangeRequest& req,
                                       const JobSpec& spec) const;
  // A sender of the primary `shard`'s closed steps to `address`, from
  // `from_version` (the version its backup holds), and the forward call
  // that hands it them; the shard's StartForwarding error if the range
  // is at another version.
  absl::StatusOr<std::shared_ptr<RangeForwarder>> MakeForwarder(
      const v1::InstallRangeRequest& req, const std::string& address,
      const std::shared_ptr<ParameterShard>& shard, int64_t from_version);
  // The job's range `shard` sends its closed steps through `forwarder`
  // (null: none) to the backup at `address` from now on; the sender it had
  // is stopped. kNotFound (and `forwarder` stopped) when the range was
  // dropped or replaced meanwhile.
  absl::Status UseForwarder(const std::string& job_id,
                            const std::shared_ptr<ParameterShard>& shard,
                            std::shared_ptr<RangeForwarder> forwarder,
                            const std::string& address);
  // A sender of the primary `shard`'s closed steps to `address` (":port":
  // the coordinator's own shard, on its host), handed none yet.
  std::shared_ptr<RangeForwarder> NewForwarder(
      const std::string& job_id, int64_t map_version,
      const std::string& address,
      const std::shared_ptr<ParameterShard>& shard) const;
  // Whether a range of `count` values of the job sums pushes as they
  // arrive (Options::streamed_sums).
  bool StreamsSums(const JobSpec& spec, int64_t count) const;
  const Clock* clock_;
  const Options options_;
  std::shared_ptr<std::atomic<int64_t>> table_budget_;  // null: unbounded
  const int64_t shared_memory_max_bytes_;
  std::atomic<int64_t> shared_pushed_{0}, shared_pulled_{0};
  // Drops ended jobs' tables, oldest first, until they held `missing`
  // bytes; whether there was one (SparseTables::set_reclaim's hook: under
  // a range's lock, and so never taking mu_).
  bool ReclaimEndedTables(int64_t missing);
  const SpecLimits limits_;
  RealClock real_clock_;
  // A range's table files since its placement, base first.
  struct TableChain {
    int64_t map_version = 0;
    std::vector<std::string> files;
    int64_t base_bytes = 0, delta_bytes = 0;
    bool needs_base = true;  // a write failed: its rows are in no file
  };
  // Writes a save's rows and adds the file to the job's chain; the chain.
  absl::StatusOr<std::vector<std::string>> WriteTables(
      const std::string& job_id, int64_t map_version,
      const TableRowsFile& file);
  bool NextSaveIsBase(const std::string& job_id, int64_t map_version);
  // Names each file once (two saves at one step must not overwrite).
  std::atomic<int64_t> table_files_written_{0};
  absl::Mutex chains_mu_;
  std::map<std::string, TableChain> chains_ ABSL_GUARDED_BY(chains_mu_);
  struct EndedTables {
    std::string job_id;
    int64_t map_version = 0;
    std::shared_ptr<const SparseTables> tables;
  };
  mutable absl::Mutex ended_tables_mu_;  // after a range's, never before
  std::deque<EndedTables> ended_tables_ ABSL_GUARDED_BY(ended_tables_mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Range> ranges_ ABSL_GUARDED_BY(mu_);
  // Jobs that ended here, the most recent 1024.
  std::set<std::string> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);
  int shared_regions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t shared_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> shared_owners_ ABSL_GUARDED_BY(mu_);
  // Waiting pulls of rows (ReserveWaitingRows): their own lock, not the
  // one every push and pull finds its range under.
  mutable absl::Mutex waiting_rows_mu_;
  int64_t waiting_rows_bytes_ ABSL_GUARDED_BY(waiting_rows_mu_) = 0;
  std::map<std::string, int64_t> waiting_rows_owners_
      ABSL_GUARDED_BY(waiting_rows_mu_);
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARD_HOST_H_
