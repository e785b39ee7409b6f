// Layers and loss: PyTorch golden values and finite-difference gradients.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/device.h"
#include "common/nn/layer_config.h"
#include "common/nn/loss.h"
#include "common/nn/sequential.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::LoadGolden;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

LayerConfig Linear(int64_t in, int64_t out) {
  LayerConfig c;
  c.type = LayerType::kLinear;
  c.in_features = in;
  c.out_features = out;
  return c;
}
LayerConfig Conv(int64_t in, int64_t out, int64_t k, int64_t stride = 0,
                 int64_t pad = 0) {
  LayerConfig c;
  c.type = LayerType::kConv2d;
  c.in_channels = in;
  c.out_channels = out;
  c.kernel_size = k;
  c.stride = stride;
  c.padding = pad;
  return c;
}
LayerConfig Pool(int64_t k, int64_t stride = 0, int64_t pad = 0) {
  LayerConfig c;
  c.type = LayerType::kMaxPool2d;
  c.kernel_size = k;
  c.stride = stride;
  c.padding = pad;
  return c;
}
LayerConfig Simple(LayerType t) {
  LayerConfig c;
  c.type = t;
  return c;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                float tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i])))
        << what << " at " << i;
  }
}

// A one-device model plus helpers to run it on host vectors.
class Harness {
 public:
  Harness(std::vector<LayerConfig> layers, Shape input_shape) {
    auto dev = OpenDevice({DeviceType::kCpu, 0});
    EXPECT_TRUE(dev.ok());
    device_ = *std::move(dev);
    auto m = Sequential::Create(layers, input_shape, device_.get());
    EXPECT_TRUE(m.ok()) << m.status();
    model_ = *std::move(m);
  }

  Sequential& model() { return *model_; }

  void SetParams(const std::vector<float>& p) {
    ASSERT_EQ(static_cast<int64_t>(p.size()), model_->num_params());
    std::memcpy(model_->params(), p.data(), p.size() * sizeof(float));
  }

  std::vector<float> Forward(const std::vector<float>& x, int batch,
                             bool training = true, uint64_t seed = 0) {
    auto out = model_->Forward(x.data(), batch, training, seed);
    EXPECT_TRUE(out.ok()) << out.status();
    return std::vector<float>(out->data, out->data + out->numel());
  }

  // Returns dx; grads are in model().grads().
  std::vector<float> Backward(const std::vector<float>& dy, size_t x_size) {
    std::vector<float> dx(x_size, 123.0f);
    EXPECT_TRUE(model_->Backward(dy.data(), dx.data()).ok());
    return dx;
  }

  std::vector<float> Grads() {
    return std::vector<float>(model_->grads(),
                              model_->grads() + model_->num_params());
  }

 private:
  std::unique_ptr<Device> device_;
  std::unique_ptr<Sequential> model_;
};

// Concatenates golden tensors in state_dict order.
std::vector<float> Cat(const TensorMap& t,
                       std::initializer_list<const char*> names) {
  std::vector<float> out;
  for (const char* n : names) {
    auto it = t.find(n);
    EXPECT_NE(it, t.end()) << n;
    if (it != t.end())
      out.insert(out.end(), it->second.data.begin(), it->second.data.end());
  }
  return out;
}

struct GoldenCase {
  const char* fixture;
  LayerConfig layer;
  bool has_params;
  friend void PrintTo(const GoldenCase& c, std::ostream* os) {
    *os << c.fixture;
  }
};

class GoldenLayerTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenLayerTest, MatchesPyTorch) {
  const GoldenCase& c = GetParam();
  TensorMap t = LoadGolden(c.fixture);
  const HostTensor& x = t.at("x");
  Shape sample(x.shape.begin() + 1, x.shape.end());
  Harness h({c.layer}, sample);
  if (c.has_params) h.SetParams(Cat(t, {"weight", "bias"}));
  const int batch = static_cast<int>(x.shape[0]);
  ExpectNear(h.Forward(x.data, batch), t.at("y").data, 1e-5f, "y");
  ExpectNear(h.Backward(t.at("dy").data, x.data.size()), t.at("dx").data, 1e-5f,
             "dx");
  if (c.has_params)
    ExpectNear(h.Grads(), Cat(t, {"dweight", "dbias"}), 1e-4f, "grads");
}

INSTANTIATE_TEST_SUITE_P(
    Layers, GoldenLayerTest,
    ::testing::Values(GoldenCase{"linear", Linear(5, 3), true},
                      GoldenCase{"conv2d_s1p0", Conv(2, 3, 3), true},
                      GoldenCase{"conv2d_s2p1", Conv(2, 4, 3, 2, 1), true},
                      GoldenCase{"maxpool2d_k2", Pool(2), false},
                      GoldenCase{"maxpool2d_k3s2p1", Pool(3, 2, 1), false},
                      GoldenCase{"relu", Simple(LayerType::kReLU), false}),
    [](const auto& info) { return std::string(info.param.fixture); });

TEST(CrossEntropyTest, MatchesPyTorch) {
  TensorMap t = LoadGolden("cross_entropy");
  auto dev = OpenDevice({DeviceType::kCpu, 0});
  ASSERT_TRUE(dev.ok());
  CrossEntropyLoss loss(dev->get());
  std::vector<float> logits = t.at("logits").data;
  std::vector<int32_t> labels;
  for (float l : t.at("labels").data) labels.push_back(static_cast<int32_t>(l));
  Tensor view{logits.data(), {6, 5}};
  auto stats = loss.Compute(view, labels.data(), 1.0f / 6);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_NEAR(stats->loss_sum / 6, t.at("loss").data[0], 1e-6);
  std::vector<float> d(loss.dlogits(), loss.dlogits() + 30);
  ExpectNear(d, t.at("dlogits").data, 1e-6f, "dlogits");
}

TEST(CrossEntropyTest, StableForHugeLogits) {
  auto dev = OpenDevice({DeviceType::kCpu, 0});
  ASSERT_TRUE(dev.ok());
  CrossEntropyLoss loss(dev->get());
  std::vector<float> logits = {1000.0f, -1000.0f, 0.0f, 3000.0f, 2990.0f, 0.0f};
  std::vector<int32_t> labels = {0, 1};
  auto stats = loss.Compute(Tensor{logits.data(), {2, 3}}, labels.data(), 0.5f);
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(std::isfinite(stats->loss_sum));
  EXPECT_NEAR(stats->loss_sum, 10.0, 1e-3);  // row 0 ~0, row 1 ~10
  EXPECT_EQ(stats->correct, 1);
}

TEST(CrossEntropyTest, RejectsOutOfRangeLabel) {
  auto dev = OpenDevice({DeviceType::kCpu, 0});
  ASSERT_TRUE(dev.ok());
  CrossEntropyLoss loss(dev->get());
  std::vector<float> logits(6, 0.0f);
  std::vector<int32_t> labels = {0, 3};
  EXPECT_THAT(loss.Compute(Tensor{logits.data(), {2, 3}}, labels.data(), 0.5f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label")));
}

TEST(SequentialTest, WholeModelMatchesPyTorchIncludingLayout) {
  TensorMap t = LoadGolden("model_cnn");
  std::vector<LayerConfig> layers = {Conv(1, 3, 3), Simple(LayerType::kReLU),
                                     Pool(2), Simple(LayerType::kFlatten),
                                     Linear(27, 5)};
  Harness h(layers, {1, 8, 8});
  const auto& params = h.model().layout().params;
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].name, "0.weight");
  EXPECT_EQ(params[1].name, "0.bias");
  EXPECT_EQ(params[2].name, "4.weight");
  EXPECT_EQ(params[3].name, "4.bias");
  std::vector<float> flat, want_grads;
  for (const auto& p : params) {
    const HostTensor& v = t.at("param." + p.name);
    EXPECT_EQ(v.shape, p.shape) << p.name;
    flat.insert(flat.end(), v.data.begin(), v.data.end());
    const HostTensor& g = t.at("grad." + p.name);
    want_grads.insert(want_grads.end(), g.data.begin(), g.data.end());
  }
  h.SetParams(flat);
  ExpectNear(h.Forward(t.at("x").data, 4), t.at("logits").data, 1e-5f,
             "logits");
  auto logits = h.model().Forward(t.at("x").data.data(), 4, true);
  ASSERT_TRUE(logits.ok());
  auto dev = OpenDevice({DeviceType::kCpu, 0});
  CrossEntropyLoss loss(dev->get());
  std::vector<int32_t> labels;
  for (float l : t.at("labels").data) labels.push_back(static_cast<int32_t>(l));
  auto stats = loss.Compute(*logits, labels.data(), 0.25f);
  ASSERT_TRUE(stats.ok());
  EXPECT_NEAR(stats->loss_sum / 4, t.at("loss").data[0], 1e-5);
  TALLY_ASSERT_OK(h.model().Backward(loss.dlogits()));
  ExpectNear(h.Grads(), want_grads, 1e-4f, "grads");
}

// ---- Finite differences -------------------------------------------------

struct FdCase {
  const char* name;
  std::vector<LayerConfig> layers;
  Shape sample;
  int batch;
  friend void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }
};

// Inputs well away from ReLU's kink and with no near-ties for max-pooling.
std::vector<float> SpreadValues(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  // Distinct values at least 0.02 away from zero, 0.05 apart.
  const int64_t half = static_cast<int64_t>(n / 2);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(static_cast<int64_t>(i) - half) * 0.05f + 0.02f;
  }
  rng.Shuffle(v);
  return v;
}

class FiniteDifferenceTest : public ::testing::TestWithParam<FdCase> {};

TEST_P(FiniteDifferenceTest, GradientsMatchNumericalDerivative) {
  const FdCase& c = GetParam();
  Harness h(c.layers, c.sample);
  const int64_t x_size = NumElements(c.sample) * c.batch;
  std::vector<float> x = SpreadValues(x_size, 7);
  Rng rng(11);
  std::vector<float> params(h.model().num_params());
  for (float& p : params) p = rng.Uniform(-0.5f, 0.5f);
  h.SetParams(params);
  const std::vector<float> y0 = h.Forward(x, c.batch);
  std::vector<float> r(y0.size());
  for (float& v : r) v = rng.Uniform(-1.0f, 1.0f);
  // Objective L = sum(y * r), so dL/dy = r.
  auto objective = [&](const std::vector<float>& xs) {
    std::vector<float> y = h.Forward(xs, c.batch);
    double s = 0.0;
    for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
    return s;
  };
  h.Forward(x, c.batch);
  const std::vector<float> dx = h.Backward(r, x.size());
  const std::vector<float> dparams = h.Grads();

  const float eps = 1e-3f;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<float> xp = x, xm = x;
    xp[i] += eps;
    xm[i] -= eps;
    const double num = (objective(xp) - objective(xm)) / (2.0 * eps);
    ASSERT_NEAR(dx[i], num, 2e-2 * (1.0 + std::fabs(num)))
        << c.name << " dx " << i;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> pp = params, pm = params;
    pp[i] += eps;
    pm[i] -= eps;
    h.SetParams(pp);
    const double up = objective(x);
    h.SetParams(pm);
    const double down = objective(x);
    const double num = (up - down) / (2.0 * eps);
    ASSERT_NEAR(dparams[i], num, 2e-2 * (1.0 + std::fabs(num)))
        << c.name << " param " << i;
  }
  h.SetParams(params);
}

LayerConfig DropoutConfig(double p) {
  LayerConfig c = Simple(LayerType::kDropout);
  c.p = p;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Layers, FiniteDifferenceTest,
    ::testing::Values(
        FdCase{"linear", {Linear(6, 4)}, {6}, 3},
        FdCase{"linear_nobias",
               {[] {
                 auto c = Linear(5, 2);
                 c.bias = false;
                 return c;
               }()},
               {5},
               2},
        FdCase{"conv", {Conv(2, 3, 3)}, {2, 5, 5}, 2},
        FdCase{"conv_stride_pad", {Conv(2, 2, 3, 2, 1)}, {2, 6, 5}, 2},
        FdCase{"maxpool", {Pool(2)}, {2, 4, 4}, 2},
        FdCase{"maxpool_k3s2p1", {Pool(3, 2, 1)}, {1, 5, 5}, 2},
        FdCase{"relu", {Simple(LayerType::kReLU)}, {7}, 3},
        FdCase{"dropout", {DropoutConfig(0.3)}, {10}, 3},
        FdCase{"flatten_linear",
               {Simple(LayerType::kFlatten), Linear(8, 3)},
               {2, 2, 2},
               2},
        FdCase{"cnn",
               {Conv(1, 2, 3), Simple(LayerType::kReLU), Pool(2),
                Simple(LayerType::kFlatten), Linear(8, 3)},
               {1, 6, 6},
               2}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(LossFiniteDifferenceTest, CrossEntropyGradient) {
  auto dev = OpenDevice({DeviceType::kCpu, 0});
  ASSERT_TRUE(dev.ok());
  CrossEntropyLoss loss(dev->get());
  Rng rng(3);
  std::vector<float> logits(12);
  for (float& v : logits) v = rng.Uniform(-2, 2);
  std::vector<int32_t> labels = {0, 3, 1};
  auto value = [&](const std::vector<float>& l) {
    std::vector<float> copy = l;
    auto s = loss.Evaluate(Tensor{copy.data(), {3, 4}}, labels.data());
    return s->loss_sum / 3.0;
  };
  ASSERT_TRUE(
      loss.Compute(Tensor{logits.data(), {3, 4}}, labels.data(), 1.0f / 3)
          .ok());
  std::vector<float> d(loss.dlogits(), loss.dlogits() + 12);
  for (size_t i = 0; i < logits.size(); ++i) {
    std::vector<float> p = logits, m = logits;
    p[i] += 1e-3f;
    m[i] -= 1e-3f;
    EXPECT_NEAR(d[i], (value(p) - value(m)) / 2e-3, 1e-3) << i;
  }
}

TEST(DropoutTest, EvalIsIdentityAndTrainingScalesKeptUnits) {
  Harness h({DropoutConfig(0.5)}, {1000});
  std::vector<float> x(1000, 1.0f);
  EXPECT_EQ(h.Forward(x, 1, /*training=*/false), x);
  std::vector<float> y = h.Forward(x, 1, /*training=*/true, /*seed=*/5);
  int kept = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.0f || v == 2.0f) << v;
    kept += v != 0.0f;
  }
  EXPECT_GT(kept, 400);
  EXPECT_LT(kept, 600);
  EXPECT_EQ(h.Forward(x, 1, true, 5), y);  // same seed, same mask
  EXPECT_NE(h.Forward(x, 1, true, 6), y);
}

TEST(SequentialTest, BuffersGrowWithBatchAndResultsDoNotDependOnIt) {
  Harness h({Linear(3, 2)}, {3});
  std::vector<float> params = {1, 2, 3, 4, 5, 6, 0.5f, -0.5f};
  h.SetParams(params);
  std::vector<float> one = h.Forward({1, 1, 1}, 1);
  std::vector<float> many = h.Forward({1, 1, 1, 0, 0, 0, 2, 2, 2}, 3);
  EXPECT_EQ(one, (std::vector<float>{6.5f, 14.5f}));
  EXPECT_EQ(many, (std::vector<float>{6.5f, 14.5f, 0.5f, -0.5f, 12.5f, 29.5f}));
}

TEST(SequentialTest, RejectsLayersThatDoNotChain) {
  auto dev = OpenDevice({DeviceType::kCpu, 0});
  ASSERT_TRUE(dev.ok());
  EXPECT_THAT(Sequential::Create({Conv(1, 10, 5), Simple(LayerType::kFlatten),
                                  Linear(1440, 10)},
                                 {1, 28, 28}, dev->get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("layers[2] (linear): in_features is 1440 but "
                                 "the input has 5760")));
}

// Without a dinput, layers from the first with parameters down compute no
// input gradient (an MLP's first Linear after its Flatten skips its largest
// GEMM): every parameter gradient is the same as with one, bit for bit.
TEST(SequentialTest, NoInputGradientLeavesParameterGradientsAlone) {
  std::vector<LayerConfig> layers = {Simple(LayerType::kFlatten),
                                     Simple(LayerType::kReLU), Linear(12, 5),
                                     Simple(LayerType::kReLU), Linear(5, 3)};
  Harness with(layers, {3, 4}), without(layers, {3, 4});
  Rng rng(7);
  std::vector<float> p(with.model().num_params()), x(2 * 12), dy(2 * 3);
  for (float& v : p) v = 0.5f * rng.Normal();
  for (float& v : x) v = rng.Normal();
  for (float& v : dy) v = rng.Normal();
  with.SetParams(p);
  without.SetParams(p);
  with.Forward(x, 2);
  without.Forward(x, 2);
  const std::vector<float> dx = with.Backward(dy, x.size());
  TALLY_ASSERT_OK(without.model().Backward(dy.data(), nullptr));
  EXPECT_EQ(without.Grads(), with.Grads());
  // The input gradient, where asked for, is there: zero only where ReLU
  // cut it.
  int nonzero = 0;
  for (float v : dx) nonzero += v != 0.0f && v != 123.0f;
  EXPECT_GT(nonzero, 0);
}

TEST(SequentialTest, BackwardWithoutForwardIsAnError) {
  Harness h({Linear(3, 2)}, {3});
  std::vector<float> dy(2);
  EXPECT_THAT(
      h.model().Backward(dy.data()),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Forward")));
}

TEST(InitTest, MatchesPyTorchDefaultBoundsAndIsSeeded) {
  std::vector<LayerConfig> layers = {
      Conv(1, 10, 5), Simple(LayerType::kFlatten), Linear(5760, 10)};
  auto layout = ComputeLayout(layers, {1, 28, 28});
  ASSERT_TRUE(layout.ok());
  std::vector<float> a = InitParams(layers, *layout, 42);
  EXPECT_EQ(a, InitParams(layers, *layout, 42));
  EXPECT_NE(a, InitParams(layers, *layout, 43));
  // conv fan_in = 25 -> bound 0.2; linear fan_in = 5760 -> bound ~0.01318.
  for (const auto& p : layout->params) {
    const float bound = p.name[0] == '0' ? 0.2f : 1.0f / std::sqrt(5760.0f);
    float lo = 1, hi = -1;
    for (int64_t i = 0; i < p.numel; ++i) {
      lo = std::min(lo, a[p.offset + i]);
      hi = std::max(hi, a[p.offset + i]);
    }
    EXPECT_GE(lo, -bound) << p.name;
    EXPECT_LE(hi, bound) << p.name;
    if (p.numel > 100) {
      EXPECT_LT(lo, -0.9f * bound) << p.name;
      EXPECT_GT(hi, 0.9f * bound) << p.name;
    }
  }
}

}  // namespace
}  // namespace tally
