#include "server/control/registry.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/errors.h"

namespace tally {

namespace {

// A tag for this coordinator's lifetime, put into every worker and shard
// id it hands out, so that no id repeats across restarts (with or without
// a state_dir): six base-36 characters from the kernel's random source.
std::string LifetimeTag() {
  uint64_t bits = 0;
  ssize_t n;
  do {
    n = getrandom(&bits, sizeof(bits), 0);
  } while (n < 0 && errno == EINTR);
  if (n != sizeof(bits)) {
    // No getrandom (an old kernel, a seccomp profile): the start time and
    // the process id, which also differ between two lifetimes.
    bits = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) *
               0x9e3779b97f4a7c15u ^
           static_cast<uint64_t>(getpid());
  }
  constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string tag;
  for (int i = 0; i < 6; ++i, bits /= 36) tag.push_back(kDigits[bits % 36]);
  return tag;
}

// A worker that cannot follow what this coordinator sends is turned away at
// the door (proto/tally.proto, WorkerProtocol): given a job, it would fail
// that job at its first pull, and every other worker's with it.
absl::Status CheckProtocol(uint32_t version) {
  const auto oldest = static_cast<uint32_t>(v1::WORKER_PROTOCOL_OLDEST);
  if (version >= oldest) return absl::OkStatus();
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "this worker speaks worker protocol ", version,
          version == 0 ? " (it sends no protocol_version: a release before "
                         "versions)"
                       : "",
          " and this coordinator takes ", oldest,
          " or later: such a worker may not follow shard-map addresses "
          "relative to the coordinator's host (':PORT'), the plans of "
          "growing jobs (PLAN_CHANGED) or sparse-table rows, and would fail "
          "the jobs it were given; upgrade it")),
      v1::PROTOCOL_TOO_OLD);
}

// The worker a lease check found, or why not.
absl::StatusOr<WorkerEntry*> Holder(std::map<std::string, WorkerEntry>& workers,
                                    const std::string& id,
                                    const absl::Status& lease) {
  auto it = workers.find(id);
  if (!lease.ok()) return lease;
  if (it == workers.end())
    return absl::InternalError("a lease without a worker");
  return &it->second;
}

}  // namespace

Registry::Registry(absl::Duration lease_timeout, int64_t max_workers,
                   absl::Time now)
    : max_workers_(max_workers),
      lifetime_(LifetimeTag()),
      leases_(lease_timeout, now) {}

void Registry::AddLocalShard(std::shared_ptr<ShardControl> control,
                             const std::string& address, absl::Time now) {
  ShardEntry& s = shards_[kLocalShard];
  s.control = std::move(control);
  s.address = address;
  s.incarnation = leases_.Grant(kLocalShard, now, /*forever=*/true);
  s.last_seen = now;
}

absl::Status Registry::CheckRegistration(
    const v1::RegisterWorkerRequest& req) {
  if (absl::Status s = CheckProtocol(req.protocol_version()); !s.ok())
    return s;
  constexpr size_t kMaxField = 256;
  if (req.name().size() > kMaxField || req.devices().size() > kMaxField ||
      req.address().size() > kMaxField || req.python().size() > kMaxField) {
    return absl::InvalidArgumentError(
        absl::StrCat("a worker's name, devices, address and python are at "
                     "most ",
                     kMaxField, " bytes each"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterWorkerResponse> Registry::AddWorker(
    const v1::RegisterWorkerRequest& req, absl::Time now) {
  if (static_cast<int64_t>(workers_.size()) >= max_workers_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(max_workers_,
                     " workers are registered already "
                     "(--max_workers)"));
  }
  const std::string id =
      absl::StrCat("worker-", lifetime_, "-", next_worker_++);
  WorkerEntry& w = workers_[id];
  w.name = req.name();
  w.devices = req.devices();
  w.address = req.address();
  w.python = req.python();
  w.protocol = req.protocol_version();
  w.incarnation = leases_.Grant(id, now);
  v1::RegisterWorkerResponse out;
  out.set_worker_id(id);
  out.set_incarnation(w.incarnation);
  out.set_lease_ms(absl::ToInt64Milliseconds(leases_.timeout()));
  return out;
}

absl::StatusOr<WorkerEntry*> Registry::RenewWorker(const std::string& id,
                                                   int64_t incarnation,
                                                   absl::Time now) {
  // A lease without a worker is only checked (it is not renewed).
  return Holder(workers_, id,
                workers_.count(id) ? leases_.Renew(id, incarnation, now)
                                   : leases_.Check(id, incarnation));
}

absl::StatusOr<WorkerEntry*> Registry::CheckWorker(const std::string& id,
                                                   int64_t incarnation) {
  return Holder(workers_, id, leases_.Check(id, incarnation));
}

v1::RegisterShardResponse Registry::AddShard(
    const std::string& address, std::shared_ptr<ShardControl> control,
    absl::Time now) {
  const std::string id = absl::StrCat("shard-", lifetime_, "-", next_shard_++);
  ShardEntry& s = shards_[id];
  s.address = address;
  s.incarnation = leases_.Grant(id, now);
  s.last_seen = now;
  s.control = std::move(control);
  v1::RegisterShardResponse out;
  out.set_shard_id(id);
  out.set_incarnation(s.incarnation);
  out.set_lease_ms(absl::ToInt64Milliseconds(leases_.timeout()));
  return out;
}

absl::StatusOr<ShardEntry*> Registry::RenewShard(const std::string& id,
                                                 int64_t incarnation,
                                                 absl::Time now) {
  auto it = shards_.find(id);
  if (absl::Status st = leases_.Renew(id, incarnation, now);
      !st.ok() || it == shards_.end() || !it->second.live) {
    return !st.ok() ? st
                    : WithReason(absl::FailedPreconditionError(absl::StrCat(
                                     "shard ", Quoted(id),
                                     " was lost: register again")),
                                 v1::REGISTER_AGAIN);
  }
  it->second.last_seen = now;
  return &it->second;
}

bool Registry::EndLease(const std::string& id, int64_t incarnation,
                        absl::Time now) {
  if (!leases_.End(id, incarnation, now)) return false;
  ended_.insert(id);
  ++leases_ended_;
  return true;
}

Registry::Expired Registry::Expire(absl::Time now) {
  Expired out;
  for (const std::string& id : leases_.Expire(now)) {
    if (ended_.erase(id) == 0) ++lease_expiries_;
    if (workers_.count(id)) out.workers.push_back(id);
    if (shards_.count(id)) out.shards.push_back(id);
  }
  // A shard that lost its lease took its ranges with it.
  for (const std::string& id : out.shards) {
    ShardEntry& s = shards_.at(id);
    s.live = false;
    s.ranges.clear();
  }
  return out;
}

void Registry::ForgetLostShards(absl::Time now,
                                const std::set<std::string>& placed) {
  for (auto it = shards_.begin(); it != shards_.end();) {
    if (!it->second.live && !placed.count(it->first) &&
        now - it->second.last_seen > absl::Minutes(10)) {
      it = shards_.erase(it);
    } else {
      ++it;
    }
  }
}

WorkerEntry* Registry::worker(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerEntry* Registry::worker(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::Idle() const {
  std::vector<std::string> idle;
  for (const auto& [id, w] : workers_) {
    if (w.job_id.empty()) idle.push_back(id);
  }
  return idle;
}

std::set<std::string> Registry::BusyJobs() const {
  std::set<std::string> busy;
  for (const auto& [id, w] : workers_) busy.insert(w.job_id);
  return busy;
}

bool Registry::AnyPythonWorker() const {
  for (const auto& [id, w] : workers_) {
    if (!w.python.empty()) return true;
  }
  return false;
}

std::shared_ptr<ShardControl> Registry::LiveShardAt(
    const std::string& address) const {
  std::shared_ptr<ShardControl> found;
  for (const auto& [id, s] : shards_) {
    if (!address.empty() && s.address == address && s.live) found = s.control;
  }
  return found;
}

std::vector<v1::ShardInfo> Registry::ListShards(absl::Time now) const {
  std::vector<v1::ShardInfo> out;
  for (const auto& [id, s] : shards_) {
    v1::ShardInfo info;
    info.set_shard_id(id);
    info.set_address(s.address);
    info.set_live(s.live);
    info.set_last_seen_unix(
        UnixSeconds(s.control->local() ? now : s.last_seen));
    std::vector<v1::RangeStatus> ranges = s.ranges;
    if (s.control->local()) {
      auto st = s.control->Status();
      if (st.ok()) ranges = *std::move(st);
    }
    int64_t bytes = 0;
    for (const v1::RangeStatus& r : ranges) {
      v1::ShardInfo::Range* out_range = info.add_ranges();
      out_range->set_job_id(r.job_id());
      out_range->set_offset(r.offset());
      out_range->set_count(r.count());
      out_range->set_version(r.version());
      *out_range->mutable_closed() = r.closed();
      out_range->set_backup(r.backup());
      out_range->set_peer_address(r.peer_address());
      bytes += 4 * r.count();
    }
    info.set_bytes(bytes);
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<v1::RangeStatus> Registry::RangeStatuses(
    const JobEntry& job) const {
  std::vector<v1::RangeStatus> out(job.ranges.size());
  for (size_t i = 0; i < job.ranges.size(); ++i) {
    auto it = shards_.find(job.ranges[i].shard_id);
    if (it == shards_.end()) continue;
    std::vector<v1::RangeStatus> all;
    if (it->second.control->local()) {
      auto st = it->second.control->Status();
      if (st.ok()) all = *std::move(st);
    } else {
      all = it->second.ranges;
    }
    for (v1::RangeStatus& r : all) {
      if (r.job_id() == job.id() && r.map_version() == job.map_version)
        out[i] = std::move(r);
    }
  }
  return out;
}

int64_t Registry::Version(const JobEntry& job) const {
  if (job.ranges.empty() || !job.installed) return job.proto.metrics().step();
  int64_t v = INT64_MAX;
  for (const v1::RangeStatus& r : RangeStatuses(job)) {
    // A range not reported yet (a shard process's next heartbeat tells):
    // the job is where it was placed from.
    if (r.job_id().empty()) return job.proto.metrics().step();
    v = std::min(v, r.version());
  }
  return v;
}

}  // namespace tally
