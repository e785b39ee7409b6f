// Layer descriptions, shape inference and the flat parameter layout.
//
// A model is a Sequential list of LayerConfigs. Its parameters form one flat
// float32 vector ordered like PyTorch's state_dict for the same
// torch.nn.Sequential: "<index>.weight" then "<index>.bias" for each layer
// that has parameters. Everything here is pure and thread-safe; it needs no
// device, so servers use it to size a job without building layers.
#ifndef TALLY_COMMON_NN_LAYER_CONFIG_H_
#define TALLY_COMMON_NN_LAYER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace tally {

enum class LayerType {
  kLinear,
  kConv2d,
  kMaxPool2d,
  kReLU,
  kFlatten,
  kDropout
};

// "linear", "conv2d", "maxpool2d", "relu", "flatten", "dropout".
absl::string_view LayerTypeName(LayerType type);
// Inverse of LayerTypeName; kInvalidArgument for an unknown name.
absl::StatusOr<LayerType> ParseLayerType(absl::string_view name);

// Field names follow torch.nn's constructor arguments.
struct LayerConfig {
  LayerType type = LayerType::kReLU;
  // linear
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;  // linear, conv2d
  // conv2d, maxpool2d
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel_size = 0;
  int64_t stride = 0;  // 0: 1 for conv2d, kernel_size for maxpool2d
  int64_t padding = 0;
  // dropout
  double p = 0.5;

  int64_t EffectiveStride() const;
};

// Per-sample output shape of `layer` for per-sample input shape `in` (no
// batch dimension). kInvalidArgument, with a message that says what does not
// fit, when the input cannot feed the layer.
absl::StatusOr<Shape> InferOutputShape(const LayerConfig& layer,
                                       const Shape& in);

struct ParamInfo {
  std::string name;  // "0.weight"
  Shape shape;
  int64_t offset = 0;  // into the flat vector
  int64_t numel = 0;
};

struct ModelLayout {
  std::vector<ParamInfo> params;
  std::vector<Shape> activation_shapes;  // per-sample output of each layer
  int64_t num_params = 0;
};

// Runs shape inference through all layers. Errors are prefixed with
// "layers[i] (type): ".
absl::StatusOr<ModelLayout> ComputeLayout(
    const std::vector<LayerConfig>& layers, const Shape& input_shape);

// PyTorch's default initialisation (kaiming_uniform with a = sqrt(5) for
// weights, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for biases), drawn from a
// generator seeded with `seed`, into a host vector of layout.num_params.
std::vector<float> InitParams(const std::vector<LayerConfig>& layers,
                              const ModelLayout& layout, uint64_t seed);

}  // namespace tally

#endif  // TALLY_COMMON_NN_LAYER_CONFIG_H_
