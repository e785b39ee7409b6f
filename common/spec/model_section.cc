// model: a preset, layers given one by one, or a Python module (its
// parameters, buffers, aliases and files), and the loss it trains with.
#include "common/spec/internal/sections.h"

#include <yaml-cpp/yaml.h>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/internal/yaml_fields.h"
#include "common/status_macros.h"

namespace tally::spec_internal {

namespace {

absl::Status ParseLinearArgs(const YAML::Node& args, const std::string& p,
                             LayerConfig* c) {
  TALLY_RETURN_IF_ERROR(
      CheckKeys(args, p, {"in_features", "out_features", "bias"}));
  if (!args["in_features"] || !args["out_features"]) {
    return FieldError(p, "needs in_features and out_features");
  }
  TALLY_RETURN_IF_ERROR(
      ReadInt(args, p, "in_features", 1, kMaxDim, &c->in_features));
  TALLY_RETURN_IF_ERROR(
      ReadInt(args, p, "out_features", 1, kMaxDim, &c->out_features));
  TALLY_RETURN_IF_ERROR(ReadBool(args, p, "bias", &c->bias));
  return absl::OkStatus();
}

absl::Status ParseConv2dArgs(const YAML::Node& args, const std::string& p,
                             LayerConfig* c) {
  TALLY_RETURN_IF_ERROR(CheckKeys(args, p,
                                  {"in_channels", "out_channels", "kernel_size",
                                   "stride", "padding", "bias"}));
  if (!args["in_channels"] || !args["out_channels"] || !args["kernel_size"]) {
    return FieldError(p, "needs in_channels, out_channels and kernel_size");
  }
  TALLY_RETURN_IF_ERROR(
      ReadInt(args, p, "in_channels", 1, kMaxDim, &c->in_channels));
  TALLY_RETURN_IF_ERROR(
      ReadInt(args, p, "out_channels", 1, kMaxDim, &c->out_channels));
  TALLY_RETURN_IF_ERROR(
      ReadInt(args, p, "kernel_size", 1, 1024, &c->kernel_size));
  TALLY_RETURN_IF_ERROR(ReadInt(args, p, "stride", 1, 1024, &c->stride));
  TALLY_RETURN_IF_ERROR(ReadInt(args, p, "padding", 0, 1024, &c->padding));
  TALLY_RETURN_IF_ERROR(ReadBool(args, p, "bias", &c->bias));
  return absl::OkStatus();
}

absl::StatusOr<LayerConfig> ParseLayer(const YAML::Node& n,
                                       const std::string& path) {
  std::string type_name;
  YAML::Node args;
  if (n.IsScalar()) {
    type_name = n.Scalar();
  } else if (n.IsMap() && n.size() == 1) {
    type_name = n.begin()->first.Scalar();
    args = n.begin()->second;
    if (args.IsNull()) args = YAML::Node(YAML::NodeType::Map);
  } else {
    return FieldError(path,
                      "a layer is a name (relu) or a one-key mapping "
                      "({linear: {in_features: 784, out_features: 256}})");
  }
  auto type = ParseLayerType(type_name);
  if (!type.ok()) return FieldError(path, type.status().message());
  LayerConfig c;
  c.type = *type;
  const std::string p = absl::StrCat(path, ".", type_name);
  if (!args || args.IsNull()) args = YAML::Node(YAML::NodeType::Map);
  switch (c.type) {
    case LayerType::kLinear:
      TALLY_RETURN_IF_ERROR(ParseLinearArgs(args, p, &c));
      break;
    case LayerType::kConv2d:
      TALLY_RETURN_IF_ERROR(ParseConv2dArgs(args, p, &c));
      break;
    case LayerType::kMaxPool2d:
      TALLY_RETURN_IF_ERROR(
          CheckKeys(args, p, {"kernel_size", "stride", "padding"}));
      if (!args["kernel_size"]) return FieldError(p, "needs kernel_size");
      TALLY_RETURN_IF_ERROR(
          ReadInt(args, p, "kernel_size", 1, 1024, &c.kernel_size));
      TALLY_RETURN_IF_ERROR(ReadInt(args, p, "stride", 1, 1024, &c.stride));
      TALLY_RETURN_IF_ERROR(ReadInt(args, p, "padding", 0, 1024, &c.padding));
      break;
    case LayerType::kDropout:
      TALLY_RETURN_IF_ERROR(CheckKeys(args, p, {"p"}));
      TALLY_RETURN_IF_ERROR(ReadDouble(args, p, "p", &c.p));
      if (!(c.p >= 0.0 && c.p < 1.0)) {
        return FieldError(Join(p, "p"),
                          absl::StrCat("must be in [0, 1), got ", c.p));
      }
      break;
    case LayerType::kReLU:
    case LayerType::kFlatten:
      TALLY_RETURN_IF_ERROR(CheckKeys(args, p, {}));
      break;
  }
  return c;
}

// model.python.params: [{name, shape}, ...] into the layout, each tensor's
// size checked for overflow and the whole against max_params.
absl::Status ParsePythonParams(const YAML::Node& params,
                               const SpecLimits& limits, ModelLayout* layout) {
  const std::string p = "model.python.params";
  if (!params || !params.IsSequence() || params.size() == 0) {
    return FieldError(p,
                      "is missing: the client fills it in from the module "
                      "(python3 -m tally submit; tally.Client.submit)");
  }
  if (static_cast<int64_t>(params.size()) > limits.max_model_tensors) {
    return FieldError(p, absl::StrCat(params.size(),
                                      " tensors, over the limit of ",
                                      limits.max_model_tensors,
                                      " (max_model_tensors)"));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string at = absl::StrCat(p, "[", i, "]");
    TALLY_RETURN_IF_ERROR(CheckKeys(params[i], at, {"name", "shape"}));
    ParamInfo info;
    TALLY_RETURN_IF_ERROR(ReadString(params[i], at, "name", &info.name));
    if (info.name.empty() || info.name.size() > 256 ||
        !names.insert(info.name).second) {
      return FieldError(at + ".name",
                        "must be a unique name of 1 to 256 bytes");
    }
    TALLY_RETURN_IF_ERROR(
        ReadShape(params[i]["shape"], at + ".shape", 1, &info.shape));
    if (!CheckedNumElements(info.shape, &info.numel) ||
        info.numel > limits.max_params - layout->num_params) {
      return FieldError(p, absl::StrCat("over the limit of ", limits.max_params,
                                        " parameters (max_params)"));
    }
    info.offset = layout->num_params;
    layout->num_params += info.numel;
    layout->params.push_back(std::move(info));
  }
  return absl::OkStatus();
}

// Bytes per element of a safetensors dtype; 0 for an unknown one.
int64_t DtypeBytes(const std::string& dtype) {
  static const std::map<std::string, int64_t> kBytes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

// model.python.buffers: [{name, dtype, shape}, ...], within max_buffer_bytes.
absl::Status ParsePythonBuffers(const YAML::Node& buffers,
                                const SpecLimits& limits,
                                const ModelLayout& layout,
                                PythonModelSpec* py) {
  const std::string p = "model.python.buffers";
  if (!buffers) return absl::OkStatus();
  std::set<std::string> names;  // the export's: parameters' and buffers'
  for (const ParamInfo& info : layout.params) names.insert(info.name);
  if (!buffers.IsSequence() ||
      static_cast<int64_t>(buffers.size()) > limits.max_model_tensors) {
    return FieldError(p, absl::StrCat("must be a list of at most ",
                                      limits.max_model_tensors, " buffers"));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::string at = absl::StrCat(p, "[", i, "]");
    TALLY_RETURN_IF_ERROR(CheckKeys(buffers[i], at, {"name", "dtype", "shape"}));
    BufferInfo b;
    TALLY_RETURN_IF_ERROR(ReadString(buffers[i], at, "name", &b.name));
    TALLY_RETURN_IF_ERROR(ReadString(buffers[i], at, "dtype", &b.dtype));
    const int64_t size = DtypeBytes(b.dtype);
    if (b.name.empty() || b.name.size() > 256 || size == 0) {
      return FieldError(at, "needs a name of 1 to 256 bytes and a dtype (F32, "
                            "F64, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
    }
    if (!names.insert(b.name).second) {
      return FieldError(at + ".name",
                        absl::StrCat("'", b.name, "' names another tensor"));
    }
    TALLY_RETURN_IF_ERROR(
        ReadShape(buffers[i]["shape"], at + ".shape", 0, &b.shape));
    int64_t n = 0;
    if (!CheckedNumElements(b.shape, &n) ||
        n > (limits.max_buffer_bytes - py->buffer_bytes) / size) {
      return FieldError(p, absl::StrCat("over the limit of ",
                                        limits.max_buffer_bytes,
                                        " bytes (max_buffer_bytes)"));
    }
    b.bytes = n * size;
    py->buffer_bytes += b.bytes;
    py->buffers.push_back(std::move(b));
  }
  return absl::OkStatus();
}

// model.python.aliases: {alias: parameter name}, each naming a parameter.
absl::Status ParsePythonAliases(const YAML::Node& aliases,
                                const ModelLayout& layout,
                                PythonModelSpec* py) {
  if (!aliases) return absl::OkStatus();
  const std::string p = "model.python.aliases";
  if (!aliases.IsMap() || aliases.size() > layout.params.size()) {
    return FieldError(p, "must map names to the parameters they share");
  }
  std::set<std::string> names;
  for (const ParamInfo& info : layout.params) names.insert(info.name);
  for (const auto& kv : aliases) {
    if (!kv.first.IsScalar() || !kv.second.IsScalar() ||
        !names.count(kv.second.Scalar()) || names.count(kv.first.Scalar()) ||
        kv.first.Scalar().size() > 256) {
      return FieldError(p, "must map other names to the parameters they share");
    }
    py->aliases[kv.first.Scalar()] = kv.second.Scalar();
  }
  return absl::OkStatus();
}

// model.python.files: a directory's .py files, {relative path: text}, at
// most 1,024 of them, their texts within max_model_bytes together.
absl::Status ParsePythonFiles(const YAML::Node& files, const SpecLimits& limits,
                              PythonModelSpec* py) {
  const std::string p = "model.python.files";
  if (!files) return absl::OkStatus();
  if (!files.IsMap() || files.size() == 0 || files.size() > 1024) {
    return FieldError(p, "must map 1 to 1,024 paths to their text");
  }
  int64_t total = 0;
  for (const auto& kv : files) {
    const std::string path = kv.first.IsScalar() ? kv.first.Scalar() : "";
    const bool inside = !path.empty() && path.size() <= 256 &&
                        path.front() != '/' && absl::EndsWith(path, ".py") &&
                        !absl::StrContains(absl::StrCat("/", path, "/"),
                                           "/../");
    if (!inside || !kv.second.IsScalar()) {
      return FieldError(p, absl::StrCat("'", path.substr(0, 64),
                                        "' is not a .py file's relative path "
                                        "with its text"));
    }
    total += static_cast<int64_t>(kv.second.Scalar().size());
    if (total > limits.max_model_bytes) {
      return FieldError(p, absl::StrCat("over ", limits.max_model_bytes,
                                        " bytes together (max_model_bytes)"));
    }
    py->files[path] = kv.second.Scalar();
  }
  return absl::OkStatus();
}

// model.python: {file, build, code | files, params, buffers, aliases}.
absl::Status ParsePythonModel(const YAML::Node& n, const SpecLimits& limits,
                              JobSpec* spec) {
  const std::string p = "model.python";
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p, {"file", "build", "code", "files", "params", "buffers", "aliases"}));
  spec->is_python = true;
  PythonModelSpec& py = spec->python;
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "file", &py.file));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "build", &py.build));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "code", &py.code));
  TALLY_RETURN_IF_ERROR(ParsePythonFiles(n["files"], limits, &py));
  if (py.build.empty() || py.build.size() > 256) {
    return FieldError(p + ".build", "must name the function that returns "
                                    "the module");
  }
  if (!py.files.empty() && !py.code.empty()) {
    return FieldError(p, "has code and files: one file's code, or a "
                         "directory's files");
  }
  if (py.code.empty() && py.files.empty()) {
    return FieldError(
        p + ".code",
        absl::StrCat("is missing: submit with the Python client (python3 -m "
                     "tally submit), which sends ",
                     py.file.empty() ? "model.python.file" : py.file,
                     " and the module's layout"));
  }
  if (static_cast<int64_t>(py.code.size()) > limits.max_model_bytes) {
    return FieldError(p + ".code",
                      absl::StrCat(py.code.size(), " bytes, over the limit of ",
                                   limits.max_model_bytes,
                                   " (max_model_bytes)"));
  }
  TALLY_RETURN_IF_ERROR(ParsePythonParams(n["params"], limits, &spec->layout));
  TALLY_RETURN_IF_ERROR(
      ParsePythonBuffers(n["buffers"], limits, spec->layout, &py));
  return ParsePythonAliases(n["aliases"], spec->layout, &py);
}

absl::Status ParseLoss(const YAML::Node& model, JobSpec* spec) {
  std::string loss = "cross_entropy";
  TALLY_RETURN_IF_ERROR(ReadString(model, "model", "loss", &loss));
  if (loss == "cross_entropy") {
    spec->loss = LossKind::kCrossEntropy;
  } else if (loss == "mse") {
    spec->loss = LossKind::kMse;
  } else if (loss == "model") {
    spec->loss = LossKind::kModel;
  } else if (loss == "binary_cross_entropy") {
    spec->loss = LossKind::kBinaryCrossEntropy;
  } else {
    return FieldError("model.loss",
                      absl::StrCat("unknown loss '", loss,
                                   "' (known: cross_entropy, mse, model, "
                                   "binary_cross_entropy)"));
  }
  if (!spec->is_python && spec->loss != LossKind::kCrossEntropy) {
    return FieldError("model.loss",
                      "a model of layers trains with cross_entropy; mse, "
                      "model and binary_cross_entropy need model.python");
  }
  return absl::OkStatus();
}

}  // namespace

// model: a preset, the layers given one by one, or a Python module.
absl::Status ParseModel(const YAML::Node& model, const SpecLimits& limits,
                        JobSpec* spec) {
  if (!model) return FieldError("model", "is required");
  TALLY_RETURN_IF_ERROR(
      CheckKeys(model, "model",
                {"preset", "layers", "python", "loss", "embeddings"}));
  if (int(bool(model["preset"])) + int(bool(model["layers"])) +
          int(bool(model["python"])) > 1) {
    return FieldError("model", "give one of preset, layers and python");
  }
  if (model["python"]) {
    TALLY_RETURN_IF_ERROR(ParsePythonModel(model["python"], limits, spec));
    TALLY_RETURN_IF_ERROR(ParseEmbeddings(model["embeddings"], spec));
    return ParseLoss(model, spec);
  }
  TALLY_RETURN_IF_ERROR(ParseEmbeddings(model["embeddings"], spec));
  TALLY_RETURN_IF_ERROR(ParseLoss(model, spec));
  if (model["preset"]) {
    TALLY_RETURN_IF_ERROR(
        ReadString(model, "model", "preset", &spec->model_preset));
    auto layers =
        PresetLayers(spec->model_preset, spec->input_shape, spec->num_classes);
    if (!layers.ok())
      return FieldError("model.preset", layers.status().message());
    spec->layers = *std::move(layers);
    return absl::OkStatus();
  }
  const YAML::Node layers = model["layers"];
  if (layers && layers.IsSequence() &&
      static_cast<int64_t>(layers.size()) > limits.max_layers) {
    return FieldError("model.layers",
                      absl::StrCat(layers.size(), " layers, over the limit of ",
                                   limits.max_layers, " (max_layers)"));
  }
  if (!layers || !layers.IsSequence() || layers.size() == 0) {
    return FieldError("model",
                      "needs a preset (mlp, cnn), a non-empty list of layers, "
                      "or python");
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    TALLY_ASSIGN_OR_RETURN(
        LayerConfig c,
        ParseLayer(layers[i], absl::StrCat("model.layers[", i, "]")));
    spec->layers.push_back(c);
  }
  return absl::OkStatus();
}

}  // namespace tally::spec_internal

namespace tally {

absl::StatusOr<std::vector<LayerConfig>> PresetLayers(absl::string_view preset,
                                                      const Shape& in,
                                                      int num_classes) {
  auto linear = [](int64_t i, int64_t o) {
    LayerConfig c;
    c.type = LayerType::kLinear;
    c.in_features = i;
    c.out_features = o;
    return c;
  };
  auto simple = [](LayerType t) {
    LayerConfig c;
    c.type = t;
    return c;
  };
  if (preset == "mlp") {
    return std::vector<LayerConfig>{
        simple(LayerType::kFlatten), linear(NumElements(in), 256),
        simple(LayerType::kReLU),    linear(256, 128),
        simple(LayerType::kReLU),    linear(128, num_classes)};
  }
  if (preset == "cnn") {
    if (in.size() != 3 || in[1] < 6 || in[2] < 6) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset cnn needs image samples [C, H, W] of at least 6x6, the "
          "dataset gives ",
          ShapeString(in)));
    }
    LayerConfig conv;
    conv.type = LayerType::kConv2d;
    conv.in_channels = in[0];
    conv.out_channels = 10;
    conv.kernel_size = 5;
    LayerConfig pool;
    pool.type = LayerType::kMaxPool2d;
    pool.kernel_size = 2;
    const int64_t feat = 10 * ((in[1] - 4) / 2) * ((in[2] - 4) / 2);
    return std::vector<LayerConfig>{conv, simple(LayerType::kReLU), pool,
                                    simple(LayerType::kFlatten),
                                    linear(feat, num_classes)};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown preset '", preset, "' (known: mlp, cnn)"));
}

}  // namespace tally
