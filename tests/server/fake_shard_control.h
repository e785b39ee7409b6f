// A ShardControl for the coordinator's parts' tests: it holds one range of
// `count` values (each `value`, at `version`), answers each call as the
// test set it, and records the control calls it was given.
#ifndef TALLY_TESTS_SERVER_FAKE_SHARD_CONTROL_H_
#define TALLY_TESTS_SERVER_FAKE_SHARD_CONTROL_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/shard_control.h"

namespace tally::testing {

class FakeShardControl final : public ShardControl {
 public:
  // What it answers.
  int64_t count = 0;
  float value = 0.0f;
  int64_t version = 0;
  int optimizer_slots = 0;  // each of `count` values
  std::shared_ptr<const std::string> buffers;
  absl::Status install_status, retire_status, members_status;
  absl::Status hold_status;
  // Save answers these first, one a call; then the range at the version.
  std::deque<absl::Status> save_errors;
  std::vector<v1::RangeStatus> ranges;  // Status()
  bool is_local = true;

  // What it was told.
  std::vector<v1::InstallRangeRequest> installs;
  std::vector<std::vector<MemberSpec>> member_sets;
  std::vector<PlanChange> plans;
  std::vector<std::string> drops;  // job ids
  int retires = 0;
  int holds = 0;
  std::vector<int64_t> saves;  // the versions asked for

  absl::Status Install(const v1::InstallRangeRequest& req) override {
    installs.push_back(req);
    return install_status;
  }
  absl::StatusOr<HoldReport> Hold(const std::string&, int64_t, int64_t,
                                  absl::Duration) override {
    ++holds;
    if (!hold_status.ok()) return hold_status;
    HoldReport h;
    h.version = version;
    return h;
  }
  absl::Status SetMembers(const std::string&, int64_t,
                          const std::vector<MemberSpec>& members, int64_t,
                          const PlanChange& plan) override {
    member_sets.push_back(members);
    plans.push_back(plan);
    return members_status;
  }
  absl::Status Retire(const std::string&, int64_t) override {
    ++retires;
    return retire_status;
  }
  void Drop(const std::string& job_id, bool) override {
    drops.push_back(job_id);
  }
  absl::StatusOr<ShardState> Save(const std::string&, int64_t, int64_t at,
                                  int64_t, absl::Duration, bool) override {
    absl::MutexLock lock(&mu_);
    saves.push_back(at);
    if (!save_errors.empty()) {
      absl::Status s = save_errors.front();
      save_errors.pop_front();
      return s;
    }
    ShardState st;
    st.metrics.version = at;
    st.weights = std::make_shared<std::vector<float>>(count, value);
    st.optimizer.slots.assign(optimizer_slots,
                              std::vector<float>(count, value));
    st.buffers = buffers;
    return st;
  }
  absl::StatusOr<v1::ReadTableResponse> ReadTable(const std::string&, int64_t,
                                                  int, int64_t,
                                                  int64_t) override {
    return absl::UnimplementedError("no tables");
  }
  absl::StatusOr<std::vector<v1::RangeStatus>> Status() override {
    return ranges;
  }
  bool local() const override { return is_local; }

 private:
  absl::Mutex mu_;
};

// The model and data the coordinator parts' tests place: a 4 -> 2 linear
// layer (10 parameters) on synthetic data. A test's spec adds its
// training line: TALLY_TINY_MODEL "training: {workers: 2}\n".
#define TALLY_TINY_MODEL                                              \
  "model: {layers: [{linear: {in_features: 4, out_features: 2}}]}\n" \
  "dataset: {name: synthetic, features: 4, classes: 2}\n"

// Where the parts' tests' clocks stand.
inline const absl::Time kPartsNow = absl::UnixEpoch() + absl::Hours(1);

// Adds `n` fake shards ("h:0", "h:1", ...) to a registry at kPartsNow;
// returns them in that order.
template <typename Registry>
std::vector<std::shared_ptr<FakeShardControl>> AddFakeShards(Registry& registry,
                                                             int n) {
  std::vector<std::shared_ptr<FakeShardControl>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_shared<FakeShardControl>());
    registry.AddShard("h:" + std::to_string(i), out.back(), kPartsNow);
  }
  return out;
}

}  // namespace tally::testing

#endif  // TALLY_TESTS_SERVER_FAKE_SHARD_CONTROL_H_
