#include "common/nn/layer_config.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/random.h"

namespace tally {

namespace {
constexpr std::pair<LayerType, absl::string_view> kNames[] = {
    {LayerType::kLinear, "linear"},       {LayerType::kConv2d, "conv2d"},
    {LayerType::kMaxPool2d, "maxpool2d"}, {LayerType::kReLU, "relu"},
    {LayerType::kFlatten, "flatten"},     {LayerType::kDropout, "dropout"},
};
}  // namespace

absl::string_view LayerTypeName(LayerType type) {
  for (const auto& [t, name] : kNames) {
    if (t == type) return name;
  }
  return "?";
}

absl::StatusOr<LayerType> ParseLayerType(absl::string_view name) {
  for (const auto& [t, n] : kNames) {
    if (n == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown layer type '", name,
      "' (known: linear, conv2d, maxpool2d, relu, flatten, dropout)"));
}

int64_t LayerConfig::EffectiveStride() const {
  if (stride > 0) return stride;
  return type == LayerType::kMaxPool2d ? kernel_size : 1;
}

absl::StatusOr<Shape> InferOutputShape(const LayerConfig& l, const Shape& in) {
  switch (l.type) {
    case LayerType::kLinear: {
      if (l.in_features <= 0 || l.out_features <= 0) {
        return absl::InvalidArgumentError(
            "in_features and out_features must be positive");
      }
      if (in.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expects a flat input of ", l.in_features, " features but gets ",
            ShapeString(in), "; add a flatten layer before it"));
      }
      if (in[0] != l.in_features) {
        return absl::InvalidArgumentError(
            absl::StrCat("in_features is ", l.in_features,
                         " but the input has ", in[0], " features"));
      }
      return Shape{l.out_features};
    }
    case LayerType::kConv2d:
    case LayerType::kMaxPool2d: {
      const bool conv = l.type == LayerType::kConv2d;
      if (l.kernel_size <= 0) {
        return absl::InvalidArgumentError("kernel_size must be positive");
      }
      if (l.stride < 0 || l.padding < 0) {
        return absl::InvalidArgumentError(
            "stride and padding must not be negative");
      }
      if (!conv && l.padding * 2 > l.kernel_size) {
        return absl::InvalidArgumentError(
            "padding must be at most half of kernel_size");
      }
      if (in.size() != 3) {
        return absl::InvalidArgumentError(
            absl::StrCat("expects a [channels, height, width] input but gets ",
                         ShapeString(in)));
      }
      int64_t channels = in[0];
      if (conv) {
        if (l.in_channels <= 0 || l.out_channels <= 0) {
          return absl::InvalidArgumentError(
              "in_channels and out_channels must be positive");
        }
        if (in[0] != l.in_channels) {
          return absl::InvalidArgumentError(absl::StrCat(
              "in_channels is ", l.in_channels, " but the input has ", in[0],
              " channels (input shape ", ShapeString(in), ")"));
        }
        channels = l.out_channels;
      }
      const int64_t s = l.EffectiveStride();
      const int64_t oh = (in[1] + 2 * l.padding - l.kernel_size) / s + 1;
      const int64_t ow = (in[2] + 2 * l.padding - l.kernel_size) / s + 1;
      if (in[1] + 2 * l.padding < l.kernel_size ||
          in[2] + 2 * l.padding < l.kernel_size || oh <= 0 || ow <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kernel_size ", l.kernel_size, " does not fit the ", in[1], "x",
            in[2], " input (padding ", l.padding, ")"));
      }
      return Shape{channels, oh, ow};
    }
    case LayerType::kReLU:
    case LayerType::kDropout:
      if (l.type == LayerType::kDropout && !(l.p >= 0.0 && l.p < 1.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("p must be in [0, 1), got ", l.p));
      }
      return in;
    case LayerType::kFlatten:
      return Shape{NumElements(in)};
  }
  return absl::InternalError("unhandled layer type");
}

absl::StatusOr<ModelLayout> ComputeLayout(
    const std::vector<LayerConfig>& layers, const Shape& input_shape) {
  if (layers.empty()) {
    return absl::InvalidArgumentError("a model needs at least one layer");
  }
  ModelLayout layout;
  Shape shape = input_shape;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerConfig& l = layers[i];
    auto out = InferOutputShape(l, shape);
    if (!out.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers[", i, "] (", LayerTypeName(l.type),
                       "): ", out.status().message()));
    }
    // Sizes come from outside: every product and sum is checked.
    auto too_large = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers[", i, "] (", LayerTypeName(l.type), "): ",
                       what, " overflows a 64-bit count"));
    };
    absl::Status bad;
    auto add = [&](std::string suffix, Shape s) {
      ParamInfo p;
      p.name = absl::StrCat(i, ".", suffix);
      if (!CheckedNumElements(s, &p.numel) ||
          __builtin_add_overflow(layout.num_params, p.numel,
                                 &layout.num_params)) {
        if (bad.ok()) bad = too_large("the parameter count");
        return;
      }
      p.shape = std::move(s);
      p.offset = layout.num_params - p.numel;
      layout.params.push_back(std::move(p));
    };
    if (l.type == LayerType::kLinear) {
      add("weight", {l.out_features, l.in_features});
      if (l.bias) add("bias", {l.out_features});
    } else if (l.type == LayerType::kConv2d) {
      add("weight",
          {l.out_channels, l.in_channels, l.kernel_size, l.kernel_size});
      if (l.bias) add("bias", {l.out_channels});
    }
    if (!bad.ok()) return bad;
    shape = *std::move(out);
    int64_t elements = 0;
    if (!CheckedNumElements(shape, &elements)) {
      return too_large("the output size");
    }
    layout.activation_shapes.push_back(shape);
  }
  return layout;
}

std::vector<float> InitParams(const std::vector<LayerConfig>& layers,
                              const ModelLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.num_params);
  Rng rng(seed);
  for (const ParamInfo& p : layout.params) {
    const size_t dot = p.name.find('.');
    const int index = std::stoi(p.name.substr(0, dot));
    const LayerConfig& l = layers[index];
    const int64_t fan_in = l.type == LayerType::kLinear
                               ? l.in_features
                               : l.in_channels * l.kernel_size * l.kernel_size;
    // kaiming_uniform(a = sqrt(5)) has bound gain * sqrt(3 / fan_in) with
    // gain = sqrt(2 / (1 + 5)), i.e. 1 / sqrt(fan_in): the same as the bias.
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    for (int64_t i = 0; i < p.numel; ++i) {
      params[p.offset + i] = rng.Uniform(-bound, bound);
    }
  }
  return params;
}

}  // namespace tally
