// Who is registered with the coordinator: workers (WorkerEntry) and shard
// processes (ShardEntry, the coordinator's own shard among them), under
// their leases (leases.h), and what the shards last said of the ranges they
// hold. Ids never repeat across the coordinator's lifetimes: each holds a
// tag of this registry's lifetime ("worker-k3x9a2-1", "shard-k3x9a2-1";
// the coordinator's own shard is "shard-0").
//
// A lease that runs out (Expire) makes a worker one to drop, which the
// caller takes off its job first (RemoveWorker), and a shard lost: it is
// kept, not live, until no placement names it (ForgetLostShards).
//
// Not thread-safe: guarded by its owner (the Coordinator's mu_).
#ifndef TALLY_SERVER_CONTROL_REGISTRY_H_
#define TALLY_SERVER_CONTROL_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/control/job_entry.h"
#include "server/control/leases.h"

namespace tally {

class Registry {
 public:
  // The id of the coordinator's own shard.
  static constexpr char kLocalShard[] = "shard-0";

  // `max_workers`: registered workers beyond it are refused.
  Registry(absl::Duration lease_timeout, int64_t max_workers, absl::Time now);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  absl::Duration lease_timeout() const { return leases_.timeout(); }
  int64_t lease_expiries() const { return lease_expiries_; }

  // The coordinator's own shard, whose lease never runs out.
  void AddLocalShard(std::shared_ptr<ShardControl> control,
                     const std::string& address, absl::Time now);

  // What a registration must say, checked before anything is held:
  // kFailedPrecondition + PROTOCOL_TOO_OLD for a worker protocol below
  // WORKER_PROTOCOL_OLDEST; kInvalidArgument for a field over 256 bytes.
  static absl::Status CheckRegistration(const v1::RegisterWorkerRequest& req);
  // A new worker, idle, with a lease; kResourceExhausted past max_workers.
  absl::StatusOr<v1::RegisterWorkerResponse> AddWorker(
      const v1::RegisterWorkerRequest& req, absl::Time now);
  // The worker holding (id, incarnation), its lease extended (Renew) or
  // only checked (Check); kFailedPrecondition + REGISTER_AGAIN otherwise.
  absl::StatusOr<WorkerEntry*> RenewWorker(const std::string& id,
                                           int64_t incarnation,
                                           absl::Time now);
  absl::StatusOr<WorkerEntry*> CheckWorker(const std::string& id,
                                           int64_t incarnation);
  absl::Status CheckLease(const std::string& id, int64_t incarnation) const {
    return leases_.Check(id, incarnation);
  }
  // (id, incarnation)'s lease (a worker's or a shard's) ends now: the next
  // Expire drops it. False when that is not the live registration, or it
  // never runs out (the coordinator's own shard).
  bool EndLease(const std::string& id, int64_t incarnation, absl::Time now);
  // Leases ended so (not counted in lease_expiries).
  int64_t leases_ended() const { return leases_ended_; }
  // Forgets a worker (its job is the caller's to leave first).
  void RemoveWorker(const std::string& id) { workers_.erase(id); }

  // A new shard process at `address`, reached through `control`.
  v1::RegisterShardResponse AddShard(const std::string& address,
                                     std::shared_ptr<ShardControl> control,
                                     absl::Time now);
  // The live shard holding (id, incarnation), its lease extended;
  // kFailedPrecondition + REGISTER_AGAIN otherwise (a lost one too).
  absl::StatusOr<ShardEntry*> RenewShard(const std::string& id,
                                         int64_t incarnation, absl::Time now);

  // The leases that ran out before `now`: workers to drop, and shards now
  // lost (not live, their ranges forgotten).
  struct Expired {
    std::vector<std::string> workers;
    std::vector<std::string> shards;
  };
  Expired Expire(absl::Time now);
  // Forgets shards lost ten minutes before `now` that no placement in
  // `placed` (shard ids) names.
  void ForgetLostShards(absl::Time now, const std::set<std::string>& placed);

  WorkerEntry* worker(const std::string& id);
  const WorkerEntry* worker(const std::string& id) const;
  const std::map<std::string, WorkerEntry>& workers() const {
    return workers_;
  }
  const ShardEntry& shard(const std::string& id) const {
    return shards_.at(id);
  }
  const std::map<std::string, ShardEntry>& shards() const { return shards_; }
  // Idle workers, by id; the jobs that workers are on.
  std::vector<std::string> Idle() const;
  std::set<std::string> BusyJobs() const;
  bool AnyPythonWorker() const;
  // The live shard at `address` (null: none; "" is never one).
  std::shared_ptr<ShardControl> LiveShardAt(const std::string& address) const;

  // Every shard, its ranges as it last reported them (the local one's
  // live).
  std::vector<v1::ShardInfo> ListShards(absl::Time now) const;
  // The live progress of a job's ranges, in map order (empty entries for
  // ranges not reported yet).
  std::vector<v1::RangeStatus> RangeStatuses(const JobEntry& job) const;
  // The version every range of the job has reached (the record's step
  // until it is installed and every range reported).
  int64_t Version(const JobEntry& job) const;

 private:
  const int64_t max_workers_;
  // In every worker and shard id: ids never repeat across lifetimes.
  const std::string lifetime_;
  Leases leases_;
  int64_t lease_expiries_ = 0;
  int64_t leases_ended_ = 0;
  std::set<std::string> ended_;  // ended, not yet dropped by Expire
  int64_t next_worker_ = 1;
  int64_t next_shard_ = 1;
  std::map<std::string, WorkerEntry> workers_;
  std::map<std::string, ShardEntry> shards_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_REGISTRY_H_
