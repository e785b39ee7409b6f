// Aggregation and step-closing rules of a parameter shard.
#include "server/data/shard.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/bfloat16.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

// A member's push of a step, accepted and then committed, as the member's
// next pull would commit it once every shard answered.
absl::Status PushAndCommit(ParameterShard& s, const PushMeta& m,
                           const float* g, bool* dup) {
  absl::Status st = s.Accept(m, g, dup);
  if (st.ok()) s.Commit(m.worker_id, m.incarnation, m.step, true);
  return st;
}

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(); }
  void Make(ParameterShard::Options o = {}) {
    OptimizerConfig c;
    c.lr = 1.0;  // plain SGD, lr 1: new weights = old - mean gradient
    shard_ = std::make_unique<ParameterShard>(
        std::vector<float>{10, 20, 30}, *Optimizer::Create(c, 3), &clock_, o);
    shard_->AddMember("a", 1);
    shard_->AddMember("b", 1);
  }
  PushMeta Meta(const std::string& w, int64_t step, int64_t samples,
                int64_t inc = 1) {
    PushMeta m;
    m.worker_id = w;
    m.incarnation = inc;
    m.step = step;
    m.base_version = step;
    m.samples = samples;
    m.loss_sum = samples * 0.5;
    m.correct = samples / 2;
    return m;
  }
  std::vector<float> Weights() {
    int64_t v;
    return *shard_->Snapshot(&v);
  }

  FakeClock clock_;
  std::unique_ptr<ParameterShard> shard_;
};

TEST_F(ShardTest, StepClosesWhenEveryMemberPushedWithASampleWeightedMean) {
  bool dup = false;
  std::vector<float> ga = {1, 1, 1}, gb = {4, 4, 4};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), ga.data(), &dup));
  EXPECT_EQ(shard_->version(), 0);  // b still missing
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 3), gb.data(), &dup));
  EXPECT_EQ(shard_->version(), 1);
  // mean = (1*1 + 3*4) / 4 = 3.25
  EXPECT_EQ(Weights(), (std::vector<float>{6.75f, 16.75f, 26.75f}));
  ShardMetrics m = shard_->Metrics();
  EXPECT_DOUBLE_EQ(m.loss, 0.5);
  EXPECT_EQ(m.samples, 4);
}

// The weights are stepped in place while nobody holds them (no second
// copy of the model), and copied first while a reader does: what a reader
// holds never changes under it.
TEST_F(ShardTest, HeldWeightsNeverChangeAndFreeOnesAreSteppedInPlace) {
  bool dup = false;
  std::vector<float> g = {1, 1, 1};
  int64_t v = -1;
  std::shared_ptr<const std::vector<float>> held = shard_->Snapshot(&v);
  const float* first = held->data();
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), g.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 1), g.data(), &dup));
  std::shared_ptr<const std::vector<float>> now = shard_->Snapshot(&v);
  EXPECT_EQ(v, 1);
  EXPECT_EQ(*held, (std::vector<float>{10, 20, 30}));  // untouched
  EXPECT_EQ(*now, (std::vector<float>{9, 19, 29}));
  EXPECT_NE(now->data(), first);
  const float* second = now->data();
  held.reset();
  now.reset();
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 1, 1), g.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 1, 1), g.data(), &dup));
  now = shard_->Snapshot(&v);
  EXPECT_EQ(v, 2);
  EXPECT_EQ(*now, (std::vector<float>{8, 18, 28}));
  EXPECT_EQ(now->data(), second);  // nobody held it: stepped in place
}

TEST_F(ShardTest, DuplicatePushIsAcknowledgedAndCountedOnce) {
  bool dup = false;
  std::vector<float> g = {1, 1, 1};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 2), g.data(), &dup));
  EXPECT_FALSE(dup);
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 2), g.data(), &dup));
  EXPECT_TRUE(dup);
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 2), g.data(), &dup));
  EXPECT_EQ(Weights(), (std::vector<float>{9, 19, 29}));  // mean 1, not 4/3
  // A retry after the step closed is still a duplicate, not an error.
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 2), g.data(), &dup));
  EXPECT_TRUE(dup);
}

TEST_F(ShardTest, ClosedFutureAndStaleStepsGetSpecificCodes) {
  bool dup = false;
  std::vector<float> g = {0, 0, 0};
  absl::Status ahead = PushAndCommit(*shard_, Meta("a", 1, 1), g.data(), &dup);
  EXPECT_THAT(ahead, HasReason(absl::StatusCode::kAborted, v1::STEP_NOT_OPEN));
  EXPECT_EQ(ReasonStep(ahead), 0);  // the open step
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), g.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 1), g.data(), &dup));
  shard_->AddMember("c", 5);
  absl::Status closed = PushAndCommit(*shard_, Meta("c", 0, 1, 5), g.data(), &dup);
  EXPECT_THAT(closed, HasReason(absl::StatusCode::kAborted, v1::STEP_CLOSED));
  EXPECT_EQ(ReasonStep(closed), 1);  // the weights' version now
  EXPECT_THAT(PushAndCommit(*shard_, Meta("a", 1, 1, 7), g.data(), &dup),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
  EXPECT_THAT(PushAndCommit(*shard_, Meta("zed", 1, 1), g.data(), &dup),
              HasReason(absl::StatusCode::kPermissionDenied,
                        v1::NOT_A_MEMBER));
  PushMeta wrong_base = Meta("a", 1, 1);
  wrong_base.base_version = 0;
  EXPECT_THAT(
      PushAndCommit(*shard_, wrong_base, g.data(), &dup),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("version 1")));
}

TEST_F(ShardTest, RemovingAMemberClosesTheStepWithoutIt) {
  bool dup = false;
  std::vector<float> g = {2, 2, 2};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), g.data(), &dup));
  shard_->RemoveMember("b");  // b died mid-step
  EXPECT_EQ(shard_->version(), 1);
  EXPECT_EQ(Weights(), (std::vector<float>{8, 18, 28}));
}

TEST_F(ShardTest, AMemberJoiningAStartedStepIsRequiredFromTheNextOne) {
  bool dup = false;
  std::vector<float> g = {1, 1, 1};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), g.data(), &dup));
  shard_->AddMember("c", 3);
  absl::Status later = PushAndCommit(*shard_, Meta("c", 0, 1, 3), g.data(), &dup);
  EXPECT_THAT(later, HasReason(absl::StatusCode::kAborted, v1::JOIN_LATER));
  EXPECT_EQ(ReasonStep(later), 1);
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 1), g.data(), &dup));
  EXPECT_EQ(shard_->version(), 1);  // closed without c
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 1, 1), g.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 1, 1), g.data(), &dup));
  EXPECT_EQ(shard_->version(), 1);  // now c is required
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("c", 1, 1, 3), g.data(), &dup));
  EXPECT_EQ(shard_->version(), 2);
}

TEST_F(ShardTest, RejectedPushIsCountedAndTheStepDoesNotWaitForIt) {
  bool dup = false;
  std::vector<float> g = {1, 1, 1};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), g.data(), &dup));
  shard_->Reject(Meta("b", 0, 1));  // e.g. it sent a NaN
  EXPECT_EQ(shard_->version(), 0);  // b's commit settles it
  shard_->Commit("b", 1, 0, /*contributed=*/false);
  EXPECT_EQ(shard_->version(), 1);
  EXPECT_EQ(Weights(), (std::vector<float>{9, 19, 29}));  // only a's gradient
  EXPECT_EQ(shard_->Metrics().rejected_pushes, 1);
  shard_->Reject(Meta("zed", 0, 1));  // not even a member: counted only
  EXPECT_EQ(shard_->Metrics().rejected_pushes, 2);
}

TEST_F(ShardTest, TheFirstDatasetFingerprintIsTheJobsAndAnotherIsRefused) {
  // A claim refused for its schedule fixes nothing.
  TALLY_ASSERT_OK(shard_->SetSchedule(2, 1));
  EXPECT_THAT(shard_->SetSchedule(3, 1, "1 files, 9 bytes, hash aa"),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::SCHEDULE_MISMATCH));
  TALLY_ASSERT_OK(shard_->SetSchedule(2, 1, "1 files, 8 bytes, hash bb"));
  TALLY_ASSERT_OK(shard_->SetSchedule(2, 1, "1 files, 8 bytes, hash bb"));
  TALLY_ASSERT_OK(shard_->SetSchedule(2, 1));  // no claim
  absl::Status other = shard_->SetSchedule(2, 1, "1 files, 8 bytes, hash cc");
  EXPECT_THAT(other, HasReason(absl::StatusCode::kFailedPrecondition,
                               v1::SCHEDULE_MISMATCH));
  EXPECT_THAT(std::string(other.message()),
              ::testing::HasSubstr("(1 files, 8 bytes, hash cc) differ from "
                                   "the job's (1 files, 8 bytes, hash bb)"));
}

TEST_F(ShardTest, ANewPlanEndsTheJobElsewhereAndFencesOlderClaims) {
  TALLY_ASSERT_OK(shard_->SetSchedule(40, 8, "", 0));
  // The job grew: plan 1 runs 25 versions.
  const std::vector<MemberSpec> members = shard_->Describe().members;
  TALLY_ASSERT_OK(shard_->SetMembers(members, 0, {1, 25}));
  // The same plan again: nothing.
  TALLY_ASSERT_OK(shard_->SetMembers(members, 0, {1, 99}));
  EXPECT_EQ(shard_->Metrics().total_steps, 25);
  absl::Status old = shard_->SetSchedule(40, 8, "", 0);
  EXPECT_THAT(old, HasReason(absl::StatusCode::kAborted, v1::PLAN_CHANGED));
  EXPECT_EQ(ReasonStep(old), 1);  // the range's plan
  EXPECT_THAT(shard_->SetSchedule(25, 8, "", 2),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));  // not here yet
  TALLY_ASSERT_OK(shard_->SetSchedule(25, 8, "", 1));
  EXPECT_THAT(shard_->SetSchedule(26, 8, "", 1),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::SCHEDULE_MISMATCH));
  // A plan that would end behind the range is a coordinator's bug.
  EXPECT_THAT(shard_->SetMembers(members, 0, {2, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_EQ(shard_->Metrics().total_steps, 25);
}

TEST_F(ShardTest, ZeroSampleContributionsAndTheEndOfTraining) {
  TALLY_ASSERT_OK(shard_->SetSchedule(2, 1));
  EXPECT_THAT(shard_->SetSchedule(3, 1),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::SCHEDULE_MISMATCH));
  bool dup = false;
  std::vector<float> g = {1, 1, 1};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 0), nullptr, &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 2), g.data(), &dup));
  EXPECT_EQ(Weights(), (std::vector<float>{9, 19, 29}));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 1, 0), nullptr, &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 1, 0), nullptr, &dup));
  EXPECT_EQ(shard_->version(), 2);  // closed with nothing to apply
  EXPECT_EQ(Weights(), (std::vector<float>{9, 19, 29}));
  // Training is over: step 2 never opens; the worker pulls (and finds the
  // final version).
  absl::Status over = PushAndCommit(*shard_, Meta("a", 2, 1), g.data(), &dup);
  EXPECT_THAT(over, HasReason(absl::StatusCode::kAborted, v1::STEP_CLOSED));
  EXPECT_EQ(ReasonStep(over), 2);
}

TEST_F(ShardTest, WaitersAreReleasedByTheStepOrTheirDeadline) {
  absl::Status first = absl::UnknownError("not called"), second = first;
  shard_->WhenVersion(1, clock_.Now() + absl::Seconds(5),
                      [&](absl::Status s) { first = s; });
  shard_->WhenVersion(2, clock_.Now() + absl::Seconds(5),
                      [&](absl::Status s) { second = s; });
  bool dup;
  std::vector<float> g = {1, 1, 1};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), g.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 1), g.data(), &dup));
  TALLY_EXPECT_OK(first);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kUnknown, ::testing::_));
  clock_.Advance(absl::Seconds(6));
  shard_->ExpireWaiters();
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               HasSubstr("version 2")));
  absl::Status now = absl::UnknownError("x");
  shard_->WhenVersion(1, clock_.Now(), [&](absl::Status s) { now = s; });
  TALLY_EXPECT_OK(now);  // already there: called at once
}

TEST_F(ShardTest, RetiredShardKeepsTheFinalWeightsAndRefusesPushes) {
  bool dup;
  std::vector<float> g = {1, 1, 1};
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 0, 1), g.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 0, 1), g.data(), &dup));
  shard_->Retire();
  EXPECT_EQ(Weights(), (std::vector<float>{9, 19, 29}));
  EXPECT_THAT(
      PushAndCommit(*shard_, Meta("a", 1, 1), g.data(), &dup),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ended")));
  shard_->ReleaseStaging(*shard_->AcquireStaging());  // harmless after retiring
}

TEST_F(ShardTest, StagingBuffersAreBoundedAndRecycled) {
  std::vector<std::unique_ptr<std::vector<float>>> out;
  for (int i = 0; i < 8; ++i) {  // 2 members: limit 2 * 2 + 4
    auto b = shard_->AcquireStaging();
    ASSERT_TRUE(b.ok()) << i;
    EXPECT_EQ((*b)->size(), 3u);
    out.push_back(*std::move(b));
  }
  EXPECT_THAT(
      shard_->AcquireStaging(),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("in flight")));
  float* first = out[0]->data();
  shard_->ReleaseStaging(std::move(out[0]));
  auto again = shard_->AcquireStaging();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->data(), first);  // the same buffer, reused
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A restored shard goes on exactly as the original would: same weights,
// same momentum, same schedule and metrics.
// The buffer region (a Python model's running statistics, DDP's
// broadcast_buffers): replaced when a step closes by the lowest rank whose
// push counted, never summed; returned with the weights; kept by Save.
TEST_F(ShardTest, TheBufferRegionIsTheLowestCountedRanksBuffers) {
  auto with = [&](PushMeta m, const std::string& bytes) {
    m.buffers = std::make_shared<const std::string>(bytes);
    return m;
  };
  auto region = [&] {
    std::shared_ptr<const std::string> b;
    int64_t v = 0;
    shard_->Snapshot(&v, nullptr, &b);
    return b == nullptr ? std::string("(none)") : *b;
  };
  bool dup = false;
  std::vector<float> g = {1, 1, 1};
  // A range that keeps no region refuses buffers.
  EXPECT_THAT(shard_->Accept(with(Meta("a", 0, 1), "AAAA"), g.data(), &dup),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keeps no buffers")));
  ParameterShard::Options keeps;  // a range that keeps a region of 4 bytes
  keeps.buffer_bytes = 4;
  Make(keeps);
  EXPECT_THAT(shard_->Accept(with(Meta("a", 0, 1), "AAA"), g.data(), &dup),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 bytes; the job's are 4")));
  EXPECT_EQ(region(), "(none)");  // nothing yet: workers keep their own
  // b (rank 1) pushes first; a (rank 0) is the one kept.
  TALLY_ASSERT_OK(
      PushAndCommit(*shard_, with(Meta("b", 0, 1), "BBBB"), g.data(), &dup));
  TALLY_ASSERT_OK(
      PushAndCommit(*shard_, with(Meta("a", 0, 1), "AAAA"), g.data(), &dup));
  EXPECT_EQ(shard_->version(), 1);
  EXPECT_EQ(region(), "AAAA");
  EXPECT_EQ(Weights(), (std::vector<float>{9, 19, 29}));  // not summed in
  // a's push is refused on some shard: it counts as nothing, b's stand.
  TALLY_ASSERT_OK(shard_->Accept(with(Meta("a", 1, 1), "aaaa"), g.data(), &dup));
  shard_->Commit("a", 1, 1, /*contributed=*/false);
  TALLY_ASSERT_OK(
      PushAndCommit(*shard_, with(Meta("b", 1, 1), "bbbb"), g.data(), &dup));
  EXPECT_EQ(shard_->version(), 2);
  EXPECT_EQ(region(), "bbbb");
  // A step whose pushes carry none keeps the region as it is.
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("a", 2, 1), g.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard_, Meta("b", 2, 1), g.data(), &dup));
  EXPECT_EQ(region(), "bbbb");
  // Saved and restored with the range.
  ShardState saved = shard_->Save();
  ASSERT_NE(saved.buffers, nullptr);
  EXPECT_EQ(*saved.buffers, "bbbb");
  OptimizerConfig c;
  auto restored = ParameterShard::Restore(saved, *Optimizer::Create(c, 3),
                                          &clock_);
  ASSERT_TRUE(restored.ok()) << restored.status();
  std::shared_ptr<const std::string> back;
  int64_t v = 0;
  (*restored)->Snapshot(&v, nullptr, &back);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(*back, "bbbb");
}

// ssp: a member may commit a step as nothing (refused on some shard) and go
// on to the next before the first closes; the refused push's buffers are
// not the region's.
TEST(ShardBuffersTest, SspNeverTakesARefusedPushsBuffers) {
  FakeClock clock;
  OptimizerConfig c;
  ConsistencySpec ssp;
  ssp.mode = ConsistencyMode::kSsp;
  ssp.staleness = 1;
  ParameterShard::Options o;
  o.consistency = ssp;
  o.buffer_bytes = 1;
  auto shard = std::make_unique<ParameterShard>(
      std::vector<float>{1, 2}, *Optimizer::Create(c, 2), &clock, o);
  shard->AddMember("a", 1);  // rank 0
  shard->AddMember("b", 1);  // rank 1
  std::vector<float> g = {1, 1};
  auto push = [&](const std::string& w, int64_t step, const char* bytes,
                  bool contributed) {
    PushMeta m;
    m.worker_id = w;
    m.incarnation = 1;
    m.step = step;
    m.base_version = 0;
    m.samples = 1;
    m.buffers = std::make_shared<const std::string>(bytes);
    bool dup = false;
    TALLY_ASSERT_OK(shard->Accept(m, g.data(), &dup));
    shard->Commit(w, 1, step, contributed);
  };
  push("a", 0, "x", /*contributed=*/false);  // NaN elsewhere, say
  push("a", 1, "y", true);
  EXPECT_EQ(shard->version(), 0);
  push("b", 0, "B", true);
  EXPECT_EQ(shard->version(), 1);
  std::shared_ptr<const std::string> region;
  int64_t v = 0;
  shard->Snapshot(&v, nullptr, &region);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(*region, "B");  // not a's refused "x"
}

// async: each applied push replaces the region only if its pusher is the
// lowest rank still a member (rank 0 may have left).
TEST(ShardBuffersTest, AsyncTakesTheLowestLiveRanksBuffers) {
  FakeClock clock;
  OptimizerConfig c;
  ConsistencySpec async;
  async.mode = ConsistencyMode::kAsync;
  ParameterShard::Options o;
  o.consistency = async;
  o.buffer_bytes = 1;
  auto shard = std::make_unique<ParameterShard>(
      std::vector<float>{1, 2}, *Optimizer::Create(c, 2), &clock, o);
  shard->AddMember("a", 1);
  shard->AddMember("b", 1);
  std::vector<float> g = {1, 1};
  auto push = [&](const std::string& w, int64_t step, const char* bytes) {
    PushMeta m;
    m.worker_id = w;
    m.incarnation = 1;
    m.step = step;
    m.base_version = shard->version();
    m.samples = 1;
    m.buffers = std::make_shared<const std::string>(bytes);
    bool dup = false;
    TALLY_ASSERT_OK(PushAndCommit(*shard, m, g.data(), &dup));
  };
  auto region = [&] {
    std::shared_ptr<const std::string> b;
    int64_t v = 0;
    shard->Snapshot(&v, nullptr, &b);
    return b == nullptr ? std::string("-") : *b;
  };
  push("b", 0, "B");
  EXPECT_EQ(shard->version(), 1);
  EXPECT_EQ(region(), "-");  // b is not the lowest rank
  push("a", 0, "A");
  EXPECT_EQ(region(), "A");
  push("b", 1, "b");
  EXPECT_EQ(region(), "A");
  shard->RemoveMember("a");
  push("b", 2, "c");
  EXPECT_EQ(shard->version(), 4);
  EXPECT_EQ(region(), "c");
}

TEST(ShardStateTest, ARestoredShardContinuesLikeTheOriginal) {
  FakeClock clock;
  OptimizerConfig c;
  c.lr = 0.1;
  c.momentum = 0.9;
  auto make = [&] {
    return std::make_unique<ParameterShard>(std::vector<float>{1, 2, 3, 4},
                                            *Optimizer::Create(c, 4), &clock);
  };
  auto step = [](ParameterShard& s, int64_t t, float g) {
    PushMeta m;
    m.worker_id = "w";
    m.incarnation = 1;
    m.step = t;
    m.base_version = t;
    m.samples = 2;
    m.loss_sum = 1.0;
    std::vector<float> grad = {g, -g, 2 * g, 0.5f};
    bool dup = false;
    ASSERT_TRUE(PushAndCommit(s, m, grad.data(), &dup).ok());
  };
  auto original = make();
  original->AddMember("w", 1);
  TALLY_ASSERT_OK(original->SetSchedule(10, 5));
  // The first pull starts the training clock.
  original->WhenVersion(0, absl::InfiniteFuture(), [](absl::Status) {});
  for (int t = 0; t < 3; ++t) step(*original, t, 0.5f + t);
  clock.Advance(absl::Seconds(4));
  const ShardState saved = original->Save();
  EXPECT_EQ(saved.metrics.version, 3);
  EXPECT_EQ(saved.optimizer.slots.size(), 1u);  // the momentum buffer

  auto restored =
      ParameterShard::Restore(saved, *Optimizer::Create(c, 4), &clock);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ParameterShard& r = **restored;
  EXPECT_EQ(r.version(), 3);
  EXPECT_EQ(r.Metrics().samples, 6);
  EXPECT_NEAR(r.Metrics().train_seconds, 4.0, 1e-6);
  EXPECT_THAT(r.SetSchedule(12, 5),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::SCHEDULE_MISMATCH));  // the schedule came back
  EXPECT_FALSE(r.CheckMember("w", 1).ok());       // members register again
  r.AddMember("w", 1);
  for (int t = 3; t < 5; ++t) {
    step(*original, t, 0.5f + t);
    step(r, t, 0.5f + t);
  }
  int64_t v1 = 0, v2 = 0;
  EXPECT_EQ(*original->Snapshot(&v1), *r.Snapshot(&v2));
  EXPECT_EQ(v1, 5);
  EXPECT_EQ(v2, 5);

  // A state that does not fit the optimizer is refused.
  ShardState wrong = saved;
  wrong.optimizer.slots.clear();
  EXPECT_THAT(ParameterShard::Restore(wrong, *Optimizer::Create(c, 4), &clock),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SGD")));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// Finite gradients whose weighted sum overflows: the step is not applied
// (the weights stay finite), and it is counted. Pushes of more samples than
// the job's batch are refused, so the sums stay bounded.
TEST(ShardNumericsTest, AnOverflowingStepIsNotAppliedAndSamplesAreBounded) {
  FakeClock clock;
  OptimizerConfig c;
  c.lr = 1.0;
  ParameterShard::Options o;
  o.max_samples = 64;
  ParameterShard shard({1, 2, 3}, *Optimizer::Create(c, 3), &clock, o);
  shard.AddMember("a", 1);
  shard.AddMember("b", 1);
  bool dup = false;
  PushMeta m;
  m.worker_id = "a";
  m.incarnation = 1;
  m.samples = 65;
  std::vector<float> g(3, 3.0e38f);
  EXPECT_THAT(shard.Accept(m, g.data(), &dup),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("batch size")));
  m.samples = 64;
  TALLY_ASSERT_OK(PushAndCommit(shard, m, g.data(), &dup));
  m.worker_id = "b";
  TALLY_ASSERT_OK(PushAndCommit(shard, m, g.data(), &dup));
  EXPECT_EQ(shard.version(), 1);  // the step closed...
  int64_t v;
  EXPECT_EQ(*shard.Snapshot(&v), (std::vector<float>{1, 2, 3}));  // ...unapplied
  EXPECT_EQ(shard.Metrics().rejected_pushes, 1);
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A version's bfloat16 encoding is made once, whoever pulls it, and every
// new version gets its own, also when its snapshot reuses an earlier
// version's buffer (the shard recycles buffers nobody holds).
TEST(ShardBfloat16Test, EncodedOncePerVersion) {
  FakeClock clock;
  OptimizerConfig c;
  c.lr = 1.0;
  ParameterShard shard(std::vector<float>{1.5f, -2.25f, 3.0f},
                       *Optimizer::Create(c, 3), &clock);
  shard.AddMember("a", 1);
  auto encoding_of = [](const std::vector<float>& w) {
    std::vector<uint16_t> e(w.size());
    FloatToBfloat16(w.data(), reinterpret_cast<char*>(e.data()),
                    static_cast<int64_t>(w.size()));
    return e;
  };
  auto step = [&](int64_t t) {
    std::vector<float> g = {1, 1, 1};
    bool dup = false;
    PushMeta m;
    m.worker_id = "a";
    m.incarnation = 1;
    m.step = t;
    m.base_version = t;
    m.samples = 1;
    TALLY_ASSERT_OK(PushAndCommit(shard, m, g.data(), &dup));
  };
  int64_t v = 0;
  auto s0 = shard.Snapshot(&v);
  auto e0 = shard.Bfloat16Of(s0, v);
  EXPECT_EQ(shard.Bfloat16Of(s0, v), e0);  // the same encoding again
  EXPECT_EQ(*e0, encoding_of(*s0));
  const void* first_buffer = nullptr;
  for (int64_t t = 0; t < 4; ++t) {
    step(t);
    auto s = shard.Snapshot(&v);
    ASSERT_EQ(v, t + 1);
    if (t == 0) first_buffer = s->data();
    if (t == 2) {
      EXPECT_EQ(s->data(), first_buffer);  // a reused buffer
    }
    if (t == 1) continue;  // nobody pulls version 2 in bfloat16
    auto e = shard.Bfloat16Of(s, v);
    EXPECT_EQ(*e, encoding_of(*s)) << "version " << v;
  }
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// ------------------------------------------------------- streamed sums --
// (bsp without backup workers: pushes summed block by block as they come.)

constexpr int64_t kStreamN = 1000;

std::unique_ptr<ParameterShard> StreamShard(FakeClock* clock, bool streamed,
                                            int members) {
  OptimizerConfig c;
  c.type = OptimizerType::kAdam;
  c.lr = 0.01;
  ParameterShard::Options o;
  o.streamed_sums = streamed;
  auto shard = std::make_unique<ParameterShard>(
      std::vector<float>(kStreamN, 0.5f), *Optimizer::Create(c, kStreamN),
      clock, o);
  for (int i = 0; i < members; ++i)
    shard->AddMember(std::string(1, static_cast<char>('a' + i)), 1);
  return shard;
}

PushMeta StreamMeta(int member, int64_t step, int64_t samples) {
  PushMeta m;
  m.worker_id = std::string(1, static_cast<char>('a' + member));
  m.incarnation = 1;
  m.step = step;
  m.base_version = step;
  m.samples = samples;
  m.loss_sum = 0.25 * samples;
  return m;
}

// Gradients whose magnitudes span six decades, so that summing them in
// another order rounds differently.
std::vector<float> WideGradient(Rng& rng) {
  std::vector<float> g(kStreamN);
  for (float& x : g) {
    x = static_cast<float>((rng.UniformFloat() - 0.5) *
                           std::pow(10.0, 6.0 * rng.UniformFloat() - 3.0));
  }
  return g;
}

// Four members push each step in blocks of random sizes, each member's
// blocks in its own random order, all interleaved at random; a block whose
// turn has not come waits and is tried again once woken. The weights after
// three Adam steps are bit for bit those of the same pushes staged whole,
// and the data are such that another order of summation would not be.
TEST(StreamedSumTest, AnyArrivalOrderGivesTheStagedSumBitForBit) {
  FakeClock clock;
  constexpr int kMembers = 4;
  auto streamed = StreamShard(&clock, true, kMembers);
  auto staged = StreamShard(&clock, false, kMembers);
  ASSERT_TRUE(streamed->StreamsPushes());
  ASSERT_FALSE(staged->StreamsPushes());
  Rng rng(11);
  int waits = 0;
  for (int64_t t = 0; t < 3; ++t) {
    std::vector<std::vector<float>> g;
    for (int i = 0; i < kMembers; ++i) g.push_back(WideGradient(rng));
    struct Pusher {
      PushMeta meta;
      int64_t token = 0;
      std::vector<std::pair<int64_t, int64_t>> blocks;
      size_t next = 0;
      bool waiting = false, woken = false;
    };
    std::vector<Pusher> ps(kMembers);
    for (int i = 0; i < kMembers; ++i) {
      Pusher& p = ps[i];
      p.meta = StreamMeta(i, t, 1 + i);
      for (int64_t b = 0; b < kStreamN;) {
        const int64_t n = std::min<int64_t>(1 + rng.Below(200), kStreamN - b);
        p.blocks.emplace_back(b, n);
        b += n;
      }
      for (size_t k = p.blocks.size(); k > 1; --k)
        std::swap(p.blocks[k - 1], p.blocks[rng.Below(k)]);
      auto token = streamed->BeginStreamed(p.meta);
      ASSERT_TRUE(token.ok()) << token.status();
      p.token = *token;
    }
    for (int left = kMembers; left > 0;) {
      std::vector<int> can;
      for (int i = 0; i < kMembers; ++i) {
        if (ps[i].next < ps[i].blocks.size() &&
            (!ps[i].waiting || ps[i].woken))
          can.push_back(i);
      }
      ASSERT_FALSE(can.empty()) << "every block waits: none can go on";
      Pusher& p = ps[can[rng.Below(can.size())]];
      const auto [b, n] = p.blocks[p.next];
      const int i = static_cast<int>(&p - ps.data());
      p.woken = false;
      auto added = streamed->AddStreamed(p.meta, p.token, b, n,
                                         g[i].data() + b,
                                         [&p] { p.woken = true; });
      ASSERT_TRUE(added.ok()) << added.status();
      p.waiting = !*added;
      if (*added && ++p.next == p.blocks.size()) --left;
      if (!*added) ++waits;
    }
    for (int i = 0; i < kMembers; ++i) {
      bool dup = true;
      TALLY_ASSERT_OK(streamed->FinishStreamed(ps[i].meta, ps[i].token, &dup));
      EXPECT_FALSE(dup);
      EXPECT_EQ(streamed->version(), t);
      EXPECT_TRUE(streamed->Commit(ps[i].meta.worker_id, 1, t, true));
      TALLY_ASSERT_OK(PushAndCommit(*staged, ps[i].meta, g[i].data(), &dup));
    }
    ASSERT_EQ(streamed->version(), t + 1);
    ASSERT_EQ(staged->version(), t + 1);
    if (t == 0) {
      // Rank order and its reverse round differently for these values.
      int differ = 0;
      for (int64_t k = 0; k < kStreamN; ++k) {
        float up = 1 * g[0][k], down = 4 * g[3][k];
        for (int i = 1; i < kMembers; ++i) up += (1 + i) * g[i][k];
        for (int i = kMembers - 2; i >= 0; --i) down += (1 + i) * g[i][k];
        differ += up != down;
      }
      EXPECT_GT(differ, 10);
    }
  }
  EXPECT_GT(waits, 0);  // blocks did wait for lower ranks
  int64_t v1 = 0, v2 = 0;
  const std::vector<float> a = *streamed->Snapshot(&v1);
  const std::vector<float> b = *staged->Snapshot(&v2);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_EQ(streamed->Metrics().sum_resets, 0);
}

// A block of a higher rank waits until the lower rank added that range,
// and is woken then; a push sent again after a broken stream goes on where
// it stopped and counts once.
TEST(StreamedSumTest, HigherRanksWaitAndARetriedPushCountsOnce) {
  FakeClock clock;
  auto shard = StreamShard(&clock, true, 2);
  std::vector<float> ga(kStreamN, 1.0f), gb(kStreamN, 3.0f);
  const PushMeta a = StreamMeta(0, 0, 1), b = StreamMeta(1, 0, 1);
  const int64_t tb = *shard->BeginStreamed(b);
  int woken = 0;
  auto added = shard->AddStreamed(b, tb, 0, 500, gb.data(), [&] { ++woken; });
  ASSERT_TRUE(added.ok());
  EXPECT_FALSE(*added);  // a's [0, 500) is not in yet
  int64_t ta = *shard->BeginStreamed(a);
  EXPECT_TRUE(*shard->AddStreamed(a, ta, 0, 700, ga.data(), [] {}));
  EXPECT_EQ(woken, 1);
  EXPECT_TRUE(*shard->AddStreamed(b, tb, 0, 500, gb.data(), [] {}));
  // a's stream broke; its retry sends the whole push again.
  ta = *shard->BeginStreamed(a);
  EXPECT_TRUE(*shard->AddStreamed(a, ta, 0, kStreamN, ga.data(), [] {}));
  EXPECT_TRUE(
      *shard->AddStreamed(b, tb, 500, kStreamN - 500, gb.data() + 500, [] {}));
  bool dup = false;
  TALLY_ASSERT_OK(shard->FinishStreamed(a, ta, &dup));
  TALLY_ASSERT_OK(shard->FinishStreamed(b, tb, &dup));
  shard->Commit("a", 1, 0, true);
  shard->Commit("b", 1, 0, true);
  ASSERT_EQ(shard->version(), 1);
  // Adam's first step moves each weight by lr against the sign of the mean.
  int64_t v = 0;
  auto w = shard->Snapshot(&v);
  for (float x : *w) ASSERT_FLOAT_EQ(x, 0.5f - 0.01f);
  // An unfinished push is refused at its end, and the rest still welcome.
  const PushMeta a1 = StreamMeta(0, 1, 1);
  ta = *shard->BeginStreamed(a1);
  EXPECT_TRUE(*shard->AddStreamed(a1, ta, 0, 10, ga.data(), [] {}));
  EXPECT_THAT(shard->FinishStreamed(a1, ta, &dup),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("covers 10 of 1000")));
}

// A push refused part-way (a non-finite block) cannot be taken out of the
// sum: the sum goes, the push being read of the other member is told
// PUSH_AGAIN, and once it is pushed again the step closes with it alone.
TEST(StreamedSumTest, APushRefusedPartWayDropsTheSumAndTheOthersPushAgain) {
  FakeClock clock;
  auto shard = StreamShard(&clock, true, 2);
  auto alone = StreamShard(&clock, true, 1);
  std::vector<float> ga(kStreamN, 1.0f), gb(kStreamN, -2.0f);
  const PushMeta a = StreamMeta(0, 0, 1), b = StreamMeta(1, 0, 1);
  const int64_t ta = *shard->BeginStreamed(a);
  int64_t tb = *shard->BeginStreamed(b);
  EXPECT_TRUE(*shard->AddStreamed(a, ta, 0, 500, ga.data(), [] {}));
  EXPECT_TRUE(*shard->AddStreamed(b, tb, 0, 500, gb.data(), [] {}));
  shard->Reject(a);  // a's next block had a NaN
  EXPECT_EQ(shard->Metrics().sum_resets, 1);
  EXPECT_THAT(shard->AddStreamed(b, tb, 500, 500, gb.data() + 500, [] {}),
              HasReason(absl::StatusCode::kAborted, v1::PUSH_AGAIN));
  shard->Commit("a", 1, 0, false);
  tb = *shard->BeginStreamed(b);
  EXPECT_TRUE(*shard->AddStreamed(b, tb, 0, kStreamN, gb.data(), [] {}));
  bool dup = false;
  TALLY_ASSERT_OK(shard->FinishStreamed(b, tb, &dup));
  shard->Commit("b", 1, 0, true);
  ASSERT_EQ(shard->version(), 1);
  // The same as b's push alone.
  TALLY_ASSERT_OK(PushAndCommit(*alone, StreamMeta(0, 0, 1), gb.data(), &dup));
  int64_t v = 0;
  EXPECT_EQ(*shard->Snapshot(&v), *alone->Snapshot(&v));
  EXPECT_EQ(shard->Metrics().rejected_pushes, 1);
}

// A push committed as not contributed (refused on another shard) after it
// was summed here: the sum goes, and the other member, already waiting for
// the step's end, is told PUSH_AGAIN (its commit of the lost push counts for
// nothing) and pushes again.
TEST(StreamedSumTest, ACommitAsNothingAfterTheSumTellsTheOthersToPushAgain) {
  FakeClock clock;
  auto shard = StreamShard(&clock, true, 2);
  std::vector<float> ga(kStreamN, 1.0f), gb(kStreamN, -2.0f);
  bool dup = false;
  TALLY_ASSERT_OK(shard->Accept(StreamMeta(0, 0, 1), ga.data(), &dup));
  TALLY_ASSERT_OK(PushAndCommit(*shard, StreamMeta(1, 0, 1), gb.data(), &dup));
  absl::Status told;
  bool called = false;
  shard->WhenClock("b", 1, 0, absl::InfiniteFuture(), [&](absl::Status s) {
    told = s;
    called = true;
  });
  EXPECT_FALSE(called);
  shard->Commit("a", 1, 0, false);
  ASSERT_TRUE(called);
  EXPECT_THAT(told, HasReason(absl::StatusCode::kAborted, v1::PUSH_AGAIN));
  EXPECT_EQ(ReasonStep(told), 0);
  EXPECT_TRUE(shard->Commit("b", 1, 0, true));  // its push is gone
  EXPECT_EQ(shard->version(), 0);
  shard->WhenClock("b", 1, 0, absl::InfiniteFuture(),
                   [&](absl::Status s) { told = s; });
  EXPECT_THAT(told, HasReason(absl::StatusCode::kAborted, v1::PUSH_AGAIN));
  TALLY_ASSERT_OK(PushAndCommit(*shard, StreamMeta(1, 0, 1), gb.data(), &dup));
  EXPECT_FALSE(dup);
  EXPECT_EQ(shard->version(), 1);
  int64_t v = 0;
  for (float x : *shard->Snapshot(&v)) ASSERT_FLOAT_EQ(x, 0.5f + 0.01f);
}

// A member whose push a drop took out of the sum, but which another shard
// refused anyway: its commit as nothing still counts (it is not told to push
// again), and the step closes with the others.
TEST(StreamedSumTest, ACommitAsNothingCountsAfterTheSumWasDropped) {
  FakeClock clock;
  auto shard = StreamShard(&clock, true, 3);
  std::vector<float> g(kStreamN, 1.0f), gb(kStreamN, -2.0f);
  bool dup = false;
  const PushMeta a = StreamMeta(0, 0, 1), b = StreamMeta(1, 0, 1),
                 c = StreamMeta(2, 0, 1);
  TALLY_ASSERT_OK(shard->Accept(a, g.data(), &dup));
  TALLY_ASSERT_OK(shard->Accept(b, gb.data(), &dup));
  const int64_t tc = *shard->BeginStreamed(c);
  EXPECT_TRUE(*shard->AddStreamed(c, tc, 0, 500, g.data(), [] {}));
  shard->Reject(c);  // c's next block had a NaN: a and b push again
  EXPECT_EQ(shard->Metrics().sum_resets, 1);
  shard->Commit("a", 1, 0, false);  // a was refused on another shard
  absl::Status a_told = absl::UnknownError("not yet");
  shard->WhenClock("a", 1, 0, absl::InfiniteFuture(),
                   [&](absl::Status s) { a_told = s; });
  EXPECT_THAT(a_told, StatusIs(absl::StatusCode::kUnknown, ::testing::_));
  shard->Commit("c", 1, 0, false);
  TALLY_ASSERT_OK(PushAndCommit(*shard, b, gb.data(), &dup));
  EXPECT_EQ(shard->version(), 1);
  TALLY_EXPECT_OK(a_told);
  EXPECT_EQ(shard->Metrics().sum_resets, 1);  // no second drop
  int64_t v = 0;
  for (float x : *shard->Snapshot(&v)) ASSERT_FLOAT_EQ(x, 0.5f + 0.01f);
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// ------------------------------------------------------ replicated ranges --

// A primary whose forward call keeps what it is handed, and its backup.
struct ReplicaPair {
  explicit ReplicaPair(FakeClock* clock, int members) {
    ParameterShard::Options o;
    o.forward = [this](ClosedStep s) { forwarded.push_back(std::move(s)); };
    primary = MakeReplica(clock, o, members);
    ParameterShard::Options b;
    b.backup = true;
    backup = MakeReplica(clock, b, members);
  }
  static std::unique_ptr<ParameterShard> MakeReplica(
      FakeClock* clock, ParameterShard::Options o, int members) {
    OptimizerConfig c;
    c.type = OptimizerType::kAdam;
    c.lr = 0.01;
    auto s = std::make_unique<ParameterShard>(std::vector<float>(kStreamN, 0.5f),
                                              *Optimizer::Create(c, kStreamN),
                                              clock, std::move(o));
    for (int i = 0; i < members; ++i)
      s->AddMember(std::string(1, static_cast<char>('a' + i)), 1);
    return s;
  }
  std::vector<ClosedStep> forwarded;
  std::unique_ptr<ParameterShard> primary, backup;
};

// Every member pushes and commits step t on `shard`, in reverse rank order.
void StepAll(ParameterShard& shard, int members, int64_t t,
             const std::vector<std::vector<float>>& grads) {
  for (int i = members - 1; i >= 0; --i) {
    bool dup = false;
    TALLY_ASSERT_OK(PushAndCommit(shard, StreamMeta(i, t, 1 + i), grads[i].data(),
                                  &dup));
  }
}

// The primary makes each version at once but publishes it only once its
// backup holds it: a pull of it waits, and meanwhile pulls are given the
// version before, whole. The backup, given the primary's closed steps,
// holds the same bits as the primary and as a range never replicated.
TEST(ReplicatedRangeTest, PullsWaitForTheBackupWhichHoldsTheSameBits) {
  FakeClock clock;
  constexpr int kMembers = 3;
  ReplicaPair pair(&clock, kMembers);
  auto plain = StreamShard(&clock, true, kMembers);
  Rng rng(5);
  for (int64_t t = 0; t < 3; ++t) {
    std::vector<std::vector<float>> grads;
    for (int i = 0; i < kMembers; ++i) grads.push_back(WideGradient(rng));
    int64_t before_v = -1;
    const std::vector<float> before = *pair.primary->Snapshot(&before_v);
    bool released = false;
    pair.primary->WhenVersion(t + 1, absl::InfiniteFuture(),
                              [&](absl::Status s) { released = s.ok(); });
    StepAll(*pair.primary, kMembers, t, grads);
    StepAll(*plain, kMembers, t, grads);
    EXPECT_EQ(pair.primary->version(), t + 1);
    EXPECT_EQ(pair.primary->copies().published_version, t);
    EXPECT_FALSE(released);
    int64_t v = -1;
    EXPECT_EQ(*pair.primary->Snapshot(&v), before);  // the version before
    EXPECT_EQ(v, t);
    ASSERT_EQ(pair.forwarded.size(), static_cast<size_t>(t + 1));
    EXPECT_EQ(pair.forwarded.back().step, t);
    TALLY_ASSERT_OK(pair.backup->ApplyClosed(pair.forwarded.back()));
    pair.primary->Acknowledge(t + 1);
    EXPECT_TRUE(released);
    EXPECT_EQ(pair.primary->copies().published_version, t + 1);
  }
  int64_t vp = 0, vb = 0, vq = 0;
  const std::vector<float> p = *pair.primary->Snapshot(&vp);
  EXPECT_EQ(p, *pair.backup->Snapshot(&vb));
  EXPECT_EQ(p, *plain->Snapshot(&vq));
  EXPECT_EQ(vp, 3);
  EXPECT_EQ(vb, 3);
  EXPECT_EQ(0, std::memcmp(pair.primary->Save().optimizer.slots[0].data(),
                           pair.backup->Save().optimizer.slots[0].data(),
                           kStreamN * sizeof(float)));
  EXPECT_EQ(pair.backup->Metrics().samples, plain->Metrics().samples);
}

// A backup takes no member's push (a worker's map is stale: retry), takes
// a closed step sent twice once, and refuses a step past its version (it
// lacks the ones between) and a mean of another length; a primary takes
// no closed step.
TEST(ReplicatedRangeTest, ABackupTakesClosedStepsOnlyInOrder) {
  FakeClock clock;
  ReplicaPair pair(&clock, 1);
  bool dup = false;
  EXPECT_THAT(pair.backup->CheckPush(StreamMeta(0, 0, 1), &dup),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("backup")));
  Rng rng(2);
  StepAll(*pair.primary, 1, 0, {WideGradient(rng)});
  StepAll(*pair.primary, 1, 1, {WideGradient(rng)});
  ASSERT_EQ(pair.forwarded.size(), 2u);
  EXPECT_THAT(pair.backup->ApplyClosed(pair.forwarded[1]),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::STEP_NOT_OPEN));
  ClosedStep odd_buffers = pair.forwarded[0];
  odd_buffers.buffers = std::make_shared<const std::string>("xy");
  EXPECT_THAT(pair.backup->ApplyClosed(odd_buffers),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("buffer region")));
  ClosedStep short_mean = pair.forwarded[0];
  short_mean.mean = std::make_shared<const std::vector<float>>(3, 1.0f);
  EXPECT_THAT(pair.backup->ApplyClosed(short_mean),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mean")));
  TALLY_ASSERT_OK(pair.backup->ApplyClosed(pair.forwarded[0]));
  int64_t v = 0;
  const std::vector<float> once = *pair.backup->Snapshot(&v);
  TALLY_ASSERT_OK(pair.backup->ApplyClosed(pair.forwarded[0]));  // again
  EXPECT_EQ(*pair.backup->Snapshot(&v), once);
  EXPECT_EQ(v, 1);
  EXPECT_THAT(pair.primary->ApplyClosed(pair.forwarded[0]),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no backup")));
}

// The primary dies after making step 2 and before its backup held it. The
// promoted backup takes the members' pushes of step 2 again and makes the
// same version 3 the primary made; a primary whose backup is gone
// publishes what it made at once.
TEST(ReplicatedRangeTest, APromotedBackupGoesOnFromWhereItWas) {
  FakeClock clock;
  constexpr int kMembers = 2;
  ReplicaPair pair(&clock, kMembers);
  Rng rng(9);
  std::vector<std::vector<float>> grads;
  for (int64_t t = 0; t < 3; ++t) {
    grads.clear();
    for (int i = 0; i < kMembers; ++i) grads.push_back(WideGradient(rng));
    StepAll(*pair.primary, kMembers, t, grads);
    if (t < 2) {
      TALLY_ASSERT_OK(pair.backup->ApplyClosed(pair.forwarded.back()));
      pair.primary->Acknowledge(t + 1);
    }
  }
  EXPECT_EQ(pair.primary->copies().published_version, 2);
  pair.backup->Promote();
  EXPECT_FALSE(pair.backup->copies().backup);
  StepAll(*pair.backup, kMembers, 2, grads);  // sent again, same gradients
  EXPECT_EQ(pair.backup->copies().published_version, 3);
  pair.primary->StopForwarding();
  EXPECT_EQ(pair.primary->copies().published_version, 3);
  int64_t v1 = 0, v2 = 0;
  EXPECT_EQ(*pair.primary->Snapshot(&v1), *pair.backup->Snapshot(&v2));
  EXPECT_EQ(v1, v2);
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A primary whose backup was lost publishes at once; given a new backup
// seeded at its version, it waits for that one from then on, and not when
// it moved on meanwhile.
TEST(ReplicatedRangeTest, ANewBackupIsForwardedToFromItsSeedVersion) {
  FakeClock clock;
  ReplicaPair pair(&clock, 1);
  Rng rng(4);
  pair.primary->StopForwarding();
  StepAll(*pair.primary, 1, 0, {WideGradient(rng)});
  EXPECT_EQ(pair.primary->copies().published_version, 1);
  EXPECT_TRUE(pair.forwarded.empty());
  std::vector<ClosedStep> later;
  auto keep = [&later](ClosedStep s) { later.push_back(std::move(s)); };
  EXPECT_THAT(pair.primary->StartForwarding(0, keep),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("seeded again")));
  TALLY_ASSERT_OK(pair.primary->StartForwarding(1, keep));
  StepAll(*pair.primary, 1, 1, {WideGradient(rng)});
  EXPECT_EQ(pair.primary->copies().published_version, 1);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].step, 1);
  pair.primary->Acknowledge(2);
  EXPECT_EQ(pair.primary->copies().published_version, 2);
}

// A new backup made with no hold: the primary's state as it is, then every
// version it makes goes to the backup and is published at once while the
// backup catches up; once the backup acknowledges the primary's version,
// it is in step and the next version waits for it. The backup ends with
// the primary's bits.
TEST(ReplicatedRangeTest, ANewBackupCatchesUpWhileThePrimaryGoesOn) {
  FakeClock clock;
  ReplicaPair pair(&clock, 1);
  Rng rng(5);
  pair.primary->StopForwarding();
  StepAll(*pair.primary, 1, 0, {WideGradient(rng)});
  std::vector<ClosedStep> sent;
  absl::StatusOr<ShardState> state = pair.primary->SaveForBackup(
      [&sent](ClosedStep s) { sent.push_back(std::move(s)); });
  TALLY_ASSERT_OK(state.status());
  EXPECT_EQ(state->metrics.version, 1);
  EXPECT_THAT(pair.backup->SaveForBackup([](ClosedStep) {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("backup copy")));
  // Two versions made while the backup is installed: published at once.
  StepAll(*pair.primary, 1, 1, {WideGradient(rng)});
  StepAll(*pair.primary, 1, 2, {WideGradient(rng)});
  EXPECT_EQ(pair.primary->copies().published_version, 3);
  EXPECT_FALSE(pair.primary->copies().backup_in_step);
  ASSERT_EQ(sent.size(), 2u);
  ParameterShard::Options b;
  b.backup = true;
  OptimizerConfig c;
  c.type = OptimizerType::kAdam;
  c.lr = 0.01;
  absl::StatusOr<std::unique_ptr<ParameterShard>> backup =
      ParameterShard::Restore(*state, *Optimizer::Create(c, kStreamN), &clock,
                              b);
  TALLY_ASSERT_OK(backup.status());
  TALLY_ASSERT_OK((*backup)->ApplyClosed(sent[0]));
  pair.primary->Acknowledge(2);  // behind: still catching up
  EXPECT_FALSE(pair.primary->copies().backup_in_step);
  TALLY_ASSERT_OK((*backup)->ApplyClosed(sent[1]));
  pair.primary->Acknowledge(3, /*sender=*/7);  // a sender replaced since
  EXPECT_FALSE(pair.primary->copies().backup_in_step);
  pair.primary->Acknowledge(3);
  EXPECT_TRUE(pair.primary->copies().backup_in_step);
  // In step: the next version waits for the backup.
  StepAll(*pair.primary, 1, 3, {WideGradient(rng)});
  EXPECT_EQ(pair.primary->version(), 4);
  EXPECT_EQ(pair.primary->copies().published_version, 3);
  ASSERT_EQ(sent.size(), 3u);
  TALLY_ASSERT_OK((*backup)->ApplyClosed(sent[2]));
  pair.primary->Acknowledge(4);
  EXPECT_EQ(pair.primary->copies().published_version, 4);
  int64_t v = 0, bv = 0;
  auto w = pair.primary->Snapshot(&v);
  auto bw = (*backup)->Snapshot(&bv);
  EXPECT_EQ(bv, 4);
  EXPECT_EQ(*w, *bw);
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A member's push of the open step reached the lost primary alone (it
// committed it there with the push) and it waits for the next version on
// the promoted backup: it is told to push again, and the step closes with
// its push as the primary's would have.
TEST(ReplicatedRangeTest, AMemberWhosePushWentOnlyToTheLostPrimaryPushesAgain) {
  FakeClock clock;
  ReplicaPair pair(&clock, 2);
  Rng rng(6);
  std::vector<std::vector<float>> grads = {WideGradient(rng), WideGradient(rng)};
  pair.backup->Promote();
  bool dup = false;
  // Member a's push of step 0 came here again; b's did not.
  TALLY_ASSERT_OK(PushAndCommit(*pair.backup, StreamMeta(0, 0, 1),
                                grads[0].data(), &dup));
  // b's commit comes without its push: not taken (the step would close
  // without b's gradient).
  pair.backup->Commit("b", 1, 0, /*contributed=*/true);
  EXPECT_EQ(pair.backup->version(), 0);
  absl::Status told;
  pair.backup->WhenVersion(1, absl::InfiniteFuture(),
                           [&told](absl::Status s) { told = s; }, "b");
  EXPECT_THAT(told, HasReason(absl::StatusCode::kAborted, v1::PUSH_AGAIN));
  TALLY_ASSERT_OK(PushAndCommit(*pair.backup, StreamMeta(1, 0, 2),
                                grads[1].data(), &dup));
  EXPECT_EQ(pair.backup->version(), 1);
  StepAll(*pair.primary, 2, 0, grads);
  pair.primary->Acknowledge(1);
  int64_t v = 0;
  EXPECT_EQ(*pair.backup->Snapshot(&v), *pair.primary->Snapshot(&v));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A Python model's buffer region goes with the closed step: the backup
// holds the region its primary took, and pulls of the primary get it
// only with the version it belongs to.
TEST(ReplicatedRangeTest, TheBufferRegionGoesToTheBackupWithItsVersion) {
  FakeClock clock;
  std::vector<ClosedStep> forwarded;
  ParameterShard::Options p;
  p.buffer_bytes = 4;
  p.forward = [&forwarded](ClosedStep s) { forwarded.push_back(std::move(s)); };
  auto primary = ReplicaPair::MakeReplica(&clock, p, 1);
  ParameterShard::Options b;
  b.buffer_bytes = 4;
  b.backup = true;
  auto backup = ReplicaPair::MakeReplica(&clock, b, 1);
  Rng rng(8);
  std::vector<float> g = WideGradient(rng);
  PushMeta meta = StreamMeta(0, 0, 1);
  meta.buffers = std::make_shared<const std::string>("abcd");
  bool dup = false;
  TALLY_ASSERT_OK(PushAndCommit(*primary, meta, g.data(), &dup));
  int64_t v = 0;
  std::shared_ptr<const std::string> region;
  primary->Snapshot(&v, nullptr, &region);
  EXPECT_EQ(v, 0);
  EXPECT_EQ(region, nullptr);  // not the version before's
  ASSERT_EQ(forwarded.size(), 1u);
  TALLY_ASSERT_OK(backup->ApplyClosed(forwarded[0]));
  primary->Acknowledge(1);
  primary->Snapshot(&v, nullptr, &region);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(*region, "abcd");
  backup->Snapshot(&v, nullptr, &region);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(*region, "abcd");
  EXPECT_EQ(v, 1);
}

}  // namespace
}  // namespace tally
