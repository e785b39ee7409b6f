// One membership for every shard: a job split over two shards (two
// ShardHosts in process, the second driven as a shard process would be),
// and a worker that dies half-way through a step. Whatever each shard saw
// of it, both close the step with the same workers, because the
// coordinator decides from what every shard reports, not each shard alone.
// Each test runs with streamed sums (the default) and with staged pushes.
#include <algorithm>
#include <memory>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"
#include "server/control/coordinator.h"
#include "server/control/partition.h"
#include "server/data/local_shard_control.h"
#include "server/data/shard_host.h"
#include "tests/test_util.h"

namespace tally {
namespace {

constexpr char kSpec[] = R"(
name: split
model: {layers: [{linear: {in_features: 4, out_features: 2}}]}
dataset: {name: synthetic, features: 4, classes: 2}
training: {workers: 2, shards: 2}
optimizer: {type: sgd, lr: 1.0, momentum: 0.0}
)";

// The same model on a job that may grow: 8 samples, one a batch, so 4
// steps an epoch on two workers.
constexpr char kGrowingSpec[] = R"(
name: grows
model: {layers: [{linear: {in_features: 4, out_features: 2}}]}
dataset: {name: synthetic, features: 4, classes: 2, train_size: 8}
training: {workers: {min: 2, max: 3}, shards: 2, batch_size: 1, epochs: 10}
optimizer: {type: sgd, lr: 1.0, momentum: 0.0}
)";

class MembershipTest : public ::testing::TestWithParam<bool> {
 protected:
  virtual const char* Spec() const { return kSpec; }

  MembershipTest()
      : local_(&clock_, {}, HostOptions()),
        remote_(&clock_, {}, HostOptions()),
        coord_(Options()) {}

  static ShardHost::Options HostOptions() {
    ShardHost::Options o;
    o.streamed_sums = GetParam();
    o.streamed_sums_min_elements = 0;
    return o;
  }

  CoordinatorOptions Options() {
    CoordinatorOptions o;
    o.clock = &clock_;
    o.lease_timeout = absl::Seconds(3);
    o.local_shard = MakeLocalShardControl(&local_);
    // The "shard process" is a second host in process.
    o.connect_shard = [this](const std::string&) {
      return MakeLocalShardControl(&remote_);
    };
    return o;
  }

  void SetUp() override {
    v1::RegisterShardRequest rs;
    rs.set_address("127.0.0.1:1");
    shard_ = coord_.RegisterShard(rs);
    auto job = coord_.Submit(Spec());
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = job->id();
    a_ = Register("a");
    b_ = Register("b");
    ASSERT_EQ(coord_.Get(job_)->state(), v1::RUNNING);
    auto r1 = local_.Find(job_);
    auto r2 = remote_.Find(job_);
    ASSERT_TRUE(r1.ok() && r2.ok()) << "the job is not on both shards";
    ranges_ = {*r1, *r2};
    EXPECT_EQ(r1->offset + r1->count, r2->offset);
    EXPECT_EQ(r1->count + r2->count, 10);
    // Both are members on both ranges: their assignments went out, with a
    // map of the two ranges.
    auto beat = Beat(a_);
    ASSERT_TRUE(beat.ok() && beat->has_assignment());
    EXPECT_EQ(beat->assignment().shard_map().shards_size(), 2);
    ASSERT_TRUE(Beat(b_)->has_assignment());
    before_ = {Weights(0), Weights(1)};
  }

  v1::RegisterWorkerResponse Register(const std::string& name) {
    v1::RegisterWorkerRequest r;
    r.set_name(name);
    r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    return *coord_.Register(r);
  }
  absl::StatusOr<v1::HeartbeatResponse> Beat(
      const v1::RegisterWorkerResponse& w) {
    v1::HeartbeatRequest r;
    r.set_worker_id(w.worker_id());
    r.set_incarnation(w.incarnation());
    return coord_.Heartbeat(r);
  }
  // `w`'s push of `step` (gradient `g` everywhere) to range i.
  void PushTo(int i, const v1::RegisterWorkerResponse& w, int64_t step,
              float g) {
    PushMeta m;
    m.worker_id = w.worker_id();
    m.incarnation = w.incarnation();
    m.step = step;
    m.base_version = step;
    m.samples = 1;
    std::vector<float> grad(ranges_[i].count, g);
    bool dup = false;
    TALLY_ASSERT_OK(ranges_[i].shard->Accept(m, grad.data(), &dup));
  }
  void CommitTo(int i, const v1::RegisterWorkerResponse& w, int64_t step) {
    ranges_[i].shard->Commit(w.worker_id(), w.incarnation(), step, true);
  }
  std::vector<float> Weights(int i) {
    int64_t v;
    return *ranges_[i].shard->Snapshot(&v);
  }
  // The shard process keeps its lease.
  void ShardBeat() {
    v1::ShardHeartbeatRequest r;
    r.set_shard_id(shard_.shard_id());
    r.set_incarnation(shard_.incarnation());
    ASSERT_TRUE(coord_.ShardHeartbeat(r).ok());
  }
  // a goes silent; b keeps its lease; the coordinator drops a.
  void LoseA() {
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(b_).ok());
    ShardBeat();
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(b_).ok());
    ShardBeat();
    coord_.Tick();
    EXPECT_THAT(Beat(a_), testing::HasReason(
                              absl::StatusCode::kFailedPrecondition,
                              v1::REGISTER_AGAIN));
  }
  // Every weight of range i moved by -delta since SetUp.
  void ExpectMoved(int i, float delta) {
    const std::vector<float> now = Weights(i);
    for (size_t k = 0; k < now.size(); ++k)
      EXPECT_FLOAT_EQ(now[k], before_[i][k] - delta) << "range " << i;
  }

  FakeClock clock_;
  ShardHost local_, remote_;
  Coordinator coord_;
  v1::RegisterShardResponse shard_;
  std::string job_;
  v1::RegisterWorkerResponse a_, b_;
  std::vector<Range> ranges_;
  std::vector<std::vector<float>> before_;
};

// a pushed step 0 to the first range only, and died: it committed nowhere,
// so no range counts it; the second range never saw it.
TEST_P(MembershipTest, APushThatReachedOneShardCountsOnNone) {
  PushTo(0, a_, 0, 1.0f);
  PushTo(0, b_, 0, 3.0f);
  PushTo(1, b_, 0, 3.0f);
  CommitTo(0, b_, 0);
  CommitTo(1, b_, 0);
  EXPECT_EQ(ranges_[0].shard->version(), 0);  // both wait for a
  EXPECT_EQ(ranges_[1].shard->version(), 0);
  LoseA();
  if (GetParam()) {
    // a's push was in the first range's sum: that sum went, and b, told
    // to push again, does.
    EXPECT_EQ(ranges_[0].shard->version(), 0);
    EXPECT_EQ(ranges_[0].shard->Metrics().sum_resets, 1);
    absl::Status told;
    ranges_[0].shard->WhenClock(b_.worker_id(), 1, 0,
                                absl::InfiniteFuture(),
                                [&](absl::Status s) { told = s; });
    EXPECT_THAT(told, testing::HasReason(absl::StatusCode::kAborted,
                                         v1::PUSH_AGAIN));
    PushTo(0, b_, 0, 3.0f);
    CommitTo(0, b_, 0);
  }
  EXPECT_EQ(ranges_[0].shard->version(), 1);
  EXPECT_EQ(ranges_[1].shard->version(), 1);
  ExpectMoved(0, 3.0f);  // b's gradient alone, on both ranges
  ExpectMoved(1, 3.0f);
  EXPECT_EQ(coord_.Get(job_)->metrics().step(), 1);
}

// a pushed step 0 everywhere and its commit reached the first range only
// before it died: the first range closed the step with a; the second, which
// had a's push but not its commit, counts it too.
TEST_P(MembershipTest, ACommitThatReachedOneShardCountsOnAll) {
  PushTo(0, a_, 0, 1.0f);
  PushTo(1, a_, 0, 1.0f);
  PushTo(0, b_, 0, 3.0f);
  PushTo(1, b_, 0, 3.0f);
  CommitTo(0, b_, 0);
  CommitTo(1, b_, 0);
  CommitTo(0, a_, 0);
  EXPECT_EQ(ranges_[0].shard->version(), 1);  // closed with a and b
  EXPECT_EQ(ranges_[1].shard->version(), 0);  // waits for a's commit
  ExpectMoved(0, 2.0f);
  LoseA();
  EXPECT_EQ(ranges_[1].shard->version(), 1);
  ExpectMoved(1, 2.0f);  // the same step as the first range: a and b
  // From step 1 on, a is no member anywhere; b alone closes it.
  PushTo(0, b_, 1, 3.0f);
  PushTo(1, b_, 1, 3.0f);
  CommitTo(0, b_, 1);
  CommitTo(1, b_, 1);
  EXPECT_EQ(ranges_[0].shard->version(), 2);
  EXPECT_EQ(ranges_[1].shard->version(), 2);
  ExpectMoved(0, 5.0f);
  ExpectMoved(1, 5.0f);
}

// A worker that joins mid-job is a member from the same step on both
// ranges, even when one range is a step ahead of the other.
TEST_P(MembershipTest, AJoiningWorkerStartsAtTheSameStepOnEveryShard) {
  PushTo(0, a_, 0, 1.0f);
  PushTo(1, a_, 0, 1.0f);
  PushTo(0, b_, 0, 1.0f);
  PushTo(1, b_, 0, 1.0f);
  CommitTo(0, a_, 0);
  CommitTo(0, b_, 0);
  CommitTo(1, b_, 0);  // range 1 still waits for a's commit
  EXPECT_EQ(ranges_[0].shard->version(), 1);
  EXPECT_EQ(ranges_[1].shard->version(), 0);
  LoseA();  // a counts at step 0 everywhere (its commit reached range 0)
  auto c = Register("c");
  ASSERT_TRUE(Beat(c).ok());
  ASSERT_TRUE(Beat(c)->has_assignment());
  for (const Range& r : ranges_) {
    bool found = false;
    for (const MemberSpec& m : r.shard->Describe().members) {
      if (m.worker_id != c.worker_id()) continue;
      found = true;
      EXPECT_EQ(m.join_step, 1);  // the highest version any range had
    }
    EXPECT_TRUE(found);
  }
}

// A range whose step closed first (both commits reached it) is a version
// ahead of the other, and has the next step's loss: the job's figures, and
// its curve point, are those of the step they are shown at (the lowest
// version), never the next step's drawn a step early.
TEST_P(MembershipTest, TheLossShownIsTheLossOfTheStepShown) {
  const auto push = [this](int i, const v1::RegisterWorkerResponse& w,
                           int64_t step, double loss) {
    PushMeta m;
    m.worker_id = w.worker_id();
    m.incarnation = w.incarnation();
    m.step = step;
    m.base_version = step;
    m.samples = 1;
    m.loss_sum = loss;
    std::vector<float> grad(ranges_[i].count, 0.5f);
    bool dup = false;
    TALLY_ASSERT_OK(ranges_[i].shard->Accept(m, grad.data(), &dup));
  };
  for (int i = 0; i < 2; ++i) {
    push(i, a_, 0, 1.0);
    push(i, b_, 0, 1.0);
    CommitTo(i, a_, 0);
    CommitTo(i, b_, 0);
  }
  for (int i = 0; i < 2; ++i) {
    push(i, a_, 1, 0.25);
    push(i, b_, 1, 0.25);
  }
  CommitTo(0, a_, 1);
  CommitTo(0, b_, 1);
  ASSERT_EQ(ranges_[0].shard->version(), 2);
  ASSERT_EQ(ranges_[1].shard->version(), 1);
  coord_.Tick();  // a curve point
  const v1::JobMetrics m = coord_.Get(job_)->metrics();
  EXPECT_EQ(m.step(), 1);
  EXPECT_DOUBLE_EQ(m.loss(), 1.0);
  auto history = coord_.History(job_);
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_GT(history->curve_size(), 0);
  const v1::CurvePoint& last = history->curve(history->curve_size() - 1);
  EXPECT_EQ(last.step(), 1);
  EXPECT_DOUBLE_EQ(last.loss(), 1.0);
  CommitTo(1, a_, 1);
  CommitTo(1, b_, 1);
  EXPECT_EQ(coord_.Get(job_)->metrics().step(), 2);
  EXPECT_DOUBLE_EQ(coord_.Get(job_)->metrics().loss(), 0.25);
}

INSTANTIATE_TEST_SUITE_P(Sums, MembershipTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Streamed" : "Staged";
                         });

class GrowingMembershipTest : public MembershipTest {
 protected:
  const char* Spec() const override { return kGrowingSpec; }
  // Where `w` is a member on each range: its join step, -1 where it is not.
  std::vector<int64_t> JoinSteps(const v1::RegisterWorkerResponse& w) {
    std::vector<int64_t> out;
    for (const Range& r : ranges_) {
      int64_t join = -1;
      for (const MemberSpec& m : r.shard->Describe().members)
        if (m.worker_id == w.worker_id()) join = m.join_step;
      out.push_back(join);
    }
    return out;
  }
};

// A worker that joins a growing job starts the next epoch on every range;
// if it dies before then, the worker that takes its slot starts there too,
// not at the job's step (its rank has no data before that epoch).
TEST_P(GrowingMembershipTest, ARefillOfAJoinersSlotStartsAtItsEpoch) {
  auto c = Register("c");
  ASSERT_TRUE(Beat(c).ok());
  auto joined = Beat(c);
  ASSERT_TRUE(joined.ok() && joined->has_assignment());
  EXPECT_EQ(joined->assignment().rank(), 2);
  EXPECT_EQ(joined->assignment().join_step(), 4);  // epoch 1
  EXPECT_EQ(JoinSteps(c), (std::vector<int64_t>{4, 4}));
  // c goes silent before step 4; a and b keep their leases.
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(Beat(a_).ok());
    ASSERT_TRUE(Beat(b_).ok());
    ShardBeat();
    coord_.Tick();
  }
  auto d = Register("d");
  ASSERT_TRUE(Beat(d).ok());
  auto refilled = Beat(d);
  ASSERT_TRUE(refilled.ok() && refilled->has_assignment());
  EXPECT_EQ(refilled->assignment().rank(), 2);
  EXPECT_EQ(refilled->assignment().join_step(), 4);
  EXPECT_EQ(JoinSteps(d), (std::vector<int64_t>{4, 4}));
}

INSTANTIATE_TEST_SUITE_P(Sums, GrowingMembershipTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Streamed" : "Staged";
                         });

TEST(PartitionTest, RangesCoverTheVectorOnceAndAreBalanced) {
  Rng rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    // A random layer list: its flat vector is the sum of the layer sizes.
    int64_t n = 0;
    const int layers = 1 + static_cast<int>(rng.Below(8));
    for (int l = 0; l < layers; ++l) {
      const int64_t in = 1 + rng.Below(4096), out = 1 + rng.Below(4096);
      n += in * out + out;
    }
    const int k = 1 + static_cast<int>(rng.Below(8));
    const auto ranges = PartitionRanges(n, k);
    ASSERT_EQ(static_cast<int>(ranges.size()), k);
    int64_t next = 0, largest = 0;
    for (const auto& [offset, count] : ranges) {
      EXPECT_EQ(offset, next);  // contiguous, in order: each element once
      EXPECT_GT(count, 0);
      next = offset + count;
      largest = std::max(largest, count);
    }
    EXPECT_EQ(next, n);
    const double mean = static_cast<double>(n) / k;
    EXPECT_LE(largest / mean, 1.05) << n << " over " << k;
  }
  // Small models are not cut into ranges under 1 MiB; asked-for counts
  // wait for enough shards.
  EXPECT_EQ(ShardCount(235146, 0, 4), 1);
  EXPECT_EQ(ShardCount(4 * kMinRangeElements, 0, 3), 3);
  EXPECT_EQ(ShardCount(4 * kMinRangeElements, 0, 8), 4);
  EXPECT_EQ(ShardCount(100, 3, 2), 0);
  EXPECT_EQ(ShardCount(100, 3, 3), 3);
  EXPECT_EQ(ShardCount(2, 3, 3), 2);
  EXPECT_EQ(ShardCount(100, 0, 0), 0);
}

}  // namespace
}  // namespace tally
