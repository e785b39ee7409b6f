// A job's Schedule (common/spec/job_spec.h) on the wire (v1::Schedule) and
// back: the coordinator writes it into assignments and installs, workers
// and shards read it. Header-only: its users link the spec and the protos.
#ifndef TALLY_PROTO_SCHEDULE_H_
#define TALLY_PROTO_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "common/spec/job_spec.h"
#include "proto/tally.pb.h"

namespace tally {

// training.ranks: rank `rank` held by worker `worker_id`, the `term`th
// time the rank was given to a worker, is the member
// "WORKER_ID#RANK.TERM" on every range (v1::Assignment.HeldRank.member):
// a rank that comes back to a worker it left is a member of its own, not
// the one that left. The worker a member id names (itself, for a member of
// a job without ranks).
inline std::string RankMember(const std::string& worker_id, int rank,
                              int64_t term) {
  return absl::StrCat(worker_id, "#", rank, ".", term);
}
inline std::string MemberWorker(const std::string& member_id) {
  return member_id.substr(0, member_id.find('#'));
}

inline void EncodeSchedule(const Schedule& s, v1::Schedule* out) {
  out->set_train_size(s.train_size);
  out->set_steps_per_epoch(s.steps_per_epoch);
  out->set_total_steps(s.total_steps);
  out->clear_worlds();
  for (const WorldPeriod& p : s.worlds) {
    v1::WorldPeriod* w = out->add_worlds();
    w->set_first_epoch(p.first_epoch);
    w->set_world(p.world);
  }
  out->set_plan(s.plan);
}

// The worlds a message names; `world` alone (from epoch 0) when it names
// none (a coordinator of an earlier release).
inline std::vector<WorldPeriod> DecodeWorlds(const v1::Schedule& s,
                                             int world) {
  std::vector<WorldPeriod> out;
  for (const v1::WorldPeriod& p : s.worlds())
    out.push_back(WorldPeriod{p.first_epoch(), p.world()});
  if (out.empty()) out.push_back(WorldPeriod{0, world});
  return out;
}

}  // namespace tally

#endif  // TALLY_PROTO_SCHEDULE_H_
