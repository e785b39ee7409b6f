// The consistency rules of a parameter shard (training.consistency): a
// property test over random push/pull interleavings with a fake clock, and
// one test each for max_staleness, backup workers and staleness scaling.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/data/shard.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;

constexpr int64_t kParams = 8;

std::unique_ptr<ParameterShard> MakeShard(const ConsistencySpec& c,
                                          const Clock* clock,
                                          int64_t total_steps) {
  OptimizerConfig oc;
  oc.lr = 0.01;
  oc.momentum = 0.9;  // state that remembers the order of steps
  ParameterShard::Options o;
  o.consistency = c;
  auto shard = std::make_unique<ParameterShard>(
      std::vector<float>(kParams, 1.0f), *Optimizer::Create(oc, kParams), clock,
      o);
  EXPECT_TRUE(shard->SetSchedule(total_steps, 1000).ok());
  return shard;
}

ConsistencySpec Mode(ConsistencyMode mode, int64_t staleness = 0) {
  ConsistencySpec c;
  c.mode = mode;
  c.staleness = staleness;
  return c;
}

// What a run did: every pull served (worker, clock, version), in order,
// and the final weights.
struct Trace {
  std::vector<std::tuple<int, int64_t, int64_t>> served;
  std::vector<float> weights;
  int64_t version = 0;
  int64_t pushes = 0;
  int64_t violations = 0;  // pulls served against the rule
  int64_t async_waits = 0;  // async pulls not served at once
};

// Workers driven through pull -> push -> commit (with the next pull) in an
// order drawn from `seed`; each action is one of a random worker's. A
// worker's clock is the step it computes next; the rule is checked from
// the workers' own bookkeeping whenever a pull is served.
Trace Simulate(const ConsistencySpec& c, uint64_t seed, int workers,
          int64_t total_steps) {
  FakeClock clock;
  auto shard = MakeShard(c, &clock, total_steps);
  std::vector<std::string> ids;
  for (int w = 0; w < workers; ++w) {
    ids.push_back(absl::StrCat("w", w));
    shard->AddMember(ids.back(), 1);
  }
  enum Phase { kIdle, kWaiting, kServed, kPushed };
  struct Worker {
    Phase phase = kIdle;
    int64_t clock = 0;      // the step it computes next
    int64_t committed = 0;  // steps committed (its clock as the shard sees)
    int64_t base = 0;       // the version its pull got
    bool has_commit = false;
    int64_t commit_step = 0;
  };
  std::vector<Worker> ws(workers);
  Trace trace;
  const int64_t s = c.mode == ConsistencyMode::kSsp ? c.staleness : 0;
  std::mt19937_64 rng(seed);
  auto on_served = [&](int w) {
    return [&, w](absl::Status st) {
      ASSERT_TRUE(st.ok()) << st;
      Worker& me = ws[w];
      int64_t v = 0;
      shard->Snapshot(&v);
      int64_t slowest = INT64_MAX;
      for (const Worker& o : ws) slowest = std::min(slowest, o.committed);
      if (c.mode != ConsistencyMode::kAsync && v < total_steps) {
        // No pull at clock c while the slowest worker is below c - s.
        if (slowest < me.clock - s) ++trace.violations;
        if (v < me.clock - s) ++trace.violations;
      }
      trace.served.emplace_back(w, me.clock, v);
      me.base = v;
      me.phase = kServed;
    };
  };
  int64_t actions = 0;
  while (shard->version() < total_steps && actions < 50 * total_steps) {
    ++actions;
    const int w = static_cast<int>(rng() % workers);
    Worker& me = ws[w];
    switch (me.phase) {
      case kIdle: {
        // The pull carries the commit of its last push.
        if (me.has_commit) {
          me.committed = me.commit_step + 1;
          shard->Commit(ids[w], 1, me.commit_step, true);
          me.has_commit = false;
        }
        me.phase = kWaiting;
        shard->WhenClock(ids[w], me.clock, 0, absl::InfiniteFuture(),
                         on_served(w));
        if (c.mode == ConsistencyMode::kAsync && me.phase == kWaiting)
          ++trace.async_waits;
        break;
      }
      case kWaiting:
        break;  // the shard releases it
      case kServed: {
        int64_t v = me.base;
        if (v >= total_steps) break;
        const int64_t step = c.mode == ConsistencyMode::kAsync
                                 ? me.clock
                                 : std::max(me.clock, v);
        PushMeta m;
        m.worker_id = ids[w];
        m.incarnation = 1;
        m.step = step;
        m.base_version = v;
        m.samples = 1 + static_cast<int64_t>(rng() % 4);
        std::vector<float> g(kParams);
        for (float& x : g) x = static_cast<float>(rng() % 1000) / 1000.0f;
        bool dup = false;
        absl::Status st = shard->Accept(m, g.data(), &dup);
        EXPECT_TRUE(st.ok()) << st;
        EXPECT_FALSE(dup);
        ++trace.pushes;
        me.has_commit = true;
        me.commit_step = step;
        me.clock = step + 1;
        me.phase = kPushed;
        break;
      }
      case kPushed:
        me.phase = kIdle;
        break;
    }
  }
  int64_t v = 0;
  trace.weights = *shard->Snapshot(&v);
  trace.version = v;
  return trace;
}

TEST(ConsistencyPropertyTest, NoPullIsServedAheadOfTheSlowestPlusStaleness) {
  for (int64_t s : {0, 1, 2, 4}) {
    for (uint64_t seed : {1, 2, 3}) {
      // 10,000 steps of 4 workers each: 40,000 pushes and their pulls.
      const Trace t = Simulate(Mode(ConsistencyMode::kSsp, s), seed, 4, 10000);
      SCOPED_TRACE(absl::StrCat("ssp(", s, ") seed ", seed));
      EXPECT_EQ(t.violations, 0);
      EXPECT_EQ(t.version, 10000);  // every step closed
      EXPECT_GE(t.pushes, 40000);
    }
  }
}

TEST(ConsistencyPropertyTest, SspLetsFastWorkersRunAheadButNoFurther) {
  // The rule is not vacuous: with staleness 3 some pull is served while
  // a worker is behind, and none further than 3.
  const Trace t = Simulate(Mode(ConsistencyMode::kSsp, 3), 7, 4, 2000);
  int64_t ahead = 0;
  for (const auto& [w, clock, v] : t.served) ahead = std::max(ahead, clock - v);
  EXPECT_EQ(ahead, 3);
  EXPECT_EQ(t.violations, 0);
}

TEST(ConsistencyPropertyTest, AsyncNeverWaits) {
  for (uint64_t seed : {1, 2, 3}) {
    const Trace t = Simulate(Mode(ConsistencyMode::kAsync), seed, 4, 10000);
    EXPECT_EQ(t.async_waits, 0);
    EXPECT_EQ(t.version, 10000);  // one version per committed push
    EXPECT_GE(t.pushes, 10000);   // and a few not committed at the end
    EXPECT_LE(t.pushes, 10000 + 4);
  }
}

// ssp(0) and bsp take the same path through the shard today; this keeps
// them equal (waits and weights, bit for bit) if that ever changes.
TEST(ConsistencyPropertyTest, BspEqualsSspWithStalenessZero) {
  for (uint64_t seed : {11, 12, 13}) {
    const Trace bsp = Simulate(Mode(ConsistencyMode::kBsp), seed, 3, 4000);
    const Trace ssp0 = Simulate(Mode(ConsistencyMode::kSsp, 0), seed, 3, 4000);
    EXPECT_EQ(bsp.violations, 0);
    EXPECT_EQ(bsp.served, ssp0.served);
    EXPECT_EQ(bsp.weights, ssp0.weights);  // bit for bit
    EXPECT_EQ(bsp.version, 4000);
    // And bsp serves exactly the worker's step.
    for (const auto& [w, clock, v] : bsp.served) {
      if (v < 4000) {
        EXPECT_EQ(v, clock);
      }
    }
  }
}

PushMeta Meta(const std::string& w, int64_t step, int64_t base,
              int64_t samples = 1) {
  PushMeta m;
  m.worker_id = w;
  m.incarnation = 1;
  m.step = step;
  m.base_version = base;
  m.samples = samples;
  return m;
}

TEST(ConsistencyTest, MaxStalenessRefusesOldGradientsWithTheirCodeAndCounts) {
  FakeClock clock;
  ConsistencySpec c = Mode(ConsistencyMode::kAsync);
  c.max_staleness = 1;
  auto shard = MakeShard(c, &clock, 100);
  shard->AddMember("a", 1);
  shard->AddMember("b", 1);
  std::vector<float> g(kParams, 0.5f);
  bool dup = false;
  // b pushes twice from fresh weights: versions 1 and 2.
  for (int64_t step = 0; step < 2; ++step) {
    TALLY_ASSERT_OK(shard->Accept(Meta("b", step, step), g.data(), &dup));
    shard->Commit("b", 1, step, true);
  }
  ASSERT_EQ(shard->version(), 2);
  const std::vector<float> before = *shard->Snapshot(nullptr);
  // a computed from version 0: staleness 2 > 1.
  absl::Status st = shard->Accept(Meta("a", 0, 0), g.data(), &dup);
  EXPECT_THAT(st, HasReason(absl::StatusCode::kAborted, v1::STALE_GRADIENT));
  EXPECT_EQ(shard->Metrics().stale_pushes, 1);
  // The worker commits it as nothing and goes on: a version, no update.
  shard->Commit("a", 1, 0, false);
  EXPECT_EQ(shard->version(), 3);
  EXPECT_EQ(*shard->Snapshot(nullptr), before);
  // From version 3 (staleness 0), its next push is applied.
  TALLY_ASSERT_OK(shard->Accept(Meta("a", 1, 3), g.data(), &dup));
  shard->Commit("a", 1, 1, true);
  EXPECT_EQ(shard->version(), 4);
  EXPECT_NE(*shard->Snapshot(nullptr), before);
  EXPECT_EQ(shard->Metrics().stale_pushes, 1);
}

// Two shards of an async job: a worker's last commit reached one shard
// only, then it left (the coordinator's decision: leave at its highest
// commit + 1, with whether that commit said "nothing"). Both shards end on
// the same version, with the same pushes applied. The worker started at
// clock 5 (a runner that joined a running job), and the lost commit was its
// first on the shard that missed it.
TEST(ConsistencyTest, AsyncLeaverWhoseLastCommitReachedOneShard) {
  for (bool refused : {false, true}) {
    SCOPED_TRACE(refused ? "last commit: nothing" : "last commit: counted");
    FakeClock clock;
    auto a = MakeShard(Mode(ConsistencyMode::kAsync), &clock, 100);
    auto b = MakeShard(Mode(ConsistencyMode::kAsync), &clock, 100);
    for (ParameterShard* s : {a.get(), b.get()}) {
      s->AddMember("w", 1);
      s->AddMember("x", 1);
    }
    std::vector<float> g(kParams, 1.0f);
    bool dup = false;
    for (ParameterShard* s : {a.get(), b.get()}) {
      TALLY_ASSERT_OK(s->Accept(Meta("x", 0, 0), g.data(), &dup));
      EXPECT_TRUE(s->Commit("x", 1, 0, true));
      TALLY_ASSERT_OK(s->Accept(Meta("w", 5, 1), g.data(), &dup));
    }
    EXPECT_TRUE(a->Commit("w", 1, 5, !refused));  // the pull to b never came
    ASSERT_EQ(a->version(), 2);
    ASSERT_EQ(b->version(), 1);
    const HoldReport ra = a->Hold(7, absl::InfiniteFuture());
    const HoldReport rb = b->Hold(7, absl::InfiniteFuture());
    MemberProgress pa, pb;
    for (const MemberProgress& p : ra.members) if (p.worker_id == "w") pa = p;
    for (const MemberProgress& p : rb.members) if (p.worker_id == "w") pb = p;
    ASSERT_EQ(pa.committed_step, 5);
    ASSERT_EQ(pb.committed_step, -1);
    EXPECT_EQ(pa.last_refused, refused);
    // While held, an async commit is not taken (the pull is answered
    // UNAVAILABLE and comes again).
    EXPECT_FALSE(b->Commit("x", 1, 1, true));
    MemberSpec leaver;
    leaver.worker_id = "w";
    leaver.incarnation = 1;
    leaver.leave_step = pa.committed_step + 1;
    leaver.last_refused = pa.last_refused;
    MemberSpec stays;
    stays.worker_id = "x";
    stays.incarnation = 1;
    stays.rank = 1;
    for (ParameterShard* s : {a.get(), b.get()}) {
      TALLY_ASSERT_OK(s->SetMembers({leaver, stays}, 7));
    }
    EXPECT_EQ(a->version(), 2);
    EXPECT_EQ(b->version(), 2);
    EXPECT_EQ(*a->Snapshot(nullptr), *b->Snapshot(nullptr));
    EXPECT_FALSE(a->CheckMember("w", 1).ok());
    EXPECT_FALSE(b->CheckMember("w", 1).ok());
    // Sent again (a round that failed half-way), or twice in one list, it
    // changes nothing.
    TALLY_ASSERT_OK(b->SetMembers({leaver, leaver, stays}));
    EXPECT_EQ(b->version(), 2);
    // x goes on, alike on both.
    for (ParameterShard* s : {a.get(), b.get()}) {
      TALLY_ASSERT_OK(s->Accept(Meta("x", 1, 2), g.data(), &dup));
      EXPECT_TRUE(s->Commit("x", 1, 1, true));
      EXPECT_EQ(s->version(), 3);
    }
    EXPECT_EQ(*a->Snapshot(nullptr), *b->Snapshot(nullptr));
    // Every staging buffer came back: the pool's limit (2 per member + 4,
    // one member now) is all there is to take.
    std::vector<std::unique_ptr<std::vector<float>>> taken;
    for (int i = 0; i < 6; ++i) {
      auto buf = b->AcquireStaging();
      TALLY_ASSERT_OK(buf.status());
      taken.push_back(*std::move(buf));
    }
    EXPECT_THAT(b->AcquireStaging().status(),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         ::testing::HasSubstr("in flight")));
    for (auto& buf : taken) b->ReleaseStaging(std::move(buf));
  }
}

TEST(ConsistencyTest, BackupWorkersCloseWithoutTheLastAndCountItLate) {
  FakeClock clock;
  ConsistencySpec c = Mode(ConsistencyMode::kBsp);
  c.backup_workers = 1;
  auto shard = MakeShard(c, &clock, 100);
  for (const char* w : {"a", "b", "c"}) shard->AddMember(w, 1);
  std::vector<float> g(kParams, 1.0f);
  bool dup = false;
  TALLY_ASSERT_OK(shard->Accept(Meta("a", 0, 0), g.data(), &dup));
  shard->Commit("a", 1, 0, true);
  EXPECT_EQ(shard->version(), 0);  // one of three: not yet
  // c pushed but has not committed when b's commit closes the step.
  TALLY_ASSERT_OK(shard->Accept(Meta("c", 0, 0), g.data(), &dup));
  TALLY_ASSERT_OK(shard->Accept(Meta("b", 0, 0), g.data(), &dup));
  shard->Commit("b", 1, 0, true);
  EXPECT_EQ(shard->version(), 1);
  EXPECT_EQ(shard->Metrics().late_pushes, 1);  // c's staged push
  EXPECT_EQ(shard->Metrics().samples, 2);      // a and b only
  shard->Commit("c", 1, 0, true);              // too late: changes nothing
  EXPECT_EQ(shard->version(), 1);
  // A retry of c's push is acknowledged (it was received), not re-counted.
  TALLY_ASSERT_OK(shard->Accept(Meta("c", 0, 0), g.data(), &dup));
  EXPECT_TRUE(dup);
  EXPECT_EQ(shard->Metrics().late_pushes, 1);
  // c goes on with the next step, and is counted in it.
  TALLY_ASSERT_OK(shard->Accept(Meta("c", 1, 1), g.data(), &dup));
  shard->Commit("c", 1, 1, true);
  TALLY_ASSERT_OK(shard->Accept(Meta("a", 1, 1), g.data(), &dup));
  shard->Commit("a", 1, 1, true);
  EXPECT_EQ(shard->version(), 2);
  EXPECT_EQ(shard->Metrics().samples, 4);
}

TEST(ConsistencyTest, LatePushOfAClosedStepIsStepClosedAndCounted) {
  FakeClock clock;
  ConsistencySpec c = Mode(ConsistencyMode::kBsp);
  c.backup_workers = 1;
  auto shard = MakeShard(c, &clock, 100);
  shard->AddMember("a", 1);
  shard->AddMember("b", 1);
  std::vector<float> g(kParams, 1.0f);
  bool dup = false;
  TALLY_ASSERT_OK(shard->Accept(Meta("a", 0, 0), g.data(), &dup));
  shard->Commit("a", 1, 0, true);
  ASSERT_EQ(shard->version(), 1);  // all but one
  absl::Status st = shard->Accept(Meta("b", 0, 0), g.data(), &dup);
  EXPECT_THAT(st, HasReason(absl::StatusCode::kAborted, v1::STEP_CLOSED));
  EXPECT_EQ(shard->Metrics().late_pushes, 1);
}

TEST(ConsistencyTest, StalenessScalingWeighsAGradientByOneOverTau) {
  FakeClock clock;
  ConsistencySpec c = Mode(ConsistencyMode::kSsp, 2);
  c.lr_scaling = LrScaling::kStaleness;
  OptimizerConfig oc;
  oc.lr = 1.0;  // plain SGD: weights -= mean
  ParameterShard::Options o;
  o.consistency = c;
  ParameterShard shard(std::vector<float>{10}, *Optimizer::Create(oc, 1),
                       &clock, o);
  ASSERT_TRUE(shard.SetSchedule(100, 100).ok());
  shard.AddMember("a", 1);
  bool dup = false;
  const float g = 4.0f;
  auto push = [&](int64_t step, int64_t base) {
    TALLY_ASSERT_OK(shard.Accept(Meta("a", step, base), &g, &dup));
    shard.Commit("a", 1, step, true);
  };
  push(0, 0);  // tau 0: weight 1
  EXPECT_EQ((*shard.Snapshot(nullptr))[0], 6.0f);
  push(1, 0);  // tau 1: weight 1 (1 / max(1, tau))
  EXPECT_EQ((*shard.Snapshot(nullptr))[0], 2.0f);
  push(2, 0);  // tau 2: weight 1/2
  EXPECT_EQ((*shard.Snapshot(nullptr))[0], 0.0f);
}

TEST(ConsistencyTest, SspRefusesStepsBeyondTheWindowAndBasesOutsideIt) {
  FakeClock clock;
  auto shard = MakeShard(Mode(ConsistencyMode::kSsp, 2), &clock, 100);
  shard->AddMember("a", 1);
  shard->AddMember("b", 1);
  std::vector<float> g(kParams, 1.0f);
  bool dup = false;
  for (int64_t step = 0; step < 3; ++step) {
    TALLY_ASSERT_OK(shard->Accept(Meta("a", step, 0), g.data(), &dup));
    shard->Commit("a", 1, step, true);
  }
  EXPECT_EQ(shard->version(), 0);  // b has pushed nothing
  absl::Status st = shard->Accept(Meta("a", 3, 0), g.data(), &dup);
  EXPECT_THAT(st, HasReason(absl::StatusCode::kAborted, v1::STEP_NOT_OPEN));
  st = shard->Accept(Meta("b", 0, 1), g.data(), &dup);  // base from the future
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument,
                           ::testing::HasSubstr("ssp(2)")));
  // b catches up: steps 0..2 close in order.
  for (int64_t step = 0; step < 3; ++step) {
    TALLY_ASSERT_OK(shard->Accept(Meta("b", step, step), g.data(), &dup));
    shard->Commit("b", 1, step, true);
  }
  EXPECT_EQ(shard->version(), 3);
  EXPECT_EQ(shard->Metrics().samples, 6);
}

}  // namespace
}  // namespace tally
