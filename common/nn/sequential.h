// A torch.nn.Sequential replica on one device.
//
// Sequential owns its layers, the flat parameter and gradient vectors and all
// activation buffers, all on one Device (borrowed; it must outlive the model).
// Buffers grow to the largest batch seen and are then reused: a step
// allocates nothing in the steady state.
//
// Not thread-safe: one thread drives a replica. Different replicas (on
// different devices) run concurrently.
#ifndef TALLY_COMMON_NN_SEQUENTIAL_H_
#define TALLY_COMMON_NN_SEQUENTIAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/nn/layer_config.h"
#include "common/tensor.h"

namespace tally {

namespace internal {
class Layer;
}

// Per-layer callbacks that let a caller move one layer's parameters while
// other layers compute (Engine streams GPU weights in and gradients out this
// way). Each gets the layer's range [begin, end) of the flat vectors.
// before_forward runs just before the forward pass of a layer with
// parameters is enqueued; after_backward just after its backward (which
// writes that range of grads()) is. Layers without parameters get no call.
// A non-OK status stops the pass and is returned. Any may be empty.
struct ParamHooks {
  std::function<absl::Status(int64_t begin, int64_t end)> before_forward;
  std::function<absl::Status(int64_t begin, int64_t end)> after_backward;
  // Once the last after_backward is enqueued, before Backward waits for the
  // device: where the hooks' copies can be waited for one by one (a GPU's
  // gradients landing in host memory while earlier layers still compute).
  std::function<absl::Status()> backward_enqueued;
};

class Sequential {
 public:
  // kInvalidArgument when the layers do not chain for `input_shape` (the
  // per-sample shape, without the batch dimension).
  static absl::StatusOr<std::unique_ptr<Sequential>> Create(
      const std::vector<LayerConfig>& layers, const Shape& input_shape,
      Device* device);

  Sequential(const Sequential&) = delete;
  Sequential& operator=(const Sequential&) = delete;
  ~Sequential();

  const ModelLayout& layout() const { return layout_; }
  const Shape& input_shape() const { return input_shape_; }
  int64_t num_params() const { return layout_.num_params; }
  Device* device() const { return device_; }

  // Flat vectors in device memory, layout().num_params floats each.
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

  // Forward pass over `batch` samples at `x` (device memory, the batch's
  // inputs back to back). The returned view stays valid until the next call.
  // `seed` drives dropout masks; `sample_offset` is the index of x's first
  // sample in the whole batch when a batch is split across replicas, so that
  // every split draws the same masks.
  absl::StatusOr<Tensor> Forward(const float* x, int batch, bool training,
                                 uint64_t seed = 0, int64_t sample_offset = 0,
                                 const ParamHooks* hooks = nullptr);

  // Back-propagates `dout` (device memory, shaped like Forward's output)
  // through the last training Forward; overwrites grads(). The input's
  // gradient is computed only when `dinput` (device memory, shaped like the
  // input batch) is given; training never needs it.
  absl::Status Backward(const float* dout, float* dinput = nullptr,
                        const ParamHooks* hooks = nullptr);

 private:
  Sequential(std::vector<LayerConfig> configs, Shape input_shape,
             ModelLayout layout, Device* device);
  absl::Status Reserve(int batch);

  std::vector<LayerConfig> configs_;
  Shape input_shape_;
  ModelLayout layout_;
  Device* device_;  // borrowed
  std::vector<std::unique_ptr<internal::Layer>> layers_;
  // Per layer, its range of the flat vectors (empty for parameterless ones).
  std::vector<std::pair<int64_t, int64_t>> param_ranges_;
  // The first layer with parameters (layers_.size() if none). Without a
  // dinput, no layer from it down needs its input's gradient: an MLP's
  // first Linear after its Flatten skips the step's largest GEMM.
  size_t first_learning_ = 0;
  DeviceBuffer<float> params_;
  DeviceBuffer<float> grads_;
  int capacity_ = 0;                       // batch the buffers fit
  std::vector<DeviceBuffer<float>> acts_;  // per layer output (or empty)
  DeviceBuffer<float> grad_ping_, grad_pong_;
  std::vector<Tensor> inputs_, outputs_;  // views of the last Forward
  bool last_forward_training_ = false;
};

}  // namespace tally

#endif  // TALLY_COMMON_NN_SEQUENTIAL_H_
