// The data-parallel engine: N replicas give what one device gives.
#include "worker/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/optim/optimizer.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/off_host_device.h"
#include "tests/test_util.h"
#include "worker/thread_group.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<LayerConfig> SmallCnn(bool dropout) {
  std::vector<LayerConfig> l(dropout ? 6 : 5);
  l[0].type = LayerType::kConv2d;
  l[0].in_channels = 1;
  l[0].out_channels = 3;
  l[0].kernel_size = 3;
  l[1].type = LayerType::kReLU;
  l[2].type = LayerType::kMaxPool2d;
  l[2].kernel_size = 2;
  l[3].type = LayerType::kFlatten;
  size_t i = 4;
  if (dropout) {
    l[4].type = LayerType::kDropout;
    l[4].p = 0.25;
    i = 5;
  }
  l[i].type = LayerType::kLinear;
  l[i].in_features = 27;
  l[i].out_features = 4;
  return l;
}

EngineOptions Cpus(int n) {
  EngineOptions o;
  o.devices.clear();
  for (int i = 0; i < n; ++i) o.devices.push_back({DeviceType::kCpu, i});
  return o;
}

struct Data {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Data RandomBatch(int n, uint64_t seed) {
  Rng rng(seed);
  Data d;
  d.x.resize(n * 64);
  for (float& v : d.x) v = rng.Normal();
  for (int i = 0; i < n; ++i) d.y.push_back(static_cast<int32_t>(rng.Below(4)));
  return d;
}

std::unique_ptr<Engine> MakeEngine(int replicas, bool dropout,
                                   const EngineOptions& options = {}) {
  EngineOptions o = Cpus(replicas);
  o.fault_hook = options.fault_hook;
  o.step_timeout = options.step_timeout;
  o.open_device = options.open_device;
  o.force_peer_reduction = options.force_peer_reduction;
  auto e = Engine::Create(SmallCnn(dropout), {1, 8, 8}, o);
  EXPECT_TRUE(e.ok()) << e.status();
  auto layout = ComputeLayout(SmallCnn(dropout), {1, 8, 8});
  std::vector<float> init = InitParams(SmallCnn(dropout), *layout, 3);
  std::copy(init.begin(), init.end(), (*e)->params());
  return *std::move(e);
}

// Runs one step on another thread; fails the test if it hangs.
absl::StatusOr<StepStats> StepOrHang(Engine* e, const BatchView& view,
                                     uint64_t seed) {
  auto result =
      std::async(std::launch::async, [&] { return e->Step(view, seed); });
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "the step hung";
    std::abort();  // the engine's threads cannot be joined any more
  }
  return result.get();
}

void ExpectSameGradients(Engine& want, Engine& got) {
  ASSERT_EQ(want.num_params(), got.num_params());
  for (int64_t i = 0; i < want.num_params(); ++i) {
    ASSERT_NEAR(want.grads()[i], got.grads()[i],
                1e-6f + 1e-5f * std::fabs(want.grads()[i]))
        << "param " << i;
  }
}

TEST(SplitTest, SizesDifferByAtMostOneAndNeverEmpty) {
  EXPECT_EQ(Engine::Split(10, 3), (std::vector<int>{4, 3, 3}));
  EXPECT_EQ(Engine::Split(2, 4), (std::vector<int>{1, 1}));
  EXPECT_EQ(Engine::Split(64, 2), (std::vector<int>{32, 32}));
  EXPECT_EQ(Engine::Split(1, 1), (std::vector<int>{1}));
  for (int b = 1; b < 40; ++b) {
    for (int r = 1; r < 6; ++r) {
      auto s = Engine::Split(b, r);
      int sum = 0;
      for (int v : s) {
        ASSERT_GT(v, 0);
        ASSERT_LE(s.front() - v, 1);
        sum += v;
      }
      ASSERT_EQ(sum, b);
    }
  }
}

class EquivalenceTest : public ::testing::TestWithParam<std::tuple<int, int>> {
};

TEST_P(EquivalenceTest, NReplicasGiveTheGradientOfOneDevice) {
  const auto [replicas, batch] = GetParam();
  auto one = MakeEngine(1, /*dropout=*/true);
  auto many = MakeEngine(replicas, /*dropout=*/true);
  Data d = RandomBatch(batch, 17);
  BatchView view{d.x.data(), d.y.data(), batch};
  auto a = one->Step(view, 5);
  auto b = many->Step(view, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NEAR(a->loss_sum, b->loss_sum, 1e-4 * (1 + std::fabs(a->loss_sum)));
  EXPECT_EQ(a->correct, b->correct);
  EXPECT_EQ(b->samples, batch);
  ExpectSameGradients(*one, *many);
}

INSTANTIATE_TEST_SUITE_P(Replicas, EquivalenceTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(1, 2, 3, 7, 16,
                                                              33)),
                         [](const auto& info) {
                           return absl::StrCat("r", std::get<0>(info.param),
                                               "_b", std::get<1>(info.param));
                         });

// Twenty SGD (momentum) steps, the optimizer run per reduction slice.
void TrainTwentySteps(Engine* e) {
  std::vector<std::unique_ptr<Optimizer>> opts;
  OptimizerConfig c;
  c.lr = 0.05;
  c.momentum = 0.9;
  for (int r = 0; r < e->num_replicas(); ++r) {
    auto [b, en] = Engine::Slice(e->num_params(), r, e->num_replicas());
    opts.push_back(*Optimizer::Create(c, en - b));
  }
  for (int step = 0; step < 20; ++step) {
    Data d = RandomBatch(13, 100 + step);
    BatchView view{d.x.data(), d.y.data(), 13};
    auto s = e->Step(view, step, [&](int slice, int64_t begin, int64_t) {
      opts[slice]->Step(e->params() + begin, e->grads() + begin);
    });
    ASSERT_TRUE(s.ok()) << s.status();
  }
}

TEST(EngineTest, TwentySgdStepsGiveTheSameWeightsOnOneAndFourReplicas) {
  auto one = MakeEngine(1, true);
  auto four = MakeEngine(4, true);
  TrainTwentySteps(one.get());
  TrainTwentySteps(four.get());
  for (int64_t i = 0; i < one->num_params(); ++i) {
    ASSERT_NEAR(one->params()[i], four->params()[i], 1e-5f) << i;
  }
}

// StepHooks, which the job runner pushes from while backward runs, on one
// CPU replica, several, and one device with a GPU's memory model (its
// gradients land in host memory on the copy stream, layer by layer).
struct HookCase {
  const char* name;
  int replicas;
  bool off_host;
};

void PrintTo(const HookCase& c, std::ostream* os) { *os << c.name; }

class StepHooksTest : public ::testing::TestWithParam<HookCase> {
 protected:
  std::unique_ptr<Engine> Make() {
    EngineOptions o;
    if (GetParam().off_host) {
      o.open_device = [this](DeviceId id) {
        auto d = std::make_unique<testing::OffHostDevice>(id);
        off_host_ = d.get();
        return absl::StatusOr<std::unique_ptr<Device>>(std::move(d));
      };
    }
    return MakeEngine(GetParam().replicas, false, o);
  }
  bool per_layer() const { return GetParam().replicas == 1; }

  testing::OffHostDevice* off_host_ = nullptr;  // the last one opened
};

// The loss comes first; then ranges that cover the vector once, each
// already holding its final gradient in grads() when reported (one replica:
// layer by layer, the last layer first; several: one range per reduced
// slice). The gradient is the one a step without hooks computes, bit for
// bit where one replica computes it.
TEST_P(StepHooksTest, ReportEachRangeOnceAndFinal) {
  const HookCase& c = GetParam();
  auto plain = MakeEngine(c.replicas, false);
  auto hooked = Make();
  const int64_t n = hooked->num_params();
  Data d = RandomBatch(13, 7);
  BatchView view{d.x.data(), d.y.data(), 13};
  absl::Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<float> seen(n, std::nanf(""));
  int loss_calls = 0;
  bool loss_first = true;
  bool first_layer_pending = false;  // at the first report
  StepStats at_loss;
  StepHooks h;
  h.loss_known = [&](const StepStats& s) {
    absl::MutexLock lock(&mu);
    ++loss_calls;
    loss_first = loss_first && ranges.empty();
    at_loss = s;
    return absl::OkStatus();
  };
  h.grads_ready = [&](int64_t b, int64_t e) {
    absl::MutexLock lock(&mu);
    if (ranges.empty()) first_layer_pending = std::isnan(hooked->grads()[0]);
    ranges.push_back({b, e});
    std::copy(hooked->grads() + b, hooked->grads() + e, seen.begin() + b);
  };
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    ranges.clear();
    loss_calls = 0;
    std::fill(seen.begin(), seen.end(), std::nanf(""));
    // Poisoned, so that a range read before it is final shows.
    float* grads = const_cast<float*>(hooked->grads());
    std::fill(grads, grads + n, std::nanf(""));
    auto want = plain->Step(view, 5 + step);
    auto got = hooked->Step(view, 5 + step, {}, &h);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(loss_calls, 1);
    EXPECT_TRUE(loss_first);
    EXPECT_EQ(at_loss.samples, 13);
    EXPECT_EQ(at_loss.correct, got->correct);
    EXPECT_DOUBLE_EQ(at_loss.loss_sum, got->loss_sum);
    if (per_layer()) {
      // Two layers with parameters (the convolution, the linear layer),
      // the linear one reported first, while the convolution's gradient
      // was still to come: handed on beside the backward pass, not after.
      ASSERT_EQ(ranges.size(), 2u);
      EXPECT_GT(ranges[0].first, ranges[1].first);
      EXPECT_TRUE(first_layer_pending);
    } else {
      EXPECT_EQ(ranges.size(), static_cast<size_t>(c.replicas));
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t at = 0;
    for (const auto& [b, e] : ranges) {
      EXPECT_EQ(b, at);
      at = e;
    }
    EXPECT_EQ(at, n);
    for (int64_t i = 0; i < n; ++i) {
      // Final when reported (on the off-host device, a copy not yet landed
      // would show the last step's gradient), and the plain step's, bit for
      // bit (memcmp semantics, NaN included).
      ASSERT_EQ(std::memcmp(&seen[i], hooked->grads() + i, 4), 0) << i;
      if (per_layer()) {
        ASSERT_EQ(std::memcmp(&seen[i], plain->grads() + i, 4), 0) << i;
      }
    }
    if (!per_layer()) ExpectSameGradients(*plain, *hooked);
    // The weights change between steps, as a pull would change them.
    for (Engine* e : {plain.get(), hooked.get()}) {
      for (int64_t i = 0; i < n; ++i) e->params()[i] -= 0.1f * e->grads()[i];
    }
  }
  if (off_host_ != nullptr) {
    EXPECT_EQ(off_host_->async_to_host(), 4);
  }
}

// params_ready: one replica asks for each layer's weights just before its
// forward pass, in order, and reads them only after it returns (weights
// written there are the ones used); several ask once for the whole vector.
// A refusal fails the step before any gradient.
TEST_P(StepHooksTest, AskForEachLayersWeightsBeforeItsForwardPass) {
  auto plain = MakeEngine(GetParam().replicas, false);
  auto e = Make();
  const int64_t n = e->num_params();
  const std::vector<float> weights(plain->params(), plain->params() + n);
  std::fill(e->params(), e->params() + n, std::nanf(""));  // not there yet
  Data d = RandomBatch(8, 3);
  BatchView view{d.x.data(), d.y.data(), 8};
  std::vector<std::pair<int64_t, int64_t>> asked;
  bool loss_seen = false, asked_after_loss = false;
  StepHooks h;
  h.params_ready = [&](int64_t b, int64_t end) {
    asked.push_back({b, end});
    asked_after_loss = asked_after_loss || loss_seen;
    std::copy(weights.begin() + b, weights.begin() + end, e->params() + b);
    return absl::OkStatus();
  };
  h.loss_known = [&](const StepStats&) {
    loss_seen = true;
    return absl::OkStatus();
  };
  auto want = plain->Step(view, 1);
  auto got = e->Step(view, 1, {}, &h);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(asked_after_loss);
  if (per_layer()) {
    ASSERT_EQ(asked.size(), 2u);  // the convolution, then the linear layer
    EXPECT_EQ(asked[0].first, 0);
    EXPECT_EQ(asked[0].second, asked[1].first);
    EXPECT_EQ(asked[1].second, n);
  } else {
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_EQ(asked[0], std::make_pair(int64_t{0}, n));
  }
  EXPECT_DOUBLE_EQ(got->loss_sum, want->loss_sum);
  ExpectSameGradients(*plain, *e);
  int reported = 0;
  h.params_ready = [](int64_t, int64_t) {
    return absl::DataLossError("the pull broke");
  };
  h.grads_ready = [&](int64_t, int64_t) { ++reported; };
  EXPECT_THAT(e->Step(view, 1, {}, &h),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("pull broke")));
  EXPECT_EQ(reported, 0);
}

// A device fault that shows only when backward synchronises fails the step
// after the last layer's gradient went out: the first layer's range, which
// holds element 0, is never reported, so a push fed from the step is never
// complete (the job runner then cancels it). The next step reports all.
TEST(EngineTest, AStepThatFailsLateNeverReportsTheFirstLayersRange) {
  testing::OffHostDevice* dev = nullptr;
  EngineOptions o;
  o.open_device = [&dev](DeviceId id) {
    auto d = std::make_unique<testing::OffHostDevice>(id);
    dev = d.get();
    return absl::StatusOr<std::unique_ptr<Device>>(std::move(d));
  };
  auto e = MakeEngine(1, false, o);
  Data d = RandomBatch(8, 3);
  BatchView view{d.x.data(), d.y.data(), 8};
  std::vector<std::pair<int64_t, int64_t>> reported;
  StepHooks h;
  h.loss_known = [&](const StepStats&) {
    dev->FailNextSynchronize(absl::InternalError("the device faulted"));
    return absl::OkStatus();
  };
  h.grads_ready = [&](int64_t b, int64_t end) { reported.push_back({b, end}); };
  EXPECT_THAT(e->Step(view, 1, {}, &h),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("faulted")));
  ASSERT_EQ(reported.size(), 1u);  // the linear layer's, beside backward
  EXPECT_GT(reported[0].first, 0);
  reported.clear();
  h.loss_known = nullptr;
  ASSERT_TRUE(e->Step(view, 1, {}, &h).ok());
  EXPECT_EQ(reported.size(), 2u);
}

// A refusal of a later layer's weights leaves nothing of the step in
// flight: the next step (after the caller rewrote the weights) runs clean.
TEST_P(StepHooksTest, ARefusalPartWayThroughForwardLeavesTheNextStepClean) {
  if (!per_layer()) GTEST_SKIP() << "several replicas ask once";
  auto plain = MakeEngine(1, false);
  auto e = Make();
  Data d = RandomBatch(8, 3);
  BatchView view{d.x.data(), d.y.data(), 8};
  int asked = 0;
  StepHooks h;
  h.params_ready = [&](int64_t, int64_t) {
    return ++asked == 2 ? absl::DataLossError("the pull broke")
                        : absl::OkStatus();
  };
  EXPECT_THAT(e->Step(view, 1, {}, &h),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("pull broke")));
  // The caller takes the weights again (the job runner's pull), over the
  // memory the first layer's copy read.
  std::fill(e->params(), e->params() + e->num_params(), 0.5f);
  std::fill(plain->params(), plain->params() + plain->num_params(), 0.5f);
  auto want = plain->Step(view, 1);
  auto got = e->Step(view, 1);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameGradients(*plain, *e);
}

INSTANTIATE_TEST_SUITE_P(
    Engines, StepHooksTest,
    ::testing::Values(HookCase{"OneCpu", 1, false},
                      HookCase{"ThreeCpus", 3, false},
                      HookCase{"OneOffHost", 1, true}),
    [](const ::testing::TestParamInfo<HookCase>& info) {
      return std::string(info.param.name);
    });

TEST(EngineTest, AFailingLossHookFailsTheStepAndReportsNoGradient) {
  auto e = MakeEngine(1, false);
  Data d = RandomBatch(8, 3);
  BatchView view{d.x.data(), d.y.data(), 8};
  int reported = 0;
  StepHooks h;
  h.loss_known = [](const StepStats&) {
    return absl::UnavailableError("the push could not start");
  };
  h.grads_ready = [&](int64_t, int64_t) { ++reported; };
  EXPECT_THAT(e->Step(view, 1, {}, &h),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("could not start")));
  EXPECT_EQ(reported, 0);
  EXPECT_TRUE(e->Step(view, 1).ok());  // the next step runs
}

// The paths GPUs take, run on devices with a GPU's memory model
// (tests/off_host_device.h): pinned master copies, weights streamed in per
// layer, gradients streamed out per layer, the peer-copy all-reduce.
struct PathCase {
  const char* name;
  int replicas;
  bool off_host;
  bool force_peer;
  const char* reduction;
};

void PrintTo(const PathCase& c, std::ostream* os) { *os << c.name; }

class ReductionPathTest : public ::testing::TestWithParam<PathCase> {
 protected:
  std::unique_ptr<Engine> Make(std::vector<testing::OffHostDevice*>* opened,
                               EngineOptions o = {}) {
    const PathCase& c = GetParam();
    if (c.off_host) {
      o.open_device =
          [opened](DeviceId id) -> absl::StatusOr<std::unique_ptr<Device>> {
        auto d = std::make_unique<testing::OffHostDevice>(id);
        opened->push_back(d.get());
        return std::unique_ptr<Device>(std::move(d));
      };
    }
    o.force_peer_reduction = c.force_peer;
    return MakeEngine(c.replicas, true, o);
  }
};

TEST_P(ReductionPathTest, MatchesOneCpuStepByStep) {
  const PathCase& c = GetParam();
  std::vector<testing::OffHostDevice*> opened;
  auto e = Make(&opened);
  EXPECT_STREQ(e->reduction(), c.reduction);
  auto one = MakeEngine(1, true);
  Data d = RandomBatch(11, 4);
  BatchView view{d.x.data(), d.y.data(), 11};
  auto a = one->Step(view, 2);
  auto b = e->Step(view, 2);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_NEAR(a->loss_sum, b->loss_sum, 1e-4 * (1 + std::fabs(a->loss_sum)));
  ExpectSameGradients(*one, *e);
  if (c.off_host) {
    // Two parameterised layers: their weights went in one by one, besides
    // the batch's inputs and labels, and (reducing on the host) their
    // gradients came out one by one.
    const int grads_out = std::string(c.reduction) == "host" ? 2 : 0;
    for (const auto* dev : opened) {
      EXPECT_EQ(dev->async_to_device(), 4) << dev->id().ToString();
      EXPECT_EQ(dev->async_to_host(), grads_out) << dev->id().ToString();
    }
  }
  // Weights changed between steps must reach every replica.
  auto fresh = MakeEngine(1, true);
  auto other = Make(&opened);
  TrainTwentySteps(fresh.get());
  TrainTwentySteps(other.get());
  for (int64_t i = 0; i < fresh->num_params(); ++i) {
    ASSERT_NEAR(fresh->params()[i], other->params()[i], 1e-5f) << i;
  }
}

// Only the multi-replica paths can lose one replica of several.
class MultiReplicaPathTest : public ReductionPathTest {};

TEST_P(MultiReplicaPathTest, AFailingReplicaFailsOnlyThatStep) {
  std::atomic<bool> fail{true};
  EngineOptions o;
  o.step_timeout = absl::Seconds(30);
  o.fault_hook = [&](int replica) -> absl::Status {
    if (replica == 1 && fail) return absl::InternalError("replica 1 broke");
    return absl::OkStatus();
  };
  std::vector<testing::OffHostDevice*> opened;
  auto e = Make(&opened, o);
  Data d = RandomBatch(9, 1);
  BatchView view{d.x.data(), d.y.data(), 9};
  EXPECT_THAT(StepOrHang(e.get(), view, 0),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("replica 1")));
  fail = false;
  auto one = MakeEngine(1, true);
  auto a = one->Step(view, 1);
  auto b = e->Step(view, 1);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  ExpectSameGradients(*one, *e);
}

const PathCase kMultiReplicaPaths[] = {
    {"OffHostThreeOnHost", 3, true, false, "host"},
    {"OffHostThreePeer", 3, true, true, "peer"},
    {"CpuThreePeer", 3, false, true, "peer"}};

std::string PathName(const ::testing::TestParamInfo<PathCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(
    Paths, ReductionPathTest,
    ::testing::Values(PathCase{"OffHostOne", 1, true, false, "host"},
                      kMultiReplicaPaths[0], kMultiReplicaPaths[1],
                      kMultiReplicaPaths[2]),
    PathName);
INSTANTIATE_TEST_SUITE_P(Paths, MultiReplicaPathTest,
                         ::testing::ValuesIn(kMultiReplicaPaths), PathName);

TEST(EngineTest, AFailingReplicaFailsTheStepWithoutHangingAndTheNextStepRuns) {
  std::atomic<int> calls{0};
  std::atomic<bool> fail{true};
  EngineOptions o;
  o.step_timeout = absl::Seconds(30);
  o.fault_hook = [&](int replica) -> absl::Status {
    ++calls;
    if (replica == 1 && fail)
      return absl::ResourceExhaustedError("replica 1: out of memory");
    return absl::OkStatus();
  };
  auto e = MakeEngine(3, false, o);
  Data d = RandomBatch(9, 1);
  BatchView view{d.x.data(), d.y.data(), 9};
  EXPECT_THAT(
      StepOrHang(e.get(), view, 0),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("replica 1")));
  EXPECT_EQ(calls, 3);  // the others ran their part to the end
  fail = false;
  auto next = e->Step(view, 1);
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST(EngineTest, ABadLabelOnOneReplicaIsAnErrorNotACrash) {
  auto e = MakeEngine(2, false);
  Data d = RandomBatch(6, 1);
  d.y[5] = 9;  // lands on replica 1
  BatchView view{d.x.data(), d.y.data(), 6};
  EXPECT_THAT(e->Step(view, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label")));
  d.y[5] = 1;
  EXPECT_TRUE(e->Step(view, 0).ok());
}

TEST(EngineTest, EvaluateSplitsTheDatasetAndMatchesOneDevice) {
  auto one = MakeEngine(1, true);
  auto three = MakeEngine(3, true);
  Data d = RandomBatch(101, 4);
  Dataset ds;
  ds.sample_shape = {1, 8, 8};
  ds.num_classes = 4;
  ds.features = d.x;
  ds.labels = d.y;
  auto a = one->Evaluate(ds);
  auto b = three->Evaluate(ds);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->samples, 101);
  EXPECT_EQ(b->samples, 101);
  EXPECT_EQ(a->correct, b->correct);
  EXPECT_NEAR(a->loss_sum, b->loss_sum, 1e-3);
}

TEST(ThreadGroupTest,
     RoundThatOverrunsItsDeadlineIsReportedAndTheGroupRefusesMore) {
  ThreadGroup g(2);
  std::atomic<bool> release{false};
  absl::Status s = g.Run(
      [&](int i) {
        while (i == 1 && !release)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return absl::OkStatus();
      },
      absl::Milliseconds(50));
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 of 2")));
  EXPECT_THAT(g.Run([](int) { return absl::OkStatus(); }, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("never finished")));
  release = true;  // lets the destructor join
}

TEST(EngineTest, UnknownDeviceFailsAtCreation) {
  EngineOptions o;
  o.devices = {{DeviceType::kCuda, 0}};
  EXPECT_THAT(
      Engine::Create(SmallCnn(false), {1, 8, 8}, o),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cuda:0")));
}

}  // namespace
}  // namespace tally
