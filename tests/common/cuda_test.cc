// The CUDA backend against the CPU one, op by op and for a whole training
// step, within stated tolerances (as ggml's test-backend-ops does). Every
// test skips, saying why, where no GPU can be used; the start-up error for
// that case is tested here too.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/device.h"
#ifdef TALLY_HAVE_CUDA
#include "common/cuda/cuda_device.h"
#endif
#include "common/kernels.h"
#include "common/nn/loss.h"
#include "common/nn/sequential.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/engine.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

// FP32 on both sides; differences come from summation order only.
constexpr float kTol = 1e-4f;

int GpuCount() {
  auto d = ParseDevices("cuda:all");
  return d.ok() ? static_cast<int>(d->size()) : 0;
}

#define REQUIRE_GPUS(n)                                            \
  do {                                                             \
    if (!CudaBackendCompiled())                                    \
      GTEST_SKIP() << "built without the CUDA backend";            \
    if (GpuCount() < (n)) {                                        \
      GTEST_SKIP() << "needs " << (n) << " GPU(s): "               \
                   << ParseDevices("cuda:all").status().message(); \
    }                                                              \
  } while (0)

TEST(CudaStartupTest, NoUsableGpuIsAClearFailedPrecondition) {
  if (!CudaBackendCompiled()) GTEST_SKIP() << "built without the CUDA backend";
  if (GpuCount() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_THAT(ParseDevices("cuda:all"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cudaGetDeviceCount")));
  EXPECT_THAT(ParseDevices("cuda:0"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no usable GPU")));
  EXPECT_THAT(OpenDevice({DeviceType::kCuda, 0}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cannot open cuda:0")));
}

TEST(CudaStartupTest, DiscoveryListsEveryGpuAndRefusesMissingOnes) {
  REQUIRE_GPUS(1);
  const int n = GpuCount();
  EXPECT_THAT(ParseDevices(absl::StrCat("cuda:", n)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("there is no GPU")));
  auto zero = ParseDevices("cuda:0");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ((*zero)[0], (DeviceId{DeviceType::kCuda, 0}));
}

// NCCL is loaded at run time; where the library is installed (as in CI,
// with the CUDA toolkit) every entry point Tally uses must bind. No GPU is
// needed for that.
TEST(CudaStartupTest, NcclLoadsAtRunTimeWhereInstalled) {
#ifdef TALLY_HAVE_CUDA
  const absl::Status s = cuda::LoadNccl();
  if (!s.ok()) {
    EXPECT_THAT(s,
                StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("NCCL")));
    GTEST_SKIP() << "NCCL is not installed here: " << s.message();
  }
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

// Runs the same kernel call on CPU and GPU buffers and compares outputs.
class Pair {
 public:
  Pair() {
    cpu_ = *OpenDevice({DeviceType::kCpu, 0});
    auto g = OpenDevice({DeviceType::kCuda, 0});
    EXPECT_TRUE(g.ok()) << g.status();
    gpu_ = *std::move(g);
  }
  Device* cpu() { return cpu_.get(); }
  Device* gpu() { return gpu_.get(); }

  // A host vector mirrored on both devices.
  struct Buf {
    DeviceBuffer<float> c, g;
    size_t n;
  };
  Buf Make(const std::vector<float>& host) {
    Buf b;
    b.n = host.size();
    b.c = *DeviceBuffer<float>::Create(cpu(), b.n);
    b.g = *DeviceBuffer<float>::Create(gpu(), b.n);
    std::copy(host.begin(), host.end(), b.c.data());
    EXPECT_TRUE(gpu()->CopyFromHost(b.g.data(), host.data(), b.n * 4).ok());
    return b;
  }
  Buf Zeros(size_t n) { return Make(std::vector<float>(n, 0.0f)); }
  void ExpectSame(const Buf& b, const char* what, float tol = kTol) {
    std::vector<float> g(b.n);
    TALLY_ASSERT_OK(gpu()->CopyToHost(g.data(), b.g.data(), b.n * 4));
    for (size_t i = 0; i < b.n; ++i) {
      ASSERT_NEAR(g[i], b.c.data()[i], tol * (1 + std::fabs(b.c.data()[i])))
          << what << " at " << i;
    }
  }

 private:
  std::unique_ptr<Device> cpu_, gpu_;
};

std::vector<float> Random(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.Uniform(-1, 1);
  return v;
}

TEST(CudaKernelsTest, GemmAllTransposes) {
  REQUIRE_GPUS(1);
  Pair p;
  const int m = 37, n = 53, k = 29;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = p.Make(Random(m * k, 1)), b = p.Make(Random(k * n, 2)),
           c = p.Make(Random(m * n, 3));
      const int lda = ta ? m : k, ldb = tb ? k : n;
      p.cpu()->kernels().Gemm(ta, tb, m, n, k, 0.5f, a.c.data(), lda,
                              b.c.data(), ldb, 0.25f, c.c.data(), n);
      p.gpu()->kernels().Gemm(ta, tb, m, n, k, 0.5f, a.g.data(), lda,
                              b.g.data(), ldb, 0.25f, c.g.data(), n);
      p.ExpectSame(
          c, ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"));
    }
  }
}

TEST(CudaKernelsTest, ElementwiseAndRowOps) {
  REQUIRE_GPUS(1);
  Pair p;
  const int rows = 13, cols = 70;
  auto x = p.Make(Random(rows * cols, 4)), dy = p.Make(Random(rows * cols, 5));
  auto y = p.Zeros(rows * cols), dx = p.Zeros(rows * cols),
       mask = p.Zeros(rows * cols);
  auto bias = p.Make(Random(cols, 6)), db = p.Zeros(cols);
  for (Device* d : {p.cpu(), p.gpu()}) {
    const bool g = d == p.gpu();
    Kernels& k = d->kernels();
    k.ReluForward((g ? x.g : x.c).data(), (g ? y.g : y.c).data(), x.n);
    k.ReluBackward((g ? y.g : y.c).data(), (g ? dy.g : dy.c).data(),
                   (g ? dx.g : dx.c).data(), x.n);
    k.SumRows((g ? dy.g : dy.c).data(), rows, cols, (g ? db.g : db.c).data());
  }
  p.ExpectSame(y, "relu");
  p.ExpectSame(dx, "relu backward");
  p.ExpectSame(db, "sum rows");
  for (Device* d : {p.cpu(), p.gpu()}) {
    const bool g = d == p.gpu();
    Kernels& k = d->kernels();
    k.DropoutForward((g ? x.g : x.c).data(), (g ? y.g : y.c).data(),
                     (g ? mask.g : mask.c).data(), x.n, 0.3f, 99, 1000);
    k.BroadcastRows((g ? bias.g : bias.c).data(), rows, cols,
                    (g ? dx.g : dx.c).data());
    k.Axpy(x.n, 0.5f, (g ? x.g : x.c).data(), (g ? dx.g : dx.c).data());
    k.Scale(x.n, 3.0f, (g ? dx.g : dx.c).data());
  }
  p.ExpectSame(mask, "dropout mask", 0.0f);  // the same hash on both
  p.ExpectSame(y, "dropout");
  p.ExpectSame(dx, "broadcast, axpy, scale");
}

struct ConvCase {
  int batch, cin, h, w, cout, k, stride, pad;
};

TEST(CudaKernelsTest, ConvolutionAndPoolingForwardAndBackward) {
  REQUIRE_GPUS(1);
  Pair p;
  for (const ConvCase& c : {ConvCase{3, 1, 28, 28, 10, 5, 1, 0},
                            ConvCase{2, 3, 9, 7, 4, 3, 2, 1}}) {
    Conv2dGeometry g;
    g.batch = c.batch;
    g.in_channels = c.cin;
    g.in_h = c.h;
    g.in_w = c.w;
    g.out_channels = c.cout;
    g.kernel = c.k;
    g.stride = c.stride;
    g.padding = c.pad;
    const size_t xs = c.batch * c.cin * c.h * c.w,
                 ws = c.cout * c.cin * c.k * c.k;
    const size_t ys = c.batch * c.cout * g.out_h() * g.out_w();
    auto x = p.Make(Random(xs, 7)), w = p.Make(Random(ws, 8)),
         b = p.Make(Random(c.cout, 9));
    auto dy = p.Make(Random(ys, 10));
    auto y = p.Zeros(ys), dw = p.Zeros(ws), db = p.Zeros(c.cout),
         dx = p.Zeros(xs);
    for (Device* d : {p.cpu(), p.gpu()}) {
      const bool gp = d == p.gpu();
      Kernels& k = d->kernels();
      k.Conv2dForward(g, (gp ? x.g : x.c).data(), (gp ? w.g : w.c).data(),
                      (gp ? b.g : b.c).data(), (gp ? y.g : y.c).data());
      k.Conv2dBackward(g, (gp ? x.g : x.c).data(), (gp ? w.g : w.c).data(),
                       (gp ? dy.g : dy.c).data(), (gp ? dw.g : dw.c).data(),
                       (gp ? db.g : db.c).data(), (gp ? dx.g : dx.c).data());
    }
    p.ExpectSame(y, "conv forward");
    p.ExpectSame(dw, "conv weight gradient", 1e-3f);
    p.ExpectSame(db, "conv bias gradient", 1e-3f);
    p.ExpectSame(dx, "conv input gradient");

    Pool2dGeometry pg;
    pg.batch = c.batch;
    pg.channels = c.cin;
    pg.in_h = c.h;
    pg.in_w = c.w;
    pg.kernel = c.k > 3 ? 2 : 3;
    pg.stride = 2;
    pg.padding = c.k > 3 ? 0 : 1;
    const size_t ps = c.batch * c.cin * pg.out_h() * pg.out_w();
    auto py = p.Zeros(ps), pdy = p.Make(Random(ps, 11)), pdx = p.Zeros(xs);
    auto argc = *DeviceBuffer<int32_t>::Create(p.cpu(), ps);
    auto argg = *DeviceBuffer<int32_t>::Create(p.gpu(), ps);
    p.cpu()->kernels().MaxPool2dForward(pg, x.c.data(), py.c.data(),
                                        argc.data());
    p.gpu()->kernels().MaxPool2dForward(pg, x.g.data(), py.g.data(),
                                        argg.data());
    p.cpu()->kernels().MaxPool2dBackward(pg, pdy.c.data(), argc.data(),
                                         pdx.c.data());
    p.gpu()->kernels().MaxPool2dBackward(pg, pdy.g.data(), argg.data(),
                                         pdx.g.data());
    p.ExpectSame(py, "max pool");
    p.ExpectSame(pdx, "max pool backward");
  }
}

TEST(CudaKernelsTest, SoftmaxCrossEntropyAndBadLabels) {
  REQUIRE_GPUS(1);
  Pair p;
  const int batch = 33, classes = 10;
  auto logits = p.Make(Random(batch * classes, 12));
  std::vector<int32_t> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = (i * 7) % classes;
  auto lc = *DeviceBuffer<int32_t>::Create(p.cpu(), batch);
  auto lg = *DeviceBuffer<int32_t>::Create(p.gpu(), batch);
  std::copy(labels.begin(), labels.end(), lc.data());
  TALLY_ASSERT_OK(p.gpu()->CopyFromHost(lg.data(), labels.data(), batch * 4));
  CrossEntropyLoss cl(p.cpu()), gl(p.gpu());
  auto cs = cl.Compute(Tensor{logits.c.data(), {batch, classes}}, lc.data(),
                       1.0f / batch);
  auto gs = gl.Compute(Tensor{logits.g.data(), {batch, classes}}, lg.data(),
                       1.0f / batch);
  ASSERT_TRUE(cs.ok() && gs.ok()) << gs.status();
  EXPECT_NEAR(cs->loss_sum, gs->loss_sum, 1e-3);
  EXPECT_EQ(cs->correct, gs->correct);
  std::vector<float> dg(batch * classes);
  TALLY_ASSERT_OK(p.gpu()->CopyToHost(dg.data(), gl.dlogits(), dg.size() * 4));
  for (size_t i = 0; i < dg.size(); ++i)
    ASSERT_NEAR(dg[i], cl.dlogits()[i], 1e-6) << i;
  labels[3] = 12;
  TALLY_ASSERT_OK(p.gpu()->CopyFromHost(lg.data(), labels.data(), batch * 4));
  EXPECT_THAT(
      gl.Compute(Tensor{logits.g.data(), {batch, classes}}, lg.data(), 1.0f),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label")));
  // The error was reported once; the device works on.
  labels[3] = 1;
  TALLY_ASSERT_OK(p.gpu()->CopyFromHost(lg.data(), labels.data(), batch * 4));
  EXPECT_TRUE(
      gl.Compute(Tensor{logits.g.data(), {batch, classes}}, lg.data(), 1.0f)
          .ok());
}

std::vector<LayerConfig> Cnn() {
  std::vector<LayerConfig> l(6);
  l[0].type = LayerType::kConv2d;
  l[0].in_channels = 1;
  l[0].out_channels = 10;
  l[0].kernel_size = 5;
  l[1].type = LayerType::kReLU;
  l[2].type = LayerType::kMaxPool2d;
  l[2].kernel_size = 2;
  l[3].type = LayerType::kFlatten;
  l[4].type = LayerType::kDropout;
  l[4].p = 0.2;
  l[5].type = LayerType::kLinear;
  l[5].in_features = 1440;
  l[5].out_features = 10;
  return l;
}

// `batch` random 28 x 28 images in [0, 1) and labels of 10 classes.
struct ImageBatch {
  std::vector<float> x;
  std::vector<int32_t> y;
};
ImageBatch RandomImages(int batch, uint64_t seed) {
  Rng rng(seed);
  ImageBatch b{std::vector<float>(batch * 784), std::vector<int32_t>(batch)};
  for (float& v : b.x) v = rng.Uniform(0, 1);
  for (int& v : b.y) v = static_cast<int>(rng.Below(10));
  return b;
}

// A whole data-parallel step on GPU replicas against cpu:1, then (weights
// streamed in anew every step) ten SGD steps.
void ExpectEngineMatchesCpu(EngineOptions go, const std::string& what) {
  const int batch = 50;
  auto [x, y] = RandomImages(batch, 13);
  auto layout = ComputeLayout(Cnn(), {1, 28, 28});
  std::vector<float> init = InitParams(Cnn(), *layout, 5);
  EngineOptions co;
  auto cpu = Engine::Create(Cnn(), {1, 28, 28}, co);
  auto gpu = Engine::Create(Cnn(), {1, 28, 28}, go);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
  std::copy(init.begin(), init.end(), (*cpu)->params());
  std::copy(init.begin(), init.end(), (*gpu)->params());
  BatchView view{x.data(), y.data(), batch};
  auto a = (*cpu)->Step(view, 3);
  auto b = (*gpu)->Step(view, 3);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_NEAR(a->loss_sum, b->loss_sum, 1e-3 * (1 + a->loss_sum));
  for (int64_t i = 0; i < (*cpu)->num_params(); ++i) {
    ASSERT_NEAR((*gpu)->grads()[i], (*cpu)->grads()[i],
                1e-4f + 1e-3f * std::fabs((*cpu)->grads()[i]))
        << what << " gradient " << i;
  }
  for (int step = 0; step < 10; ++step) {
    for (Engine* e : {cpu->get(), gpu->get()}) {
      auto s = e->Step(view, 10 + step, [&](int, int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          e->params()[i] -= 0.05f * e->grads()[i];
      });
      ASSERT_TRUE(s.ok()) << what << ": " << s.status();
    }
  }
  for (int64_t i = 0; i < (*cpu)->num_params(); ++i) {
    ASSERT_NEAR((*gpu)->params()[i], (*cpu)->params()[i],
                1e-4f + 1e-3f * std::fabs((*cpu)->params()[i]))
        << what << " weight " << i << " after ten steps";
  }
}

EngineOptions Gpus(const std::string& spec) {
  EngineOptions o;
  o.devices = *ParseDevices(spec);
  return o;
}

TEST(CudaEngineTest, TrainingStepOnOneGpuMatchesCpu) {
  REQUIRE_GPUS(1);
  ExpectEngineMatchesCpu(Gpus("cuda:0"), "cuda:0");
}

// One GPU hands on each layer's gradient as its copy to host memory lands
// (the job runner pushes it from there while the GPU computes the layers
// before it): the last layer first, each range final when reported.
TEST(CudaEngineTest, OneGpuReportsEachLayersGradientOnceItLands) {
  REQUIRE_GPUS(1);
  const int batch = 64;
  auto [x, y] = RandomImages(batch, 21);
  auto layout = ComputeLayout(Cnn(), {1, 28, 28});
  std::vector<float> init = InitParams(Cnn(), *layout, 7);
  auto cpu = Engine::Create(Cnn(), {1, 28, 28}, EngineOptions{});
  auto gpu = Engine::Create(Cnn(), {1, 28, 28}, Gpus("cuda:0"));
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
  Engine& g = **gpu;
  const int64_t n = g.num_params();
  std::copy(init.begin(), init.end(), (*cpu)->params());
  std::fill(g.params(), g.params() + n, std::nanf(""));  // arrives per layer
  std::vector<std::pair<int64_t, int64_t>> asked, reported;
  std::vector<float> seen(n, std::nanf(""));
  StepHooks h;
  h.params_ready = [&](int64_t b, int64_t e) {
    asked.push_back({b, e});
    std::copy(init.begin() + b, init.begin() + e, g.params() + b);
    return absl::OkStatus();
  };
  h.grads_ready = [&](int64_t b, int64_t e) {
    reported.push_back({b, e});
    std::copy(g.grads() + b, g.grads() + e, seen.begin() + b);
  };
  BatchView view{x.data(), y.data(), batch};
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    asked.clear();
    reported.clear();
    std::fill(seen.begin(), seen.end(), std::nanf(""));
    // Poisoned: a range read before its copy landed shows.
    float* grads = const_cast<float*>(g.grads());
    std::fill(grads, grads + n, std::nanf(""));
    auto a = (*cpu)->Step(view, 3 + step);
    auto b = g.Step(view, 3 + step, {}, &h);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status();
    // Two layers with parameters: the convolution, then the linear layer.
    ASSERT_EQ(asked.size(), 2u);
    EXPECT_EQ(asked[0].first, 0);
    ASSERT_EQ(reported.size(), 2u);
    EXPECT_EQ(reported[0], asked[1]);
    EXPECT_EQ(reported[1], asked[0]);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&seen[i], g.grads() + i, 4), 0) << i;
      ASSERT_NEAR(seen[i], (*cpu)->grads()[i],
                  1e-4f + 1e-3f * std::fabs((*cpu)->grads()[i]))
          << "gradient " << i;
    }
    // New weights for the next step, on both sides.
    for (int64_t i = 0; i < n; ++i) {
      init[i] -= 0.1f * (*cpu)->grads()[i];
      (*cpu)->params()[i] = init[i];
    }
  }
}

TEST(CudaEngineTest, MultiGpuReductionMatchesCpuSum) {
  REQUIRE_GPUS(2);
  ExpectEngineMatchesCpu(Gpus("cuda:all"), "cuda:all");
}

// Two replicas on one GPU (two streams) exercise the peer-copy all-reduce
// and the multi-replica path on a machine with a single GPU.
TEST(CudaEngineTest, TwoReplicasOnOneGpuReduceByPeerCopies) {
  REQUIRE_GPUS(1);
  EngineOptions o;
  o.devices = {{DeviceType::kCuda, 0}, {DeviceType::kCuda, 0}};
  o.force_peer_reduction = true;
  ExpectEngineMatchesCpu(o, "cuda:0 twice, peer copies");
}

TEST(CudaEngineTest, EveryGpuReducesByPeerCopiesWithoutNccl) {
  REQUIRE_GPUS(2);
  EngineOptions o = Gpus("cuda:all");
  o.force_peer_reduction = true;
  ExpectEngineMatchesCpu(o, "cuda:all, peer copies");
}

// NCCL refuses one GPU listed twice ("Duplicate GPU detected"), and is
// absent on some machines: either way CreateCollective falls back to peer
// copies and says why.
TEST(CudaCollectiveTest, OneGpuTwiceFallsBackToPeerCopiesAndSaysWhy) {
  REQUIRE_GPUS(1);
  auto a = OpenDevice({DeviceType::kCuda, 0});
  auto b = OpenDevice({DeviceType::kCuda, 0});
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  std::string why;
  auto c = CreateCollective({a->get(), b->get()}, absl::Seconds(60), &why);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_STREQ((*c)->name(), "peer");
  EXPECT_FALSE(why.empty());
}

// The peer all-reduce alone: every GPU (or GPU 0 twice) against the CPU sum.
TEST(CudaCollectiveTest, PeerAllReduceMatchesCpuSum) {
  REQUIRE_GPUS(1);
  const int k = std::max(2, GpuCount());
  const int64_t n = 1 << 20;
  std::vector<std::unique_ptr<Device>> devs;
  std::vector<Device*> raw;
  std::vector<DeviceBuffer<float>> bufs;
  std::vector<float> want(n, 0.0f);
  for (int r = 0; r < k; ++r) {
    auto d = OpenDevice({DeviceType::kCuda, GpuCount() > 1 ? r : 0});
    ASSERT_TRUE(d.ok()) << d.status();
    devs.push_back(*std::move(d));
    raw.push_back(devs.back().get());
    std::vector<float> v = Random(n, 40 + r);
    for (int64_t i = 0; i < n; ++i) want[i] += v[i];
    bufs.push_back(*DeviceBuffer<float>::Create(raw.back(), n));
    TALLY_ASSERT_OK(raw.back()->CopyFromHost(bufs.back().data(), v.data(),
                                             n * sizeof(float)));
  }
  auto group = CreatePeerCollective(raw, absl::Seconds(60));
  std::vector<absl::Status> status(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back(
        [&, r] { status[r] = group->AllReduceSum(r, bufs[r].data(), n); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < k; ++r) {
    TALLY_ASSERT_OK(status[r]);
    std::vector<float> got(n);
    TALLY_ASSERT_OK(
        raw[r]->CopyToHost(got.data(), bufs[r].data(), n * sizeof(float)));
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f) << "rank " << r << " at " << i;
  }
}

}  // namespace
}  // namespace tally
