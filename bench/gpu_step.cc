// Step time of a large MLP on one GPU against cuBLAS alone.
//
// Model: 4 linear layers of 4096 x 4096 with ReLU between, batch 1024,
// softmax cross-entropy. One Tally step = forward, loss, backward (no
// optimizer). The reference runs only the step's matrix products with
// cublasSgemm on the same GPU: 4 forward, 4 weight-gradient and 3
// input-gradient GEMMs (the first layer needs no input gradient).
//
// It also times what a worker does per step: Engine::Step from host memory
// (weights streamed in per layer, the batch copied in, gradients streamed
// out per layer, all beside the compute), against the transfers alone
// (the same bytes through pinned buffers, one after another). An engine step
// shorter than compute + transfers is the overlap at work. With the job
// runner's StepHooks it also says when the first gradient (the last
// layer's) is handed on to the push, against the step's end.
//   tally-bench-gpu-step [--steps=20] [--batch=1024] [--width=4096] [--tf32]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "common/device.h"
#include "common/nn/loss.h"
#include "common/nn/sequential.h"
#include "common/random.h"
#include "worker/engine.h"

ABSL_FLAG(int, steps, 20, "timed steps");
ABSL_FLAG(int, batch, 1024, "batch size");
ABSL_FLAG(int, width, 4096, "layer width");
ABSL_FLAG(bool, tf32, false, "allow TF32 tensor cores (both sides)");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tally-bench-gpu-step: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps),
            batch = absl::GetFlag(FLAGS_batch);
  const int w = absl::GetFlag(FLAGS_width);
  const bool tf32 = absl::GetFlag(FLAGS_tf32);
  auto ids = tally::ParseDevices("cuda:0");
  if (!ids.ok()) return Fail(ids.status());
  auto dev = tally::OpenDevice((*ids)[0]);
  if (!dev.ok()) return Fail(dev.status());
  (*dev)->SetAllowTf32(tf32);
  std::vector<tally::LayerConfig> layers;
  for (int i = 0; i < 4; ++i) {
    tally::LayerConfig l;
    l.type = tally::LayerType::kLinear;
    l.in_features = w;
    l.out_features = w;
    layers.push_back(l);
    if (i < 3) {
      tally::LayerConfig r;
      r.type = tally::LayerType::kReLU;
      layers.push_back(r);
    }
  }
  auto model = tally::Sequential::Create(layers, {w}, dev->get());
  if (!model.ok()) return Fail(model.status());
  auto layout = tally::ComputeLayout(layers, {w});
  std::vector<float> init = tally::InitParams(layers, *layout, 1);
  if (auto s = (*dev)->CopyFromHost((*model)->params(), init.data(),
                                    init.size() * 4);
      !s.ok()) {
    return Fail(s);
  }
  tally::Rng rng(2);
  std::vector<float> x(static_cast<size_t>(batch) * w);
  for (float& v : x) v = rng.Uniform(-1, 1);
  std::vector<int32_t> y(batch);
  for (int& v : y) v = static_cast<int>(rng.Below(w));
  auto dx = *tally::DeviceBuffer<float>::Create(dev->get(), x.size());
  auto dy = *tally::DeviceBuffer<int32_t>::Create(dev->get(), batch);
  (*dev)->CopyFromHost(dx.data(), x.data(), x.size() * 4).IgnoreError();
  (*dev)->CopyFromHost(dy.data(), y.data(), y.size() * 4).IgnoreError();
  tally::CrossEntropyLoss loss(dev->get());
  auto step = [&]() -> absl::Status {
    auto logits = (*model)->Forward(dx.data(), batch, true);
    if (!logits.ok()) return logits.status();
    auto st = loss.Compute(*logits, dy.data(), 1.0f / batch);
    if (!st.ok()) return st.status();
    if (auto s = (*model)->Backward(loss.dlogits()); !s.ok()) return s;
    return (*dev)->Synchronize();
  };
  for (int i = 0; i < 3; ++i) {
    if (auto s = step(); !s.ok()) return Fail(s);
  }
  absl::Time t0 = absl::Now();
  for (int i = 0; i < steps; ++i) {
    if (auto s = step(); !s.ok()) return Fail(s);
  }
  const double tally_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / steps;

  // cuBLAS alone: the same 11 GEMM shapes, on buffers of the same sizes.
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
  float *a, *b, *c;
  cudaMalloc(&a, sizeof(float) * batch * w);
  cudaMalloc(&b, sizeof(float) * w * w);
  cudaMalloc(&c, sizeof(float) * std::max(batch, w) * w);
  const float one = 1.0f, zero = 0.0f;
  auto gemms = [&] {
    for (int l = 0; l < 4; ++l) {  // forward: [B, w] x [w, w]^T
      cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, w, batch, w, &one, b, w, a, w,
                  &zero, c, w);
    }
    for (int l = 0; l < 4; ++l) {  // weight gradient: [w, B] x [B, w]
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, w, w, batch, &one, a, w, a, w,
                  &zero, c, w);
    }
    for (int l = 0; l < 3; ++l) {  // input gradient: [B, w] x [w, w]
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, w, batch, w, &one, b, w, a, w,
                  &zero, c, w);
    }
  };
  for (int i = 0; i < 3; ++i) gemms();
  cudaDeviceSynchronize();
  t0 = absl::Now();
  for (int i = 0; i < steps; ++i) gemms();
  cudaDeviceSynchronize();
  const double cublas_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / steps;
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cublasDestroy(h);

  // The worker's step from host memory, and its transfers alone.
  tally::EngineOptions eo;
  eo.devices = *ids;
  eo.allow_tf32 = tf32;
  auto engine = tally::Engine::Create(layers, {w}, eo);
  if (!engine.ok()) return Fail(engine.status());
  std::copy(init.begin(), init.end(), (*engine)->params());
  const tally::BatchView view{x.data(), y.data(), batch};
  for (int i = 0; i < 3; ++i) {
    if (auto s = (*engine)->Step(view, i); !s.ok()) return Fail(s.status());
  }
  t0 = absl::Now();
  for (int i = 0; i < steps; ++i) {
    if (auto s = (*engine)->Step(view, i); !s.ok()) return Fail(s.status());
  }
  const double engine_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / steps;
  // The same step with StepHooks, as the job runner pushes from: when the
  // last layer's gradient is handed on (its copy landed), from the step's
  // start. Well before the step's end is the push overlapping backward.
  double first_ms = 0, hooked_ms = 0;
  for (int i = 0; i < steps; ++i) {
    absl::Time began = absl::Now(), first = absl::InfiniteFuture();
    tally::StepHooks hooks;
    hooks.grads_ready = [&](int64_t, int64_t) {
      first = std::min(first, absl::Now());
    };
    if (auto s = (*engine)->Step(view, i, {}, &hooks); !s.ok())
      return Fail(s.status());
    if (first == absl::InfiniteFuture())
      return Fail(absl::InternalError("the step reported no gradient"));
    hooked_ms += absl::ToDoubleMilliseconds(absl::Now() - began) / steps;
    first_ms += absl::ToDoubleMilliseconds(first - began) / steps;
  }
  const int64_t n = (*engine)->num_params();
  auto pinned = (*dev)->AllocateHost(n * sizeof(float));
  if (!pinned.ok()) return Fail(pinned.status());
  auto copy_once = [&]() -> absl::Status {
    if (auto s = (*dev)->CopyFromHost((*model)->params(), *pinned, n * 4);
        !s.ok())
      return s;
    if (auto s = (*dev)->CopyFromHost(dx.data(), x.data(), x.size() * 4);
        !s.ok())
      return s;
    return (*dev)->CopyToHost(*pinned, (*model)->grads(), n * 4);
  };
  if (auto s = copy_once(); !s.ok()) return Fail(s);
  t0 = absl::Now();
  for (int i = 0; i < steps; ++i) {
    if (auto s = copy_once(); !s.ok()) return Fail(s);
  }
  const double copy_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / steps;
  (*dev)->FreeHost(*pinned);

  const double flops = 11.0 * 2.0 * batch * static_cast<double>(w) * w;
  std::printf(
      "{\"batch\": %d, \"width\": %d, \"tf32\": %s, \"tally_step_ms\": %.3f, "
      "\"cublas_gemms_ms\": %.3f, \"tally_over_cublas\": %.3f, "
      "\"tally_tflops\": %.2f, \"cublas_tflops\": %.2f, "
      "\"engine_step_from_host_ms\": %.3f, \"transfers_alone_ms\": %.3f, "
      "\"compute_plus_transfers_ms\": %.3f, \"hooked_step_ms\": %.3f, "
      "\"first_gradient_handed_on_ms\": %.3f}\n",
      batch, w, tf32 ? "true" : "false", tally_ms, cublas_ms,
      tally_ms / cublas_ms, flops / tally_ms / 1e9, flops / cublas_ms / 1e9,
      engine_ms, copy_ms, tally_ms + copy_ms, hooked_ms, first_ms);
  return 0;
}
