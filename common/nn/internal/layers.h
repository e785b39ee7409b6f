// Layer implementations behind Sequential. Internal to common/nn.
#ifndef TALLY_COMMON_NN_INTERNAL_LAYERS_H_
#define TALLY_COMMON_NN_INTERNAL_LAYERS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "common/device.h"
#include "common/kernels.h"
#include "common/nn/layer_config.h"
#include "common/tensor.h"

namespace tally::internal {

struct ForwardContext {
  bool training = false;
  uint64_t seed = 0;          // dropout stream of this layer
  int64_t sample_offset = 0;  // index of x's first sample in the whole batch
};

// One layer of a Sequential. Forward receives the input view and an output
// view backed by a buffer the model owns (a layer may instead point the
// output at its input, as flatten does). Backward receives what Forward saw
// and writes dx unless dx is null (the model's first layer has no input
// gradient to compute). Parameter gradients are overwritten, not summed.
class Layer {
 public:
  virtual ~Layer() = default;

  // Points the layer at its slices of the flat parameter and gradient
  // vectors (device memory, owned by the model).
  virtual void Bind(const float* /*params*/, float* /*grads*/) {}
  // Makes sure per-batch scratch (argmax, masks) fits `batch` samples of
  // per-sample input shape `in` and output shape `out`.
  virtual absl::Status Reserve(Device* /*device*/, int /*batch*/,
                               const Shape& /*in*/, const Shape& /*out*/) {
    return absl::OkStatus();
  }
  virtual void Forward(Kernels& k, const Tensor& x, Tensor* y,
                       const ForwardContext& ctx) = 0;
  virtual void Backward(Kernels& k, const Tensor& x, const Tensor& y,
                        const Tensor& dy, Tensor* dx) = 0;
  // True when Forward only re-labels its input (no output buffer needed).
  virtual bool IsView(bool /*training*/) const { return false; }
  // True when Forward may write its output over its input and Backward
  // needs only the output (ReLU): the model then saves a buffer pass.
  virtual bool CanRunInPlace() const { return false; }
  // True when Backward reads only x, never y (so y may be overwritten by a
  // following in-place layer).
  virtual bool BackwardNeedsOutput() const { return false; }
};

std::unique_ptr<Layer> MakeLayer(const LayerConfig& config);

}  // namespace tally::internal

#endif  // TALLY_COMMON_NN_INTERNAL_LAYERS_H_
