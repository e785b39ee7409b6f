#include "server/control/planner.h"

#include <algorithm>
#include <climits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/schedule.h"
#include "server/control/job_store.h"
#include "server/control/partition.h"

namespace tally {

// ------------------------------------------------------------ scheduling --

std::vector<std::string> Planner::ScheduleJobs(absl::Time now) {
  std::vector<std::string> changed;
  std::vector<std::string> idle = registry_.Idle();
  auto take = [&idle](const std::string& id) {
    idle.erase(std::find(idle.begin(), idle.end(), id));
  };
  // Running jobs first: place those without shards (restored, or whose
  // shard was lost), tend their backups, then refill vacated slots; then
  // start pending jobs in submission order once their slots can be filled.
  for (const std::string& jid : jobs_.order()) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::RUNNING || job.awaiting_start) continue;
    if (job.ranges.empty() && !Place(job, now)) continue;
    ReplaceBackups(job, now);  // and counts those caught up (CheckSeeded)
    std::vector<std::string> free = Eligible(job, idle);
    const bool refilled = job.fixed_ranks() ? FillRanks(job, free, now)
                                            : FillSlots(job, free, now);
    if (refilled) changed.push_back(jid);
    for (const std::string& id : Taken(idle, free, job)) take(id);
  }
  for (const std::string& jid : jobs_.order()) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::PENDING) continue;
    std::vector<std::string> free = Eligible(job, idle);
    const size_t needed = job.fixed_ranks()
                              ? static_cast<size_t>(job.spec.training.workers)
                              : job.slots.size();
    if (free.size() < needed) {
      // First come, first served; but a job no registered worker can run
      // (a Python model, no Python worker) does not hold up the others.
      if (job.spec.is_python && !registry_.AnyPythonWorker()) {
        job.condition =
            "waiting for Python workers (python3 -m tally.worker): no "
            "registered worker runs Python models";
        continue;
      }
      if (job.fixed_ranks() && free.empty() && !idle.empty()) {
        job.condition =
            "waiting for workers of protocol 3 or later (training.ranks): "
            "the idle workers are older";
      }
      break;
    }
    if (!Place(job, now)) break;  // no shard yet
    if (job.fixed_ranks()) {
      StartRanks(job, free, now);
      for (const std::string& id : Taken(idle, free, job)) take(id);
    } else {
      for (size_t r = 0; r < job.slots.size(); ++r) {
        AssignSlot(job, static_cast<int>(r), free.back(), now);
        take(free.back());
        free.pop_back();
      }
    }
    Start(job, now);
    changed.push_back(jid);
  }
  GrowJobs(idle, now, &changed);
  return changed;
}

// Running jobs that may grow (training.workers: {min, max}) take the idle
// workers left, in submission order, while no job waits for workers (a
// job that grows must not starve the queue). Each joins at the start of a
// later epoch, which the control round decides; a job too near its end to
// have one left takes nobody.
void Planner::GrowJobs(std::vector<std::string>& idle, absl::Time now,
                       std::vector<std::string>* changed) {
  if (idle.empty()) return;
  for (const std::string& jid : jobs_.order()) {
    const JobEntry& job = jobs_.at(jid);
    // A pending job that these workers could start comes first.
    if (job.proto.state() == v1::PENDING && !Eligible(job, idle).empty())
      return;
  }
  for (const std::string& jid : jobs_.order()) {
    JobEntry& job = jobs_.at(jid);
    if (job.fixed_ranks() && job.proto.state() == v1::RUNNING &&
        job.installed && !job.awaiting_start) {
      std::vector<std::string> free = Eligible(job, idle);
      if (SpreadRanks(job, free, now)) changed->push_back(jid);
      for (const std::string& id : Taken(idle, free, job))
        idle.erase(std::find(idle.begin(), idle.end(), id));
      continue;
    }
    if (job.proto.state() != v1::RUNNING || !job.installed ||
        job.awaiting_start || job.grown_out ||
        static_cast<int64_t>(job.slots.size()) >= job.spec.training.max_workers)
      continue;
    // A first look (the control round decides, from every range held):
    // none when no epoch is left past where the workers are (in async, a
    // version is a member's push: about world versions a step).
    const int64_t bound =
        job.schedule.ClockOfVersion(registry_.Version(job)) +
        job.spec.training.consistency.Window() + kJoinMargin;
    if (JoinEpoch(job.schedule, bound, job.spec.training.max_steps) < 0)
      continue;
    std::vector<std::string> free = Eligible(job, idle);
    while (!free.empty() && static_cast<int64_t>(job.slots.size()) <
                                job.spec.training.max_workers) {
      job.slots.push_back("");
      AssignSlot(job, static_cast<int>(job.slots.size() - 1), free.back(),
                 now);
      idle.erase(std::find(idle.begin(), idle.end(), free.back()));
      free.pop_back();
      changed->push_back(jid);
    }
  }
}

// A running job's vacant slots go to free workers, from the next step.
// Returns whether one was filled.
bool Planner::FillSlots(JobEntry& job, std::vector<std::string>& free,
                        absl::Time now) {
  bool filled = false;
  for (size_t r = 0; r < job.slots.size() && !free.empty(); ++r) {
    if (!job.slots[r].empty()) continue;
    AssignSlot(job, static_cast<int>(r), free.back(), now);
    free.pop_back();
    filled = true;
  }
  return filled;
}

// A job with fixed ranks starts on as many free workers as it may have
// (at least training.workers, which ScheduleJobs checked), each holding a
// block of consecutive ranks.
void Planner::StartRanks(JobEntry& job, std::vector<std::string>& free,
                         absl::Time now) {
  const size_t ranks = job.slots.size();
  const size_t k = std::min<size_t>(
      {free.size(), ranks, static_cast<size_t>(job.spec.training.max_workers)});
  for (size_t i = 0; i < k; ++i) {
    for (size_t r = i * ranks / k; r < (i + 1) * ranks / k; ++r)
      AssignSlot(job, static_cast<int>(r), free.back(), now);
    free.pop_back();
  }
}

namespace {

// By worker: how many of the job's ranks it holds.
std::map<std::string, int> HeldRanks(const JobEntry& job) {
  std::map<std::string, int> held;
  for (const std::string& id : job.slots) {
    if (!id.empty()) ++held[id];
  }
  return held;
}

}  // namespace

// A running job with fixed ranks: a vacant rank goes to the worker holding
// fewest of the job's ranks, a free one first (it holds none) while the job
// has fewer than workers.max. Returns whether a rank was given.
bool Planner::FillRanks(JobEntry& job, std::vector<std::string>& free,
                        absl::Time now) {
  std::map<std::string, int> held = HeldRanks(job);
  const size_t most = static_cast<size_t>(job.spec.training.max_workers);
  bool moved = false;
  for (size_t r = 0; r < job.slots.size(); ++r) {
    if (!job.slots[r].empty()) continue;
    std::string to;
    if (!free.empty() && held.size() < most) {
      to = free.back();
      free.pop_back();
    } else if (!held.empty()) {
      to = std::min_element(held.begin(), held.end(),
                            [](const auto& a, const auto& b) {
                              return a.second < b.second;
                            })->first;
    } else {
      break;  // nobody to hold it: its steps wait
    }
    ++held[to];
    AssignSlot(job, static_cast<int>(r), to, now);
    moved = true;
  }
  return moved;
}

// A running job with fixed ranks grows (GrowJobs, after the queue): free
// workers take a rank each from the worker holding most, while it holds
// two or more and the job has fewer than workers.max. Returns whether a
// rank moved.
bool Planner::SpreadRanks(JobEntry& job, std::vector<std::string>& free,
                          absl::Time now) {
  std::map<std::string, int> held = HeldRanks(job);
  const size_t most = static_cast<size_t>(job.spec.training.max_workers);
  bool moved = false;
  while (!free.empty() && held.size() < most) {
    auto from = std::max_element(
        held.begin(), held.end(),
        [](const auto& a, const auto& b) { return a.second < b.second; });
    if (from == held.end() || from->second < 2) break;
    const int r = job.RanksOf(from->first).back();
    --from->second;
    job.slots[r].clear();
    job.AddEvent(now, absl::StrCat("rank ", r, " moves from ", from->first,
                                   " to ", free.back()));
    held[free.back()] = 1;
    AssignSlot(job, r, free.back(), now);
    free.pop_back();
    moved = true;
  }
  return moved;
}

// The workers of `idle` no longer in `free` that `job` took.
std::vector<std::string> Planner::Taken(const std::vector<std::string>& idle,
                                        const std::vector<std::string>& free,
                                        const JobEntry& job) const {
  std::vector<std::string> out;
  for (const std::string& id : idle) {
    if (std::find(free.begin(), free.end(), id) == free.end() &&
        registry_.worker(id)->job_id == job.id())
      out.push_back(id);
  }
  return out;
}

// Those the job has not barred; for a Python model, Python workers alone;
// for fixed ranks, workers that can hold several.
std::vector<std::string> Planner::Eligible(
    const JobEntry& job, const std::vector<std::string>& idle) const {
  std::vector<std::string> out;
  for (const std::string& id : idle) {
    if (job.barred.count(id)) continue;
    const WorkerEntry& w = *registry_.worker(id);
    if (job.spec.is_python && w.python.empty()) continue;
    if (job.fixed_ranks() && w.protocol < v1::WORKER_PROTOCOL_RANKS) continue;
    out.push_back(id);
  }
  return out;
}

void Planner::AssignSlot(JobEntry& job, int rank, const std::string& worker_id,
                         absl::Time now) {
  WorkerEntry& w = *registry_.worker(worker_id);
  if (w.job_id != job.id()) {
    w.job_id = job.id();
    w.compute_seconds = w.wait_seconds = w.push_seconds = w.loader_seconds = 0;
  }
  job.slots[rank] = worker_id;
  if (job.slot_terms.size() < job.slots.size())
    job.slot_terms.resize(job.slots.size(), 0);
  ++job.slot_terms[rank];
  w.rank = job.RanksOf(worker_id).front();
  job.AddEvent(now, absl::StrCat(worker_id, " (", w.name, ") joined as rank ",
                                 rank));
  job.MarkDirty();  // a member to add on every range
}

void Planner::Start(JobEntry& job, absl::Time now) {
  job.condition.clear();
  job.proto.set_state(v1::RUNNING);
  job.AddEvent(now, absl::StrCat("started: ", job.slots.size(), " worker",
                                 job.slots.size() == 1 ? "" : "s", ", ",
                                 job.ranges.size(), " parameter shard",
                                 job.ranges.size() == 1 ? "" : "s"));
}

// ------------------------------------------------------------- placement --

std::vector<std::pair<int64_t, std::string>> Planner::LiveShardsByLoad()
    const {
  std::map<std::string, int64_t> load;
  for (const auto& [id, s] : registry_.shards()) {
    if (s.live) load[id] = 0;
  }
  // Both copies of a range count on their shards.
  for (const auto& [jid, j] : jobs_.entries()) {
    if (j.ended()) continue;
    for (const Placement& p : j.ranges) {
      if (load.count(p.shard_id)) load[p.shard_id] += p.count;
      if (load.count(p.backup_shard_id)) load[p.backup_shard_id] += p.count;
    }
  }
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [id, values] : load) order.emplace_back(values, id);
  std::sort(order.begin(), order.end());
  return order;
}

bool Planner::Place(JobEntry& job, absl::Time now) {
  const std::vector<std::pair<int64_t, std::string>> order = LiveShardsByLoad();
  const int64_t n = job.spec.layout.num_params;
  // Backup workers need one shard: shards would each pick the late pushes.
  const int wanted = job.spec.training.consistency.backup_workers > 0
                         ? 1
                         : static_cast<int>(job.spec.training.shards);
  // Tables spread over shards too: their values count with the vector's
  // when the spec leaves the number of shards to us (saturating).
  int64_t values = n;
  for (const EmbeddingTableSpec& t : job.spec.embeddings) {
    const int64_t table = t.num_embeddings > INT64_MAX / t.dim
                              ? INT64_MAX
                              : t.num_embeddings * t.dim;
    values = table > INT64_MAX - values ? INT64_MAX : values + table;
  }
  // Two copies of each range, each on a shard of its own: unless the spec
  // names the number of shards, the primaries take at most half the live
  // ones; backups go on the next least loaded, where shards remain (one
  // copy where none does).
  const int live = static_cast<int>(order.size());
  const bool replicated = RangeCopies(job.spec) > 1;
  int k = ShardCount(values, wanted,
                     replicated && wanted == 0 && live >= 2 ? live / 2 : live);
  k = std::min<int64_t>(k, n);  // every shard holds some of the vector
  if (k == 0) return false;
  job.ranges.clear();
  const auto parts = PartitionRanges(n, k);
  // The primaries' shards hold no backup of the job.
  std::set<std::string> taken;
  for (int i = 0; i < k; ++i) taken.insert(order[i].second);
  for (int i = 0; i < k; ++i) {
    Placement p{order[i].second, parts[i].first, parts[i].second};
    if (replicated) p.backup_shard_id = PickBackup(order, taken, p.shard_id);
    taken.insert(p.backup_shard_id);
    job.ranges.push_back(std::move(p));
  }
  // Map versions never repeat, across coordinator restarts too (a shard
  // process may still hold an older placement of the job).
  job.map_version = std::max(job.map_version + 1, absl::ToUnixMicros(now));
  job.installed = false;
  job.members.clear();
  job.leaves.clear();
  job.MarkDirty();
  return true;
}

std::vector<std::string> Planner::LoseShard(const std::string& shard_id,
                                           absl::Time now) {
  std::vector<std::string> lost;
  auto live = [this](const std::string& id) {
    auto s = registry_.shards().find(id);
    return !id.empty() && s != registry_.shards().end() && s->second.live;
  };
  for (const std::string& jid : jobs_.order()) {
    JobEntry& job = jobs_.at(jid);
    if (job.ended()) continue;
    bool hit = false, held = job.installed;
    for (const Placement& p : job.ranges) {
      if (p.shard_id == shard_id) {
        hit = true;
        // Its backup takes over only if it is live and was never itself
        // promoted half-way (a failover still to finish).
        held = held && live(p.backup_shard_id) && !p.promote && !p.seed;
      }
      if (p.backup_shard_id == shard_id) {
        hit = true;
        held = held && !p.promote;
      }
    }
    if (!hit) continue;
    if (held) {
      FailOver(job, shard_id, now);
      continue;
    }
    // The other ranges go too: every range must restart from one step.
    for (const Placement& p : job.ranges) {
      if (p.shard_id != shard_id)
        registry_.shard(p.shard_id).control->Drop(jid, /*ended=*/false);
      if (!p.backup_shard_id.empty() && p.backup_shard_id != shard_id)
        registry_.shard(p.backup_shard_id).control->Drop(jid, false);
    }
    job.ranges.clear();
    job.installed = false;
    job.members.clear();
    job.leaves.clear();
    job.awaiting_start = true;
    ++job.map_version;  // work in flight for the old map is void
    job.MarkDirty();
    lost.push_back(jid);
  }
  return lost;
}

namespace {

// "host:port" (or "[v6]:port") -> its host; an address without a port is
// its own host.
std::string HostOf(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(0, close + 1);
  }
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

std::string Planner::PickBackup(
    const std::vector<std::pair<int64_t, std::string>>& order,
    const std::set<std::string>& taken, const std::string& primary) const {
  auto host = [this](const std::string& id) {
    auto s = registry_.shards().find(id);
    return s == registry_.shards().end() ? std::string()
                                         : HostOf(s->second.address);
  };
  const std::string primary_host = host(primary);
  std::string same_host;  // the first free one, on the primary's host
  for (const auto& [load, id] : order) {
    if (taken.count(id)) continue;
    if (primary_host.empty() || host(id) != primary_host) return id;
    if (same_host.empty()) same_host = id;
  }
  return same_host;
}

void Planner::ReplaceBackups(JobEntry& job, absl::Time now) {
  if (RangeCopies(job.spec) < 2 || !job.installed) return;
  CheckSeeded(job, now);
  // Shards that hold a copy of the job already: never a second one.
  std::set<std::string> holding;
  for (const Placement& p : job.ranges) {
    holding.insert(p.shard_id);
    holding.insert(p.backup_shard_id);
  }
  for (Placement& p : job.ranges) {
    if (!p.backup_shard_id.empty() || p.promote || p.unforward) continue;
    const std::string best =
        PickBackup(LiveShardsByLoad(), holding, p.shard_id);
    if (best.empty()) return;  // none free: it goes on with one copy
    p.backup_shard_id = best;
    p.seed = true;
    holding.insert(best);
    job.AddEvent(now, absl::StrCat("a new backup of range [", p.offset, ", ",
                                   p.offset + p.count, ") on parameter shard ",
                                   best, " is seeded from its primary"));
    job.MarkDirty();
  }
}

void Planner::CheckSeeded(JobEntry& job, absl::Time now) {
  bool any = false;
  for (const Placement& p : job.ranges) any = any || p.seeding;
  if (!any) return;
  const std::vector<v1::RangeStatus> status = registry_.RangeStatuses(job);
  for (size_t i = 0; i < job.ranges.size() && i < status.size(); ++i) {
    Placement& p = job.ranges[i];
    // A report from before the seed may still say its lost predecessor
    // was in step: only one of a version made since, sending to this
    // backup, counts.
    if (!p.seeding || !status[i].backup_in_step() ||
        status[i].version() <= p.seeded_at ||
        status[i].peer_address() !=
            registry_.shard(p.backup_shard_id).address) {
      continue;
    }
    p.seed = p.seeding = false;
    job.AddEvent(now, absl::StrCat("the new backup of range [", p.offset, ", ",
                                   p.offset + p.count, ") on parameter shard ",
                                   p.backup_shard_id,
                                   " caught up with its primary at step ",
                                   status[i].version()));
    job.MarkDirty();
  }
}

void Planner::FailOver(JobEntry& job, const std::string& lost,
                       absl::Time now) {
  int promoted = 0, alone = 0;
  for (Placement& p : job.ranges) {
    if (p.shard_id == lost) {
      p.shard_id = std::exchange(p.backup_shard_id, "");
      p.promote = true;
      ++promoted;
    } else if (p.backup_shard_id == lost) {
      p.backup_shard_id.clear();
      // Even one still being seeded: the primary may have been told to
      // send to it already (telling it to stop again is harmless).
      p.unforward = true;
      p.seed = false;
      p.seeding = false;
      ++alone;
    }
  }
  ++job.map_revision;
  job.AddEvent(
      now, absl::StrCat("parameter shard ", lost, " was lost: ",
                        promoted > 0 ? absl::StrCat(promoted, " backup range",
                                                    promoted == 1 ? "" : "s",
                                                    " took over")
                                     : "",
                        promoted > 0 && alone > 0 ? "; " : "",
                        alone > 0 ? absl::StrCat(alone, " range",
                                                 alone == 1 ? "" : "s",
                                                 " lost its backup")
                                  : "",
                        "; nothing was rolled back"));
  job.MarkDirty();
}

void Planner::Restart(JobEntry& job, std::shared_ptr<const StoredJob> start,
                      absl::Time now) {
  // A Python model without a checkpoint starts again from what it started
  // from (its worker-built initial weights), not from nothing.
  if (start != nullptr || !job.spec.is_python) job.start = std::move(start);
  job.weights_asked_of.clear();
  job.awaiting_start = false;
  // The event is the history; the condition is the job's message only
  // until the ranges are installed again.
  const std::string from =
      job.start != nullptr
          ? absl::StrCat("the checkpoint of step ", job.start->state.metrics.version)
          : "the initial weights (there is no checkpoint)";
  job.AddEvent(now, absl::StrCat("a parameter shard was lost; the job "
                                 "starts again from ",
                                 from));
  job.condition = absl::StrCat("a parameter shard was lost; resuming from ",
                               from, " once its ranges are placed");
  job.proto.mutable_metrics()->set_step(
      job.start != nullptr ? job.start->state.metrics.version : 0);
}

std::set<std::string> Planner::PlacedShards() const {
  std::set<std::string> placed;
  for (const auto& [jid, job] : jobs_.entries()) {
    for (const Placement& p : job.ranges) {
      placed.insert(p.shard_id);
      if (!p.backup_shard_id.empty()) placed.insert(p.backup_shard_id);
    }
  }
  return placed;
}

// The assignment goes out once the worker is a member on every range; one
// it holds already stands without being sent again: no spec again (a
// Python model's code can be megabytes, and every worker heartbeats about
// once a second).
void Planner::Assignment(const v1::HeartbeatRequest& req, const WorkerEntry& w,
                         const JobEntry& job,
                         v1::HeartbeatResponse* out) const {
  if (!job.installed) return;
  // The members it is (with fixed ranks, one a rank it holds), by rank.
  std::vector<const MemberSpec*> held;
  for (const MemberSpec& m : job.members) {
    if (MemberWorker(m.worker_id) == req.worker_id() &&
        m.incarnation == w.incarnation &&
        m.leave_step == MemberSpec::kNoStep) {
      held.push_back(&m);
    }
  }
  if (held.empty()) return;
  std::sort(held.begin(), held.end(),
            [](const MemberSpec* a, const MemberSpec* b) {
              return a->rank < b->rank;
            });
  std::string key = absl::StrCat(w.job_id, "/", job.map_version, "/",
                                 job.schedule.plan, "/", w.incarnation);
  // A failover moved a range: same placement, new addresses.
  if (job.map_revision > 0) absl::StrAppend(&key, "/r", job.map_revision);
  for (const MemberSpec* m : held)
    absl::StrAppend(&key, "/", m->worker_id, "@", m->join_step);
  if (req.held() == key) {
    out->set_unchanged(true);
    return;
  }
  v1::Assignment* a = out->mutable_assignment();
  a->set_key(key);
  a->set_job_id(w.job_id);
  a->set_spec(job.proto.spec());
  a->set_rank(held.front()->rank);
  a->set_world(job.schedule.last_world());
  a->set_join_step(held.front()->join_step);
  if (job.fixed_ranks()) {
    for (const MemberSpec* m : held) {
      v1::Assignment::HeldRank* h = a->add_ranks();
      h->set_rank(m->rank);
      h->set_join_step(m->join_step);
      h->set_member(m->worker_id);
    }
  }
  EncodeSchedule(job.schedule, a->mutable_schedule());
  v1::ShardMap* map = a->mutable_shard_map();
  map->set_version(job.map_version);
  for (const Placement& p : job.ranges) {
    v1::ShardMap::Entry* e = map->add_shards();
    e->set_address(registry_.shard(p.shard_id).address);
    e->set_offset(p.offset);
    e->set_count(p.count);
  }
}

// ----------------------------------------------------------------- plans --

void Planner::RestorePlan(JobEntry& job) {
  // A job that grew keeps its worlds with its record.
  std::vector<WorldPeriod> worlds;
  for (const v1::MembershipPeriod& p : job.proto.membership())
    worlds.push_back(WorldPeriod{p.first_epoch(), p.world()});
  if (worlds.empty())
    worlds.push_back({0, static_cast<int>(job.spec.training.World())});
  job.schedule = ScheduleOf(job.spec, TrainSize(job.spec.dataset), worlds,
                            job.proto.plan());
  job.plan_sent = job.schedule.plan;
  job.slots.assign(job.schedule.last_world(), "");
  RecordPlan(job);
}

void Planner::RecordPlan(JobEntry& job) {
  const Schedule& s = job.schedule;
  job.proto.set_workers_max(
      static_cast<int32_t>(job.spec.training.max_workers));
  job.proto.set_plan(s.plan);
  job.proto.clear_membership();
  for (const WorldPeriod& p : s.worlds) {
    v1::MembershipPeriod* m = job.proto.add_membership();
    m->set_first_epoch(p.first_epoch);
    m->set_first_step(s.EpochStartVersion(p.first_epoch));
    m->set_world(p.world);
    m->set_global_batch(p.world * job.spec.training.batch_size);
    m->set_steps_per_epoch(s.StepsPerEpoch(p.world));
  }
}

void Planner::AdoptPlan(JobEntry& job, const Schedule& grown, absl::Time now) {
  const WorldPeriod& p = grown.worlds.back();
  const bool grew = grown.worlds.size() != job.schedule.worlds.size() ||
                    p.world != job.schedule.worlds.back().world ||
                    p.first_epoch != job.schedule.worlds.back().first_epoch;
  job.schedule = grown;
  RecordPlan(job);
  if (!grew) return;  // the same worlds, numbered again (a stray plan)
  job.AddEvent(now,
               absl::StrCat("grows to ", p.world, " workers from step ",
                            grown.EpochStartVersion(p.first_epoch), " (epoch ",
                            p.first_epoch, "): global batch ",
                            p.world * job.spec.training.batch_size, ", ",
                            grown.total_steps, " steps in all"));
}

// ------------------------------------------------------------ membership --

namespace {

bool SameMember(const MemberSpec& a, const MemberSpec& b) {
  return a.worker_id == b.worker_id && a.incarnation == b.incarnation &&
         a.rank == b.rank;
}

bool Contains(const std::vector<MemberSpec>& members, const MemberSpec& m) {
  for (const MemberSpec& x : members) {
    if (SameMember(x, m)) return true;
  }
  return false;
}

// A member's last commit any range saw, and whether it said "nothing".
int64_t LastCommit(const std::vector<HoldReport>& reports, const MemberSpec& m,
                   bool* refused) {
  int64_t c = -1;
  *refused = false;
  for (const HoldReport& h : reports) {
    for (const MemberProgress& p : h.members) {
      if (p.worker_id == m.worker_id && p.incarnation == m.incarnation &&
          p.committed_step > c) {
        c = p.committed_step;
        *refused = p.last_refused;
      }
    }
  }
  return c;
}

// A leaver's leave step: decided before, or after the last step some range
// saw it commit (in bsp and ssp, not before it joined); noted in the task.
void DecideLeave(ControlTask& t, const std::vector<HoldReport>& reports,
                 MemberSpec& m) {
  auto decided = t.leaves.find({m.worker_id, m.incarnation});
  if (decided != t.leaves.end()) {
    m.leave_step = decided->second.first;
    m.last_refused = decided->second.second;
  } else {
    bool refused = false;
    const int64_t c = LastCommit(reports, m, &refused);
    m.leave_step = t.async ? c + 1 : std::max(c + 1, m.join_step);
    m.last_refused = refused && c + 1 == m.leave_step;
  }
  t.new_leaves[{m.worker_id, m.incarnation}] = {m.leave_step, m.last_refused};
}

bool RankTaken(const std::vector<MemberSpec>& desired, int rank) {
  for (const MemberSpec& d : desired) {
    if (d.rank == rank) return true;
  }
  return false;
}

// The step the last of `members` holding `rank` leaves at; `otherwise`
// when none has left.
int64_t LastLeave(const std::vector<MemberSpec>& members, int rank,
                  int64_t otherwise) {
  int64_t last = -1;
  for (const MemberSpec& m : members) {
    if (m.rank == rank && m.leave_step != MemberSpec::kNoStep)
      last = std::max(last, m.leave_step);
  }
  return last >= 0 ? last : otherwise;
}

}  // namespace

bool Planner::MembersDiffer(const ControlTask& t,
                            std::vector<MemberSpec>* active) {
  active->clear();
  for (const MemberSpec& m : t.members) {
    if (m.leave_step == MemberSpec::kNoStep) active->push_back(m);
  }
  // Fixed ranks: a member whose rank nobody took stays (its steps wait),
  // and no membership is set that leaves a rank without a member (its
  // steps would close without it).
  for (int r = 0; t.fixed_ranks && r < t.world; ++r) {
    if (!RankTaken(t.desired, r) && !RankTaken(*active, r)) return false;
  }
  bool changed = !t.fixed_ranks && active->size() != t.desired.size();
  for (const MemberSpec& d : t.desired)
    changed = changed || !Contains(*active, d);
  return changed;
}

// Leavers belong to every step some range saw them commit (that push
// reached every range); joiners join at the highest version any range has
// (no range has closed it).
std::vector<MemberSpec> Planner::DecideMembers(
    ControlTask& t, const std::vector<MemberSpec>& active,
    const std::vector<HoldReport>& reports) {
  int64_t vmin = INT64_MAX, vmax = 0;
  for (const HoldReport& h : reports) {
    vmin = std::min(vmin, h.version);
    vmax = std::max(vmax, h.version);
  }
  // Async steps are each worker's own: versions do not bound them.
  const bool async = t.async;
  std::vector<MemberSpec> next;
  for (MemberSpec m : t.members) {
    if (m.leave_step == MemberSpec::kNoStep && !Contains(t.desired, m) &&
        !(t.fixed_ranks && !RankTaken(t.desired, m.rank))) {
      DecideLeave(t, reports, m);
      // Async ranges drop a leaver at once: it goes out in this round, and
      // one that committed nothing anywhere just goes (nothing to settle).
      if (async && m.leave_step > 0) next.push_back(m);
      if (async) continue;
    }
    if (async) {
      if (m.leave_step == MemberSpec::kNoStep) next.push_back(m);  // stays
    } else if (m.leave_step > vmin) {
      // Keep a leaver while some range may still need its last step.
      next.push_back(m);
    }
  }
  std::vector<MemberSpec> growing;
  for (const MemberSpec& d : t.desired) {
    if (Contains(active, d)) continue;
    MemberSpec m = d;
    // Async steps are each worker's own: a refill starts near the others'.
    // Not before its rank has data (a slot of a world still to come: the
    // joiner that took it left before its epoch), or it would push empty
    // steps, each one of an async job's versions.
    m.join_step = std::max(
        async ? MaxClock(reports, t.schedule.total_steps) : vmax,
        t.schedule.FirstStepOfRank(m.rank));
    // Fixed ranks: from the step its rank's last holder left at, which no
    // range has closed (it needed that holder).
    if (t.fixed_ranks) m.join_step = LastLeave(next, m.rank, m.join_step);
    // A rank past the job's world joins it as it grows; one within
    // refills a vacant slot, from the next step.
    if (m.rank >= t.schedule.last_world()) {
      growing.push_back(m);
    } else {
      next.push_back(m);
    }
  }
  if (!growing.empty()) GrowMembers(t, vmax, reports, growing, &next);
  return next;
}

// Joiners start an epoch with the world that includes them: the first
// whose first step no worker can have begun (bsp and ssp: past the
// versions any range has, the staleness and a step being computed beside
// its pull; async: past every member's own clock), and no earlier than the
// last world decided. Its split and every later epoch's follow the new
// world; epochs before it are as they were.
void Planner::GrowMembers(ControlTask& t, int64_t vmax,
                          const std::vector<HoldReport>& reports,
                          std::vector<MemberSpec>& growing,
                          std::vector<MemberSpec>* next) {
  const Schedule& s = t.schedule;
  const int64_t bound =
      t.async ? MaxClock(reports, s.total_steps) + kJoinMargin
              : vmax + t.window + kJoinMargin;
  const int64_t epoch = JoinEpoch(s, bound, t.max_steps);
  if (epoch < 0) {
    for (const MemberSpec& m : growing) t.not_joined.push_back(m.worker_id);
    return;
  }
  Schedule grown = GrowSchedule(s, epoch, t.world, t.max_steps);
  grown.plan = t.next_plan;
  for (MemberSpec& m : growing) {
    m.join_step = grown.EpochStart(epoch);
    next->push_back(m);
  }
  t.new_schedule = std::move(grown);
}

int64_t Planner::JoinEpoch(const Schedule& s, int64_t bound,
                           int64_t max_steps) {
  // The first epoch that starts at or past `bound`, in the last world.
  const Schedule::Place at = s.Locate(bound);
  const int64_t epoch = std::max(s.worlds.back().first_epoch,
                                 at.index == 0 ? at.epoch : at.epoch + 1);
  if (epoch >= s.epochs) return -1;
  if (max_steps > 0 && s.EpochStartVersion(epoch) >= max_steps) return -1;
  return epoch;
}

int64_t Planner::MaxClock(const std::vector<HoldReport>& reports,
                          int64_t total_steps) {
  int64_t clock = 0;
  for (const HoldReport& h : reports) {
    for (const MemberProgress& p : h.members) {
      // A worker's word: one past the schedule is nonsense, not a bound.
      if (p.clock <= total_steps) clock = std::max(clock, p.clock);
      if (p.pushed_step < total_steps)
        clock = std::max(clock, p.pushed_step + 1);
    }
  }
  return clock;
}

}  // namespace tally
