#include "common/nn/sequential.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/nn/internal/layers.h"
#include "common/status_macros.h"

namespace tally {

Sequential::Sequential(std::vector<LayerConfig> configs, Shape input_shape,
                       ModelLayout layout, Device* device)
    : configs_(std::move(configs)),
      input_shape_(std::move(input_shape)),
      layout_(std::move(layout)),
      device_(device) {}

Sequential::~Sequential() = default;

absl::StatusOr<std::unique_ptr<Sequential>> Sequential::Create(
    const std::vector<LayerConfig>& layers, const Shape& input_shape,
    Device* device) {
  TALLY_ASSIGN_OR_RETURN(ModelLayout layout,
                         ComputeLayout(layers, input_shape));
  std::unique_ptr<Sequential> m(
      new Sequential(layers, input_shape, std::move(layout), device));
  TALLY_ASSIGN_OR_RETURN(
      m->params_, DeviceBuffer<float>::Create(device, m->layout_.num_params));
  TALLY_ASSIGN_OR_RETURN(
      m->grads_, DeviceBuffer<float>::Create(device, m->layout_.num_params));
  device->kernels().Fill(m->params_.data(), m->layout_.num_params, 0.0f);
  device->kernels().Fill(m->grads_.data(), m->layout_.num_params, 0.0f);
  // Bind each layer to its parameter slice; params of layer i are contiguous.
  size_t next_param = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    m->layers_.push_back(internal::MakeLayer(layers[i]));
    m->param_ranges_.emplace_back(0, 0);
    const std::string prefix = absl::StrCat(i, ".");
    if (next_param < m->layout_.params.size() &&
        m->layout_.params[next_param].name.rfind(prefix, 0) == 0) {
      const int64_t off = m->layout_.params[next_param].offset;
      m->layers_.back()->Bind(m->params_.data() + off, m->grads_.data() + off);
      int64_t end = off;
      while (next_param < m->layout_.params.size() &&
             m->layout_.params[next_param].name.rfind(prefix, 0) == 0) {
        const ParamInfo& p = m->layout_.params[next_param];
        end = p.offset + p.numel;
        ++next_param;
      }
      m->param_ranges_.back() = {off, end};
    }
  }
  m->first_learning_ = static_cast<size_t>(
      std::find_if(m->param_ranges_.begin(), m->param_ranges_.end(),
                   [](const auto& r) { return r.second > r.first; }) -
      m->param_ranges_.begin());
  m->inputs_.resize(layers.size());
  m->outputs_.resize(layers.size());
  m->acts_.resize(layers.size());
  return m;
}

absl::Status Sequential::Reserve(int batch) {
  if (batch <= capacity_) return absl::OkStatus();
  int64_t max_in = NumElements(input_shape_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Shape& in = i == 0 ? input_shape_ : layout_.activation_shapes[i - 1];
    const Shape& out = layout_.activation_shapes[i];
    max_in = std::max(max_in, NumElements(in));
    TALLY_RETURN_IF_ERROR(layers_[i]->Reserve(device_, batch, in, out));
    acts_[i].Reset();
    TALLY_ASSIGN_OR_RETURN(
        acts_[i], DeviceBuffer<float>::Create(
                      device_, static_cast<size_t>(batch) * NumElements(out)));
  }
  grad_ping_.Reset();
  grad_pong_.Reset();
  TALLY_ASSIGN_OR_RETURN(grad_ping_,
                         DeviceBuffer<float>::Create(device_, batch * max_in));
  TALLY_ASSIGN_OR_RETURN(grad_pong_,
                         DeviceBuffer<float>::Create(device_, batch * max_in));
  capacity_ = batch;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Sequential::Forward(const float* x, int batch,
                                           bool training, uint64_t seed,
                                           int64_t sample_offset,
                                           const ParamHooks* hooks) {
  if (batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Forward needs a positive batch, got ", batch));
  }
  TALLY_RETURN_IF_ERROR(Reserve(batch));
  Kernels& k = device_->kernels();
  Tensor cur;
  cur.data = const_cast<float*>(x);
  cur.shape = {batch};
  cur.shape.insert(cur.shape.end(), input_shape_.begin(), input_shape_.end());
  for (size_t i = 0; i < layers_.size(); ++i) {
    Tensor out;
    out.shape = {batch};
    const Shape& s = layout_.activation_shapes[i];
    out.shape.insert(out.shape.end(), s.begin(), s.end());
    out.data = acts_[i].data();
    // ReLU over an activation of ours (not the caller's input) whose layer
    // does not need its output for backward: run in place, one pass less.
    if (i > 0 && layers_[i]->CanRunInPlace() &&
        !layers_[i - 1]->BackwardNeedsOutput() &&
        !layers_[i - 1]->IsView(training)) {
      out.data = cur.data;
    }
    // Each layer gets its own dropout stream.
    internal::ForwardContext ctx{training, seed * 1000003ULL + i,
                                 sample_offset};
    const auto [pb, pe] = param_ranges_[i];
    if (hooks != nullptr && hooks->before_forward && pe > pb) {
      if (absl::Status s = hooks->before_forward(pb, pe); !s.ok()) {
        // The layers before this one are in flight, reading the caller's
        // weights: let them finish before the caller changes those.
        device_->Synchronize().IgnoreError();
        return s;
      }
    }
    layers_[i]->Forward(k, cur, &out, ctx);
    inputs_[i] = cur;
    outputs_[i] = out;
    cur = out;
  }
  last_forward_training_ = training;
  return cur;
}

absl::Status Sequential::Backward(const float* dout, float* dinput,
                                  const ParamHooks* hooks) {
  if (!last_forward_training_ || layers_.empty() ||
      outputs_.back().data == nullptr) {
    return absl::FailedPreconditionError(
        "Backward needs a preceding training Forward");
  }
  Kernels& k = device_->kernels();
  auto gradient_done = [&](size_t j) -> absl::Status {
    const auto [pb, pe] = param_ranges_[j];
    if (hooks == nullptr || !hooks->after_backward || pe == pb)
      return absl::OkStatus();
    return hooks->after_backward(pb, pe);
  };
  Tensor dy;
  dy.data = const_cast<float*>(dout);
  dy.shape = outputs_.back().shape;
  absl::Status hook_status;
  for (size_t j = layers_.size(); j-- > 0 && hook_status.ok();) {
    if (dinput == nullptr && j <= first_learning_) {
      // Only parameter gradients are needed here, and nothing below.
      if (j == first_learning_) {
        layers_[j]->Backward(k, inputs_[j], outputs_[j], dy, nullptr);
        hook_status = gradient_done(j);
      }
      break;
    }
    if (j == 0) {
      Tensor dx;
      dx.shape = inputs_[0].shape;
      dx.data = dinput;
      layers_[0]->Backward(k, inputs_[0], outputs_[0], dy, &dx);
      hook_status = gradient_done(0);
      // A view layer (flatten) hands back dy itself.
      if (dx.data != dinput) k.Copy(dx.data, dinput, dx.numel());
      break;
    }
    Tensor dx;
    dx.shape = inputs_[j].shape;
    dx.data =
        dy.data == grad_ping_.data() ? grad_pong_.data() : grad_ping_.data();
    layers_[j]->Backward(k, inputs_[j], outputs_[j], dy, &dx);
    hook_status = gradient_done(j);
    dy = dx;
  }
  if (hook_status.ok() && hooks != nullptr && hooks->backward_enqueued)
    hook_status = hooks->backward_enqueued();
  // Wait for the device even when a hook failed: its work is in flight.
  absl::Status sync = device_->Synchronize();
  TALLY_RETURN_IF_ERROR(hook_status);
  return sync;
}

}  // namespace tally
