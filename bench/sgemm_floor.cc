// The floor under a standalone MLP step on the CPU: the step's GEMMs, and
// the same GEMMs with the simplest loops that make them a training step.
//
// For layers N0-N1-...-Nk (Linear layers with bias, ReLU between them,
// softmax cross-entropy at the end) and batch B, one step is
//   forward   y_i = x_i W_i^T + b_i                 k GEMMs
//   backward  dW_i = dy_i^T x_i; dx_i = dy_i W_i    k + (k - 1) GEMMs
//   update    SGD with momentum over every parameter
// on random inputs that stay in cache as a real batch would not. Two floors:
//   gemm  the 2k - 1 + k GEMMs alone (OpenBLAS, as the worker calls it)
//   step  those GEMMs with plain loops for bias, ReLU, the loss, the bias
//         gradients and the update: what a hand-written step would cost
// Nothing is read from disk and no batch is loaded or shuffled: a real
// trainer is slower than `step` by what those cost.
//
//   tally-bench-sgemm-floor --layers=784,256,128,10 --batch=64 --steps=938
// prints one JSON object: samples_per_sec of each floor, and the GEMM count.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, layers, "784,256,128,10",
          "widths of the MLP, input first");
ABSL_FLAG(int, batch, 64, "samples per step");
ABSL_FLAG(int, steps, 938, "timed steps (938: one Fashion-MNIST epoch)");
ABSL_FLAG(int, warmup, 50, "untimed steps first");

namespace {

struct Layer {
  int in = 0, out = 0;
  std::vector<float> w, b, dw, db, vw, vb;  // weights, grads, momentum
  std::vector<float> y, dy;                 // output [B, out] and its grad
};

void Gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb,
              beta, c, ldc);
}

class Mlp {
 public:
  Mlp(const std::vector<int>& widths, int batch) : batch_(batch) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      Layer l;
      l.in = widths[i];
      l.out = widths[i + 1];
      l.w.resize(static_cast<size_t>(l.in) * l.out);
      for (float& v : l.w) v = normal(rng);
      l.b.assign(l.out, 0.0f);
      l.dw.assign(l.w.size(), 0.0f);
      l.db.assign(l.out, 0.0f);
      l.vw.assign(l.w.size(), 0.0f);
      l.vb.assign(l.out, 0.0f);
      l.y.assign(static_cast<size_t>(batch) * l.out, 0.0f);
      l.dy.assign(l.y.size(), 0.0f);
      layers_.push_back(std::move(l));
    }
    x_.resize(static_cast<size_t>(batch) * widths[0]);
    for (float& v : x_) v = normal(rng) * 20.0f;
    labels_.resize(batch);
    for (int i = 0; i < batch; ++i) labels_[i] = i % widths.back();
  }

  int gemms_per_step() const {
    return static_cast<int>(3 * layers_.size() - 1);
  }

  // One step: GEMMs only (the floor), or the whole step with plain loops.
  void Step(bool whole) {
    const int n = static_cast<int>(layers_.size());
    const int B = batch_;
    for (int i = 0; i < n; ++i) {
      Layer& l = layers_[i];
      const float* x = i == 0 ? x_.data() : layers_[i - 1].y.data();
      if (whole) {
        for (int r = 0; r < B; ++r)
          std::copy(l.b.begin(), l.b.end(), l.y.begin() + r * l.out);
      }
      Gemm(false, true, B, l.out, l.in, x, l.in, l.w.data(), l.in,
           whole ? 1.0f : 0.0f, l.y.data(), l.out);
      if (whole && i + 1 < n) {
        for (float& v : l.y) v = std::max(v, 0.0f);
      }
    }
    if (whole) Loss();
    for (int i = n - 1; i >= 0; --i) {
      Layer& l = layers_[i];
      const float* x = i == 0 ? x_.data() : layers_[i - 1].y.data();
      Gemm(true, false, l.out, l.in, B, l.dy.data(), l.out, x, l.in, 0.0f,
           l.dw.data(), l.in);
      if (whole) {
        std::fill(l.db.begin(), l.db.end(), 0.0f);
        for (int r = 0; r < B; ++r)
          for (int c = 0; c < l.out; ++c) l.db[c] += l.dy[r * l.out + c];
      }
      if (i > 0) {
        Layer& prev = layers_[i - 1];
        Gemm(false, false, B, l.in, l.out, l.dy.data(), l.out, l.w.data(),
             l.in, 0.0f, prev.dy.data(), l.in);
        if (whole) {  // ReLU's gradient
          for (size_t j = 0; j < prev.dy.size(); ++j)
            if (prev.y[j] <= 0.0f) prev.dy[j] = 0.0f;
        }
      }
    }
    if (whole) {
      for (Layer& l : layers_) {
        Sgd(&l.w, l.dw, &l.vw);
        Sgd(&l.b, l.db, &l.vb);
      }
    }
  }

 private:
  // Softmax cross-entropy's gradient (mean over the batch) into the last
  // layer's dy.
  void Loss() {
    Layer& l = layers_.back();
    for (int r = 0; r < batch_; ++r) {
      const float* z = &l.y[r * l.out];
      float* g = &l.dy[r * l.out];
      const float m = *std::max_element(z, z + l.out);
      float sum = 0.0f;
      for (int c = 0; c < l.out; ++c) sum += g[c] = std::exp(z[c] - m);
      for (int c = 0; c < l.out; ++c)
        g[c] = (g[c] / sum - (c == labels_[r] ? 1.0f : 0.0f)) / batch_;
    }
  }

  static void Sgd(std::vector<float>* p, const std::vector<float>& g,
                  std::vector<float>* v) {
    const float lr = 0.01f, momentum = 0.9f;
    for (size_t j = 0; j < p->size(); ++j) {
      (*v)[j] = momentum * (*v)[j] + g[j];
      (*p)[j] -= lr * (*v)[j];
    }
  }

  int batch_;
  std::vector<Layer> layers_;
  std::vector<float> x_;
  std::vector<int> labels_;
};

double SamplesPerSec(Mlp* mlp, bool whole, int warmup, int steps, int batch) {
  for (int s = 0; s < warmup; ++s) mlp->Step(whole);
  const absl::Time began = absl::Now();
  for (int s = 0; s < steps; ++s) mlp->Step(whole);
  return static_cast<double>(steps) * batch /
         absl::ToDoubleSeconds(absl::Now() - began);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> widths;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_layers), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(w, &v) || v <= 0) {
      std::fprintf(stderr, "--layers: %s is not a width\n",
                   std::string(w).c_str());
      return 2;
    }
    widths.push_back(v);
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  const int steps = absl::GetFlag(FLAGS_steps);
  if (widths.size() < 2 || batch <= 0 || steps <= 0) {
    std::fprintf(stderr, "need two widths or more, and a batch and steps > 0\n");
    return 2;
  }
  Mlp mlp(widths, batch);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const double gemm = SamplesPerSec(&mlp, false, warmup, steps, batch);
  const double step = SamplesPerSec(&mlp, true, warmup, steps, batch);
  std::printf(
      "{\"gemms_per_step\": %d, \"gemm_samples_per_sec\": %.1f, "
      "\"step_samples_per_sec\": %.1f}\n",
      mlp.gemms_per_step(), gemm, step);
  return 0;
}
