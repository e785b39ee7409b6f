#include "common/nn/internal/layers.h"

#include <utility>

namespace tally::internal {
namespace {

class Linear final : public Layer {
 public:
  explicit Linear(const LayerConfig& c) : c_(c) {}

  void Bind(const float* params, float* grads) override {
    w_ = params;
    dw_ = grads;
    const int64_t wn = c_.in_features * c_.out_features;
    b_ = c_.bias ? params + wn : nullptr;
    db_ = c_.bias ? grads + wn : nullptr;
  }

  void Forward(Kernels& k, const Tensor& x, Tensor* y,
               const ForwardContext&) override {
    const int batch = static_cast<int>(x.dim(0));
    const int in = static_cast<int>(c_.in_features);
    const int out = static_cast<int>(c_.out_features);
    if (b_ != nullptr) k.BroadcastRows(b_, batch, out, y->data);
    // y[B, out] = x[B, in] * W[out, in]^T (+ y)
    k.Gemm(false, true, batch, out, in, 1.0f, x.data, in, w_, in,
           b_ != nullptr ? 1.0f : 0.0f, y->data, out);
  }

  void Backward(Kernels& k, const Tensor& x, const Tensor&, const Tensor& dy,
                Tensor* dx) override {
    const int batch = static_cast<int>(x.dim(0));
    const int in = static_cast<int>(c_.in_features);
    const int out = static_cast<int>(c_.out_features);
    // dW[out, in] = dy[B, out]^T * x[B, in]
    k.Gemm(true, false, out, in, batch, 1.0f, dy.data, out, x.data, in, 0.0f,
           dw_, in);
    if (db_ != nullptr) k.SumRows(dy.data, batch, out, db_);
    if (dx != nullptr) {
      // dx[B, in] = dy[B, out] * W[out, in]
      k.Gemm(false, false, batch, in, out, 1.0f, dy.data, out, w_, in, 0.0f,
             dx->data, in);
    }
  }

 private:
  LayerConfig c_;
  const float* w_ = nullptr;
  const float* b_ = nullptr;
  float* dw_ = nullptr;
  float* db_ = nullptr;
};

class Conv2d final : public Layer {
 public:
  explicit Conv2d(const LayerConfig& c) : c_(c) {}

  void Bind(const float* params, float* grads) override {
    w_ = params;
    dw_ = grads;
    const int64_t wn =
        c_.out_channels * c_.in_channels * c_.kernel_size * c_.kernel_size;
    b_ = c_.bias ? params + wn : nullptr;
    db_ = c_.bias ? grads + wn : nullptr;
  }

  void Forward(Kernels& k, const Tensor& x, Tensor* y,
               const ForwardContext&) override {
    k.Conv2dForward(Geometry(x), x.data, w_, b_, y->data);
  }

  void Backward(Kernels& k, const Tensor& x, const Tensor&, const Tensor& dy,
                Tensor* dx) override {
    k.Conv2dBackward(Geometry(x), x.data, w_, dy.data, dw_, db_,
                     dx != nullptr ? dx->data : nullptr);
  }

 private:
  Conv2dGeometry Geometry(const Tensor& x) const {
    Conv2dGeometry g;
    g.batch = static_cast<int>(x.dim(0));
    g.in_channels = static_cast<int>(x.dim(1));
    g.in_h = static_cast<int>(x.dim(2));
    g.in_w = static_cast<int>(x.dim(3));
    g.out_channels = static_cast<int>(c_.out_channels);
    g.kernel = static_cast<int>(c_.kernel_size);
    g.stride = static_cast<int>(c_.EffectiveStride());
    g.padding = static_cast<int>(c_.padding);
    return g;
  }

  LayerConfig c_;
  const float* w_ = nullptr;
  const float* b_ = nullptr;
  float* dw_ = nullptr;
  float* db_ = nullptr;
};

class MaxPool2d final : public Layer {
 public:
  explicit MaxPool2d(const LayerConfig& c) : c_(c) {}

  absl::Status Reserve(Device* device, int batch, const Shape&,
                       const Shape& out) override {
    const size_t need = static_cast<size_t>(batch) * NumElements(out);
    if (argmax_.size() >= need) return absl::OkStatus();
    argmax_.Reset();
    auto buf = DeviceBuffer<int32_t>::Create(device, need);
    if (!buf.ok()) return buf.status();
    argmax_ = *std::move(buf);
    return absl::OkStatus();
  }

  void Forward(Kernels& k, const Tensor& x, Tensor* y,
               const ForwardContext&) override {
    k.MaxPool2dForward(Geometry(x), x.data, y->data, argmax_.data());
  }

  void Backward(Kernels& k, const Tensor& x, const Tensor&, const Tensor& dy,
                Tensor* dx) override {
    if (dx != nullptr) {
      k.MaxPool2dBackward(Geometry(x), dy.data, argmax_.data(), dx->data);
    }
  }

 private:
  Pool2dGeometry Geometry(const Tensor& x) const {
    Pool2dGeometry g;
    g.batch = static_cast<int>(x.dim(0));
    g.channels = static_cast<int>(x.dim(1));
    g.in_h = static_cast<int>(x.dim(2));
    g.in_w = static_cast<int>(x.dim(3));
    g.kernel = static_cast<int>(c_.kernel_size);
    g.stride = static_cast<int>(c_.EffectiveStride());
    g.padding = static_cast<int>(c_.padding);
    return g;
  }

  LayerConfig c_;
  DeviceBuffer<int32_t> argmax_;
};

class ReLU final : public Layer {
 public:
  bool CanRunInPlace() const override { return true; }
  bool BackwardNeedsOutput() const override { return true; }
  void Forward(Kernels& k, const Tensor& x, Tensor* y,
               const ForwardContext&) override {
    k.ReluForward(x.data, y->data, x.numel());
  }
  void Backward(Kernels& k, const Tensor&, const Tensor& y, const Tensor& dy,
                Tensor* dx) override {
    if (dx != nullptr) k.ReluBackward(y.data, dy.data, dx->data, dy.numel());
  }
};

class Flatten final : public Layer {
 public:
  bool IsView(bool) const override { return true; }
  void Forward(Kernels&, const Tensor& x, Tensor* y,
               const ForwardContext&) override {
    y->data = x.data;
  }
  void Backward(Kernels&, const Tensor&, const Tensor&, const Tensor& dy,
                Tensor* dx) override {
    if (dx != nullptr) dx->data = dy.data;
  }
};

class Dropout final : public Layer {
 public:
  explicit Dropout(const LayerConfig& c) : p_(static_cast<float>(c.p)) {}

  bool IsView(bool training) const override { return !training || p_ == 0.0f; }

  absl::Status Reserve(Device* device, int batch, const Shape& in,
                       const Shape&) override {
    const size_t need = static_cast<size_t>(batch) * NumElements(in);
    if (p_ == 0.0f || mask_.size() >= need) return absl::OkStatus();
    mask_.Reset();
    auto buf = DeviceBuffer<float>::Create(device, need);
    if (!buf.ok()) return buf.status();
    mask_ = *std::move(buf);
    return absl::OkStatus();
  }

  void Forward(Kernels& k, const Tensor& x, Tensor* y,
               const ForwardContext& ctx) override {
    if (IsView(ctx.training)) {
      y->data = x.data;
      masked_ = false;
      return;
    }
    const int64_t per_sample = x.numel() / x.dim(0);
    k.DropoutForward(x.data, y->data, mask_.data(), x.numel(), p_, ctx.seed,
                     ctx.sample_offset * per_sample);
    masked_ = true;
  }

  void Backward(Kernels& k, const Tensor&, const Tensor&, const Tensor& dy,
                Tensor* dx) override {
    if (dx == nullptr) return;
    if (!masked_) {
      dx->data = dy.data;
      return;
    }
    k.Multiply(dy.data, mask_.data(), dx->data, dy.numel());
  }

 private:
  float p_;
  bool masked_ = false;
  DeviceBuffer<float> mask_;
};

}  // namespace

std::unique_ptr<Layer> MakeLayer(const LayerConfig& c) {
  switch (c.type) {
    case LayerType::kLinear:
      return std::make_unique<Linear>(c);
    case LayerType::kConv2d:
      return std::make_unique<Conv2d>(c);
    case LayerType::kMaxPool2d:
      return std::make_unique<MaxPool2d>(c);
    case LayerType::kReLU:
      return std::make_unique<ReLU>();
    case LayerType::kFlatten:
      return std::make_unique<Flatten>();
    case LayerType::kDropout:
      return std::make_unique<Dropout>(c);
  }
  return nullptr;
}

}  // namespace tally::internal
