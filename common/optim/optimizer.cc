#include "common/optim/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/optim/internal/kernels.h"
#include "common/vectorize.h"

namespace tally {

absl::string_view OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd:
      return "sgd";
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdamW:
      return "adamw";
  }
  return "?";
}

absl::StatusOr<OptimizerType> ParseOptimizerType(absl::string_view name) {
  if (name == "sgd") return OptimizerType::kSgd;
  if (name == "adam") return OptimizerType::kAdam;
  if (name == "adamw") return OptimizerType::kAdamW;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer type '", name, "' (known: sgd, adam, adamw)"));
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  auto bad = [](absl::string_view field, double v, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be ", want, ", got ", v));
  };
  if (!(c.lr >= 0.0) || !std::isfinite(c.lr))
    return bad("lr", c.lr, "a finite number >= 0");
  if (!(c.weight_decay >= 0.0) || !std::isfinite(c.weight_decay)) {
    return bad("weight_decay", c.weight_decay, "a finite number >= 0");
  }
  if (c.warmup_steps < 0 || c.step_size < 1) {
    return absl::InvalidArgumentError(
        "schedule: warmup_steps must be >= 0 and step_size >= 1");
  }
  if (!(c.gamma > 0.0) || !std::isfinite(c.gamma))
    return bad("schedule.gamma", c.gamma, "a finite number > 0");
  if (!(c.min_lr >= 0.0 && c.min_lr <= c.lr))
    return bad("schedule.min_lr", c.min_lr, "in [0, lr]");
  if (!(c.clip_grad_norm >= 0.0) || !std::isfinite(c.clip_grad_norm)) {
    return bad("clip_grad_norm", c.clip_grad_norm, "a finite number >= 0");
  }
  if (c.type == OptimizerType::kSgd) {
    if (!(c.momentum >= 0.0) || !std::isfinite(c.momentum)) {
      return bad("momentum", c.momentum, "a finite number >= 0");
    }
    if (!(c.dampening >= 0.0 && c.dampening <= 1.0)) {
      return bad("dampening", c.dampening, "in [0, 1]");
    }
    if (c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0)) {
      return absl::InvalidArgumentError(
          "nesterov needs momentum > 0 and dampening = 0");
    }
  } else {
    if (!(c.beta1 >= 0.0 && c.beta1 < 1.0))
      return bad("beta1", c.beta1, "in [0, 1)");
    if (!(c.beta2 >= 0.0 && c.beta2 < 1.0))
      return bad("beta2", c.beta2, "in [0, 1)");
    if (!(c.eps >= 0.0) || !std::isfinite(c.eps))
      return bad("eps", c.eps, "a finite number >= 0");
  }
  return absl::OkStatus();
}

namespace optim_internal {

// The update loops live in free functions with restrict pointers and no
// branch inside, so that they vectorise.
//
// SGD rounds as PyTorch's torch.optim.SGD does on the CPU (its single-tensor
// path, whose `add_(x, alpha=a)` is one fused multiply-add, `a * x + y`
// rounded once, and whose `mul_` rounds on its own): the same gradient gives
// the same weights, bit for bit (measured: the ResNet example on one worker,
// python_model test). A model whose training amplifies rounding
// (BatchNorm over small batches: one unit in the last place a step grew to
// 3e-4 relative in 20 steps of a small ResNet) then trains exactly as a
// PyTorch loop does. This file is compiled with -ffp-contract=off, so the
// compiler fuses nothing else; std::fma is an instruction on x86-64-v3 and
// exact (if slower) everywhere.
TALLY_VECTORIZE void SgdPlain(int64_t n, float lr, float wd,
                              float* __restrict p, const float* __restrict g) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = std::fma(p[i], wd, g[i]);  // d_p.add(param, alpha=wd)
    p[i] = std::fma(d, -lr, p[i]);             // param.add_(d_p, alpha=-lr)
  }
}

}  // namespace optim_internal

namespace {

using optim_internal::SgdPlain;

TALLY_VECTORIZE void SgdMomentumFirst(int64_t n, float lr, float wd,
                                      float momentum, bool nesterov,
                                      float* __restrict p,
                                      const float* __restrict g,
                                      float* __restrict buf) {
  // The buffer starts as the first gradient; nesterov then steps by
  // d + momentum * buf, plain momentum by buf.
  for (int64_t i = 0; i < n; ++i) {
    const float d = std::fma(p[i], wd, g[i]);
    buf[i] = d;
    const float step = nesterov ? std::fma(d, momentum, d) : d;
    p[i] = std::fma(step, -lr, p[i]);
  }
}

TALLY_VECTORIZE void SgdMomentum(int64_t n, float lr, float wd, float momentum,
                                 float damp, float* __restrict p,
                                 const float* __restrict g,
                                 float* __restrict buf) {
  const float keep = 1.0f - damp;
  for (int64_t i = 0; i < n; ++i) {
    const float d = std::fma(p[i], wd, g[i]);
    const float kept = buf[i] * momentum;  // buf.mul_(momentum)
    const float b = std::fma(d, keep, kept);  // .add_(d_p, alpha=1 - damp)
    buf[i] = b;
    p[i] = std::fma(b, -lr, p[i]);
  }
}

TALLY_VECTORIZE void SgdNesterov(int64_t n, float lr, float wd, float momentum,
                                 float* __restrict p, const float* __restrict g,
                                 float* __restrict buf) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = std::fma(p[i], wd, g[i]);
    const float b = std::fma(d, 1.0f, buf[i] * momentum);
    buf[i] = b;
    const float step = std::fma(b, momentum, d);  // d_p.add(buf, alpha=m)
    p[i] = std::fma(step, -lr, p[i]);
  }
}

TALLY_VECTORIZE void AdamUpdate(int64_t n, float step_size, float bc2_sqrt,
                                float beta1, float beta2, float eps, float l2,
                                float decay, float* __restrict p,
                                const float* __restrict g, float* __restrict m,
                                float* __restrict v) {
  for (int64_t i = 0; i < n; ++i) {
    const float pi = p[i] * decay;
    const float grad = g[i] + l2 * pi;
    const float mi = m[i] * beta1 + (1.0f - beta1) * grad;
    const float vi = v[i] * beta2 + (1.0f - beta2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
  }
}

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& c, int64_t size)
      : Optimizer(c),
        momentum_(static_cast<float>(c.momentum)),
        dampening_(static_cast<float>(c.dampening)),
        weight_decay_(static_cast<float>(c.weight_decay)),
        nesterov_(c.nesterov),
        size_(size) {
    if (momentum_ != 0.0f) buf_.assign(size, 0.0f);
  }

  void Step(float* p, const float* g) override {
    const bool first = step_ == 0;
    const float lr = static_cast<float>(LrFor(step_));  // the kernels' alpha
    ++step_;
    if (momentum_ == 0.0f) {
      SgdPlain(size_, lr, weight_decay_, p, g);
    } else if (first) {
      SgdMomentumFirst(size_, lr, weight_decay_, momentum_, nesterov_, p, g,
                       buf_.data());
    } else if (nesterov_) {
      SgdNesterov(size_, lr, weight_decay_, momentum_, p, g, buf_.data());
    } else {
      SgdMomentum(size_, lr, weight_decay_, momentum_, dampening_, p, g,
                  buf_.data());
    }
  }

  int64_t size() const override { return size_; }

  OptimizerState SaveState() const override {
    OptimizerState s;
    s.step = step_;
    if (momentum_ != 0.0f) s.slots.push_back(buf_);
    return s;
  }

  absl::Status LoadState(const OptimizerState& s) override {
    const size_t want = momentum_ != 0.0f ? 1 : 0;
    if (s.slots.size() != want ||
        (want == 1 && static_cast<int64_t>(s.slots[0].size()) != size_)) {
      return absl::InvalidArgumentError("SGD state does not match");
    }
    step_ = s.step;
    if (want == 1) buf_ = s.slots[0];
    return absl::OkStatus();
  }

 private:
  float momentum_, dampening_, weight_decay_;
  bool nesterov_;
  int64_t size_;
  int64_t step_ = 0;
  std::vector<float> buf_;
};

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& c, int64_t size)
      : Optimizer(c),
        decoupled_(c.type == OptimizerType::kAdamW),
        beta1_(static_cast<float>(c.beta1)),
        beta2_(static_cast<float>(c.beta2)),
        eps_(static_cast<float>(c.eps)),
        weight_decay_(static_cast<float>(c.weight_decay)),
        size_(size),
        m_(size, 0.0f),
        v_(size, 0.0f) {}

  void Step(float* p, const float* g) override {
    const double lr = LrFor(step_);
    ++step_;
    // PyTorch computes the bias corrections in double (Python floats).
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1_), step_);
    const double bc2 = 1.0 - std::pow(static_cast<double>(beta2_), step_);
    const float step_size = static_cast<float>(lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    // AdamW decays the parameter; Adam adds an L2 term to the gradient.
    const float decay =
        decoupled_ ? static_cast<float>(1.0 - lr * weight_decay_) : 1.0f;
    const float l2 = decoupled_ ? 0.0f : weight_decay_;
    AdamUpdate(size_, step_size, bc2_sqrt, beta1_, beta2_, eps_, l2, decay, p,
               g, m_.data(), v_.data());
  }

  int64_t size() const override { return size_; }

  OptimizerState SaveState() const override {
    OptimizerState s;
    s.step = step_;
    s.slots = {m_, v_};
    return s;
  }

  absl::Status LoadState(const OptimizerState& s) override {
    if (s.slots.size() != 2 ||
        static_cast<int64_t>(s.slots[0].size()) != size_ ||
        static_cast<int64_t>(s.slots[1].size()) != size_) {
      return absl::InvalidArgumentError("Adam state does not match");
    }
    step_ = s.step;
    m_ = s.slots[0];
    v_ = s.slots[1];
    return absl::OkStatus();
  }

 private:
  bool decoupled_;
  float beta1_, beta2_, eps_, weight_decay_;
  int64_t size_;
  int64_t step_ = 0;
  std::vector<float> m_, v_;
};

}  // namespace

double ScheduledLr(const OptimizerConfig& c, int64_t step,
                   int64_t total_steps) {
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / c.warmup_steps;
  }
  const int64_t t = step - c.warmup_steps;
  switch (c.schedule) {
    case OptimizerConfig::Schedule::kConstant:
      return c.lr;
    case OptimizerConfig::Schedule::kStep:
      return c.lr * std::pow(c.gamma, static_cast<double>(t / c.step_size));
    case OptimizerConfig::Schedule::kCosine: {
      const int64_t span = total_steps - c.warmup_steps;
      if (span <= 0) return c.lr;
      const double pi = std::acos(-1.0);
      return c.min_lr + (c.lr - c.min_lr) *
                            (1.0 + std::cos(pi * static_cast<double>(t) /
                                            static_cast<double>(span))) /
                            2.0;
    }
  }
  return c.lr;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerConfig& config, int64_t size) {
  if (absl::Status s = ValidateOptimizerConfig(config); !s.ok()) return s;
  if (size < 0) return absl::InvalidArgumentError("negative optimizer size");
  if (config.type == OptimizerType::kSgd) {
    return std::unique_ptr<Optimizer>(new Sgd(config, size));
  }
  return std::unique_ptr<Optimizer>(new Adam(config, size));
}

}  // namespace tally
