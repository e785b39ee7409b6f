#include "common/spec/job_spec.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/criteo.h"
#include "common/data/csv.h"
#include "common/data/image_folder.h"
#include "common/data/npy.h"
#include "common/data/text.h"
#include "common/status_macros.h"

namespace tally {

namespace {

absl::Status FieldError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string Join(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// Rejects keys of `node` (a map) that are not in `allowed`.
absl::Status CheckKeys(const YAML::Node& node, const std::string& path,
                       const std::set<std::string>& allowed) {
  if (!node.IsMap()) {
    return FieldError(path.empty() ? "document" : path, "must be a mapping");
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    if (!allowed.count(key)) {
      return FieldError(Join(path, key),
                        absl::StrCat("unknown field (known: ",
                                     absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadInt(const YAML::Node& parent, const std::string& path,
                     const char* key, int64_t min, int64_t max, int64_t* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  const std::string p = Join(path, key);
  int64_t v = 0;
  if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
    return FieldError(
        p, absl::StrCat("must be an integer, got '",
                        n.IsScalar() ? n.Scalar() : "a non-scalar", "'"));
  }
  if (v < min || v > max) {
    return FieldError(
        p, absl::StrCat("must be in [", min, ", ", max, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadDouble(const YAML::Node& parent, const std::string& path,
                        const char* key, double* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) ||
      !std::isfinite(v)) {
    return FieldError(
        Join(path, key),
        absl::StrCat("must be a finite number, got '",
                     n.IsScalar() ? n.Scalar() : "a non-scalar", "'"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadBool(const YAML::Node& parent, const std::string& path,
                      const char* key, bool* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  bool v = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
    return FieldError(Join(path, key), "must be true or false");
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadString(const YAML::Node& parent, const std::string& path,
                        const char* key, std::string* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  if (!n.IsScalar()) return FieldError(Join(path, key), "must be a string");
  *out = n.Scalar();
  return absl::OkStatus();
}

constexpr int64_t kMaxDim = int64_t{1} << 24;

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

// A dataset of the user's files: its classes and training samples, both
// required (the schedule is fixed at submission; the Python client fills
// train_size in from the files).
absl::Status ReadClassesAndSize(const YAML::Node& n, int* num_classes,
                                int64_t* train_size) {
  int64_t classes = 0;
  TALLY_RETURN_IF_ERROR(ReadInt(n, "dataset", "classes", 2, 1 << 20, &classes));
  if (classes == 0) return FieldError("dataset.classes", "is required");
  *num_classes = static_cast<int>(classes);
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, "dataset", "train_size", 1, int64_t{1} << 40, train_size));
  if (*train_size == 0) {
    return FieldError("dataset.train_size",
                      "is required: the schedule is fixed at submission (the "
                      "Python client fills it in from the files)");
  }
  return absl::OkStatus();
}

// dataset.train / dataset.test: {inputs: PATH, labels: PATH} (.npy files
// or globs) or {file: PATH, inputs: KEY, labels: KEY} (.npz, .safetensors).
absl::Status ParseSplit(const YAML::Node& n, const std::string& p,
                        ArrayFiles* f) {
  if (!n.IsMap()) {
    return FieldError(p, "must be {inputs: PATH, labels: PATH} or {file: "
                         "PATH, inputs: KEY, labels: KEY}");
  }
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p, {"file", "inputs", "labels"}));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "file", &f->file));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "inputs", &f->inputs));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "labels", &f->labels));
  if (f->inputs.empty() || f->labels.empty()) {
    return FieldError(p, "needs inputs and labels (.npy files, or keys of "
                         "file)");
  }
  const absl::string_view file = f->file;
  if (!file.empty() && !absl::EndsWith(file, ".npz") &&
      !absl::EndsWith(file, ".safetensors")) {
    return FieldError(Join(p, "file"), "must be a .npz or .safetensors file");
  }
  return absl::OkStatus();
}

// dataset: {name: arrays, train, test, shape, classes, train_size}.
absl::Status ParseArrays(const YAML::Node& n, ArraysSpec* a) {
  const std::string p = "dataset";
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p, {"name", "train", "test", "shape", "classes", "train_size"}));
  if (!n["train"]) return FieldError("dataset.train", "is required");
  TALLY_RETURN_IF_ERROR(ParseSplit(n["train"], "dataset.train", &a->train));
  if (n["test"]) {
    TALLY_RETURN_IF_ERROR(ParseSplit(n["test"], "dataset.test", &a->test));
  }
  const YAML::Node shape = n["shape"];
  if (!shape || !shape.IsSequence() || shape.size() == 0 || shape.size() > 4) {
    return FieldError("dataset.shape",
                      "must list one sample's 1 to 4 sizes (the Python client "
                      "fills it in from the files)");
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = 0;
    YAML::Node one(YAML::NodeType::Map);
    one["d"] = shape[i];
    TALLY_RETURN_IF_ERROR(ReadInt(one, "dataset.shape", "d", 1, kMaxDim, &d));
    a->shape.push_back(d);
  }
  return ReadClassesAndSize(n, &a->num_classes, &a->train_size);
}

// dataset: {name: csv, train, test, label, features, shape, classes,
// train_size}.
absl::Status ParseCsvSpec(const YAML::Node& n, CsvSpec* c) {
  const std::string p = "dataset";
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p,
                                  {"name", "train", "test", "label", "features",
                                   "shape", "classes", "train_size"}));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "train", &c->train));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "test", &c->test));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "label", &c->label));
  if (c->train.empty()) return FieldError("dataset.train", "is required");
  if (c->label.empty()) {
    return FieldError("dataset.label", "must name the label column");
  }
  if (const YAML::Node f = n["features"]) {
    if (!f.IsSequence() || f.size() == 0) {
      return FieldError("dataset.features", "must list column names");
    }
    for (const auto& col : f) c->features.push_back(col.as<std::string>(""));
  }
  c->num_features = static_cast<int64_t>(c->features.size());
  if (const YAML::Node shape = n["shape"]) {
    int64_t k = 0;
    YAML::Node one(YAML::NodeType::Map);
    one["k"] = shape.IsSequence() && shape.size() == 1 ? shape[0] : YAML::Node();
    TALLY_RETURN_IF_ERROR(ReadInt(one, "dataset.shape", "k", 1, kMaxDim, &k));
    if (k == 0 || (c->num_features > 0 && k != c->num_features)) {
      return FieldError("dataset.shape",
                        "must be [the number of feature columns]");
    }
    c->num_features = k;
  }
  if (c->num_features == 0) {
    return FieldError("dataset.shape",
                      "is required without dataset.features: [the number of "
                      "feature columns] (the Python client fills it in)");
  }
  return ReadClassesAndSize(n, &c->num_classes, &c->train_size);
}

absl::Status ReadShape(const YAML::Node& shape, const std::string& at,
                       int64_t min, Shape* out);

// One float per channel (dataset.mean, dataset.std).
absl::Status ReadPerChannel(const YAML::Node& n, const char* key,
                            int64_t channels, std::vector<float>* out) {
  const std::string at = absl::StrCat("dataset.", key);
  const YAML::Node v = n[key];
  if (!v) return absl::OkStatus();
  if (!v.IsSequence() || static_cast<int64_t>(v.size()) != channels) {
    return FieldError(at, absl::StrCat("must list one number per channel (",
                                       channels, ")"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    double x = 0;
    if (!v[i].IsScalar() || !YAML::convert<double>::decode(v[i], x) ||
        !std::isfinite(x)) {
      return FieldError(at, "must list numbers");
    }
    out->push_back(static_cast<float>(x));
  }
  return absl::OkStatus();
}

// dataset.augment: {crop_padding, hflip}.
absl::Status ParseAugment(const YAML::Node& a, ImageFolderSpec* f) {
  if (!a) return absl::OkStatus();
  const std::string p = "dataset.augment";
  TALLY_RETURN_IF_ERROR(CheckKeys(a, p, {"crop_padding", "hflip"}));
  int64_t pad = 0;
  TALLY_RETURN_IF_ERROR(ReadInt(a, p, "crop_padding", 0, 1024, &pad));
  f->crop_padding = static_cast<int>(pad);
  return ReadBool(a, p, "hflip", &f->hflip);
}

// dataset: {name: image_folder, train, test, shape, resize, mean, std,
// augment, skip_bad, classes, train_size}.
absl::Status ParseImageFolder(const YAML::Node& n, ImageFolderSpec* f) {
  const std::string p = "dataset";
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p, {"name", "train", "test", "shape", "resize", "mean", "std",
             "augment", "skip_bad", "classes", "train_size"}));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "train", &f->train));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "test", &f->test));
  if (f->train.empty()) {
    return FieldError("dataset.train", "is required (a directory per class)");
  }
  Shape s;
  if (!n["shape"] || !ReadShape(n["shape"], "dataset.shape", 1, &s).ok() ||
      s.size() != 3 || (s[0] != 1 && s[0] != 3) || s[1] > 8192 || s[2] > 8192) {
    return FieldError("dataset.shape",
                      "must be [channels (1 or 3), height, width], sides up "
                      "to 8192");
  }
  f->shape = s;
  std::string resize = "crop";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "resize", &resize));
  if (resize == "crop") {
    f->fit = ImageFit::kCrop;
  } else if (resize == "stretch") {
    f->fit = ImageFit::kStretch;
  } else if (resize == "none") {
    f->fit = ImageFit::kExact;
  } else {
    return FieldError("dataset.resize", absl::StrCat("unknown '", resize,
                                                     "' (crop, stretch or none)"));
  }
  TALLY_RETURN_IF_ERROR(ReadPerChannel(n, "mean", s[0], &f->mean));
  TALLY_RETURN_IF_ERROR(ReadPerChannel(n, "std", s[0], &f->std));
  if (f->mean.empty() != f->std.empty()) {
    return FieldError("dataset.mean", "and dataset.std come together");
  }
  for (float v : f->std) {
    if (!(v > 0)) return FieldError("dataset.std", "must be positive");
  }
  TALLY_RETURN_IF_ERROR(ParseAugment(n["augment"], f));
  TALLY_RETURN_IF_ERROR(ReadBool(n, p, "skip_bad", &f->skip_bad));
  return ReadClassesAndSize(n, &f->num_classes, &f->train_size);
}

// A path or glob, or a list of them (dataset.train, dataset.test).
absl::Status ReadPaths(const YAML::Node& n, const std::string& at,
                       std::vector<std::string>* out) {
  if (!n) return absl::OkStatus();
  if (n.IsScalar()) {
    out->push_back(n.Scalar());
  } else if (n.IsSequence() && n.size() > 0 && n.size() <= 4096) {
    for (const YAML::Node& p : n) {
      if (!p.IsScalar()) return FieldError(at, "must list paths");
      out->push_back(p.Scalar());
    }
  } else {
    return FieldError(at, "must be a path or glob, or a list of 1 to 4096");
  }
  for (const std::string& p : *out) {
    if (p.empty()) return FieldError(at, "names an empty path");
  }
  return absl::OkStatus();
}

// dataset: {name: text, train, test, test_fraction, vocab, vocab_size,
// seq_len, train_size}.
absl::Status ParseText(const YAML::Node& n, TextSpec* t) {
  const std::string p = "dataset";
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p, {"name", "train", "test", "test_fraction", "vocab", "vocab_size",
             "seq_len", "train_size"}));
  TALLY_RETURN_IF_ERROR(ReadPaths(n["train"], "dataset.train", &t->train));
  TALLY_RETURN_IF_ERROR(ReadPaths(n["test"], "dataset.test", &t->test));
  if (t->train.empty()) {
    return FieldError("dataset.train", "is required (text files or globs)");
  }
  if (n["test_fraction"]) {
    if (!t->test.empty()) {
      return FieldError("dataset.test_fraction",
                        "is for a corpus without test files (dataset.test)");
    }
    TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "test_fraction", &t->test_fraction));
    if (!(t->test_fraction >= 0 && t->test_fraction < 1)) {
      return FieldError("dataset.test_fraction", "must be in [0, 1)");
    }
  }
  if (!t->test.empty()) t->test_fraction = 0;
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "vocab", &t->vocab));
  if (t->vocab == "bytes") t->vocab.clear();
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "seq_len", 1, 1 << 16, &t->seq_len));
  if (t->vocab.empty()) {
    TALLY_RETURN_IF_ERROR(ReadInt(n, p, "vocab_size", kByteVocabulary,
                                  kByteVocabulary, &t->vocab_size));
  } else {
    t->vocab_size = 0;
    TALLY_RETURN_IF_ERROR(
        ReadInt(n, p, "vocab_size", 2, kMaxVocabulary, &t->vocab_size));
    if (t->vocab_size == 0) {
      return FieldError("dataset.vocab_size",
                        "is required with a vocabulary file: its tokens (the "
                        "Python client fills it in)");
    }
  }
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "train_size", 1, int64_t{1} << 40, &t->train_size));
  if (t->train_size == 0) {
    return FieldError("dataset.train_size",
                      "is required: the training windows (the schedule is "
                      "fixed at submission; the Python client fills it in)");
  }
  return absl::OkStatus();
}

// dataset: {name: clicks, train_size, test_size, integer_features,
// categorical_features, cardinality, zipf, seed}.
absl::Status ParseClicks(const YAML::Node& n, ClicksOptions* c) {
  const std::string p = "dataset";
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p,
                                  {"name", "train_size", "test_size",
                                   "integer_features", "categorical_features",
                                   "cardinality", "zipf", "seed"}));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "train_size", 1, int64_t{1} << 28, &c->train_size));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "test_size", 0, int64_t{1} << 28, &c->test_size));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "integer_features", 0, 1024, &c->integer_features));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "categorical_features", 1, 1024, &c->categorical_features));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "cardinality", 1, int64_t{1} << 24, &c->cardinality));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "zipf", &c->zipf));
  if (c->zipf <= 0 || c->zipf > 4) {
    return FieldError("dataset.zipf", "must be in (0, 4]");
  }
  int64_t seed = static_cast<int64_t>(c->seed);
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "seed", 0, std::numeric_limits<int64_t>::max(), &seed));
  c->seed = static_cast<uint64_t>(seed);
  return absl::OkStatus();
}

// dataset: {name: criteo, train, test, test_fraction, integer_features,
// categorical_features, train_size}.
absl::Status ParseCriteo(const YAML::Node& n, CriteoSpec* c) {
  const std::string p = "dataset";
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p, {"name", "train", "test", "test_fraction", "integer_features",
             "categorical_features", "train_size"}));
  TALLY_RETURN_IF_ERROR(ReadPaths(n["train"], "dataset.train", &c->train));
  TALLY_RETURN_IF_ERROR(ReadPaths(n["test"], "dataset.test", &c->test));
  if (c->train.empty()) {
    return FieldError("dataset.train",
                      "is required (Criteo TSV files or globs)");
  }
  if (n["test_fraction"]) {
    if (!c->test.empty()) {
      return FieldError("dataset.test_fraction",
                        "is for logs without test files (dataset.test)");
    }
    TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "test_fraction", &c->test_fraction));
    if (!(c->test_fraction >= 0 && c->test_fraction < 1)) {
      return FieldError("dataset.test_fraction", "must be in [0, 1)");
    }
  }
  if (!c->test.empty()) c->test_fraction = 0;
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "integer_features", 0, 1024, &c->integer_features));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "categorical_features", 1, 1024, &c->categorical_features));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "train_size", 1, int64_t{1} << 40, &c->train_size));
  if (c->train_size == 0) {
    return FieldError("dataset.train_size",
                      "is required: the training lines (the schedule is "
                      "fixed at submission; the Python client fills it in)");
  }
  return absl::OkStatus();
}

absl::Status ParseDatasetThreads(YAML::Node n, DatasetSpec* d) {
  int64_t threads = d->threads;
  TALLY_RETURN_IF_ERROR(ReadInt(n, "dataset", "threads", 1, 64, &threads));
  d->threads = static_cast<int>(threads);
  return absl::OkStatus();
}

absl::Status ParseDataset(const YAML::Node& node, DatasetSpec* d) {
  const std::string p = "dataset";
  if (!node) return FieldError(p, "is required");
  if (!node.IsMap()) return FieldError(p, "must be a mapping");
  TALLY_RETURN_IF_ERROR(ParseDatasetThreads(node, d));
  // Every dataset takes threads; each parser checks its own keys.
  YAML::Node n = YAML::Clone(node);
  n.remove("threads");
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "name", &d->name));
  if (d->name == "fashion-mnist") {
    TALLY_RETURN_IF_ERROR(CheckKeys(n, p, {"name", "root", "normalize"}));
    TALLY_RETURN_IF_ERROR(ReadString(n, p, "root", &d->root));
    TALLY_RETURN_IF_ERROR(ReadBool(n, p, "normalize", &d->normalize));
    if (d->root.empty()) return FieldError("dataset.root", "must not be empty");
  } else if (d->name == "synthetic") {
    TALLY_RETURN_IF_ERROR(
        CheckKeys(n, p,
                  {"name", "train_size", "test_size", "features", "classes",
                   "teacher_hidden", "seed"}));
    SyntheticOptions& s = d->synthetic;
    TALLY_RETURN_IF_ERROR(
        ReadInt(n, p, "train_size", 1, int64_t{1} << 28, &s.train_size));
    TALLY_RETURN_IF_ERROR(
        ReadInt(n, p, "test_size", 0, int64_t{1} << 28, &s.test_size));
    TALLY_RETURN_IF_ERROR(ReadInt(n, p, "features", 1, kMaxDim, &s.features));
    int64_t classes = s.num_classes;
    TALLY_RETURN_IF_ERROR(ReadInt(n, p, "classes", 2, 1 << 20, &classes));
    s.num_classes = static_cast<int>(classes);
    TALLY_RETURN_IF_ERROR(
        ReadInt(n, p, "teacher_hidden", 1, 4096, &s.teacher_hidden));
    int64_t seed = static_cast<int64_t>(s.seed);
    TALLY_RETURN_IF_ERROR(
        ReadInt(n, p, "seed", 0, std::numeric_limits<int64_t>::max(), &seed));
    s.seed = static_cast<uint64_t>(seed);
    if (s.features * (s.train_size + s.test_size) > (int64_t{1} << 31)) {
      return FieldError(p, "synthetic dataset larger than 2^31 values");
    }
  } else if (d->name == "arrays") {
    return ParseArrays(n, &d->arrays);
  } else if (d->name == "csv") {
    return ParseCsvSpec(n, &d->csv);
  } else if (d->name == "image_folder") {
    return ParseImageFolder(n, &d->images);
  } else if (d->name == "text") {
    return ParseText(n, &d->text);
  } else if (d->name == "clicks") {
    return ParseClicks(n, &d->clicks);
  } else if (d->name == "criteo") {
    return ParseCriteo(n, &d->criteo);
  } else if (d->name.empty()) {
    return FieldError("dataset.name",
                      "is required (fashion-mnist, synthetic, arrays, csv, "
                      "image_folder, text, clicks or criteo)");
  } else {
    return FieldError(
        "dataset.name",
        absl::StrCat("unknown dataset '", d->name,
                     "' (known: fashion-mnist, synthetic, arrays, csv, "
                     "image_folder, text, clicks, criteo)"));
  }
  return absl::OkStatus();
}

// training.consistency's mode and lr_scaling, by name.
absl::Status ParseConsistencyNames(const YAML::Node& n, const std::string& p,
                                   ConsistencySpec* c) {
  std::string mode = "bsp";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "mode", &mode));
  if (mode == "bsp") {
    c->mode = ConsistencyMode::kBsp;
  } else if (mode == "ssp") {
    c->mode = ConsistencyMode::kSsp;
  } else if (mode == "async") {
    c->mode = ConsistencyMode::kAsync;
  } else {
    return FieldError(Join(p, "mode"),
                      absl::StrCat("unknown mode '", mode,
                                   "' (bsp, ssp or async)"));
  }
  std::string tables = "sync";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "tables", &tables));
  if (tables != "sync" && tables != "async") {
    return FieldError(Join(p, "tables"),
                      absl::StrCat("unknown rule '", tables,
                                   "' (sync: as the mode; async: each "
                                   "push's rows stepped as it comes)"));
  }
  // Async closes no steps: its rows are stepped as they come.
  if (c->mode == ConsistencyMode::kAsync && tables == "sync" && n["tables"]) {
    return FieldError(Join(p, "tables"),
                      "sync needs steps that close (mode bsp or ssp); mode "
                      "async steps the rows as they come");
  }
  c->tables_async = tables == "async" || c->mode == ConsistencyMode::kAsync;
  std::string scaling = "none";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "lr_scaling", &scaling));
  if (scaling == "none") {
    c->lr_scaling = LrScaling::kNone;
  } else if (scaling == "staleness") {
    c->lr_scaling = LrScaling::kStaleness;
  } else {
    return FieldError(Join(p, "lr_scaling"),
                      absl::StrCat("unknown scaling '", scaling,
                                   "' (none or staleness)"));
  }
  return absl::OkStatus();
}

absl::Status ParseConsistency(const YAML::Node& n, const TrainingSpec& t,
                              ConsistencySpec* c) {
  const std::string p = "training.consistency";
  if (!n) return absl::OkStatus();
  if (!n.IsMap()) return FieldError(p, "must be a mapping");
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p,
      {"mode", "staleness", "lr_scaling", "max_staleness", "backup_workers",
       "tables"}));
  TALLY_RETURN_IF_ERROR(ParseConsistencyNames(n, p, c));
  const bool bsp = c->mode == ConsistencyMode::kBsp;
  const bool ssp = c->mode == ConsistencyMode::kSsp;
  if (n["staleness"] && !ssp) {
    return FieldError(Join(p, "staleness"), "applies to mode ssp only");
  }
  if (ssp && !n["staleness"]) {
    return FieldError(Join(p, "staleness"), "is required with mode ssp");
  }
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "staleness", 0, 1000, &c->staleness));
  if (bsp && c->lr_scaling != LrScaling::kNone) {
    return FieldError(Join(p, "lr_scaling"),
                      "has no effect with mode bsp (every gradient is fresh)");
  }
  if (n["max_staleness"] && bsp) {
    return FieldError(Join(p, "max_staleness"),
                      "has no effect with mode bsp (every gradient is fresh)");
  }
  if (n["max_staleness"] && ssp) {
    // Below staleness it would refuse what the rule lets workers compute;
    // at or above it, it refuses nothing.
    return FieldError(Join(p, "max_staleness"),
                      "applies to mode async only (in ssp, staleness bounds "
                      "it)");
  }
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "max_staleness", 0, 1000000, &c->max_staleness));
  if (n["backup_workers"] && !bsp) {
    return FieldError(Join(p, "backup_workers"), "applies to mode bsp only");
  }
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "backup_workers", 0, 1023, &c->backup_workers));
  if (c->backup_workers > 0 && c->backup_workers >= t.workers) {
    return FieldError(Join(p, "backup_workers"),
                      absl::StrCat("must be less than training.workers (",
                                   t.workers, ")"));
  }
  if (c->backup_workers > 0 && t.shards > 1) {
    // Each shard would pick its own late pushes: they could disagree.
    return FieldError(Join(p, "backup_workers"),
                      "needs the job on one shard (training.shards: 1 or "
                      "unset)");
  }
  return absl::OkStatus();
}

// training.workers: a number, or a range {min, max} (the job starts with
// min and grows as free workers come, up to max).
absl::Status ParseWorkers(const YAML::Node& n, const std::string& p,
                          TrainingSpec* t) {
  const YAML::Node w = n["workers"];
  if (!w || !w.IsMap()) {
    TALLY_RETURN_IF_ERROR(ReadInt(n, p, "workers", 1, 1024, &t->workers));
    t->max_workers = t->workers;
    return absl::OkStatus();
  }
  const std::string wp = Join(p, "workers");
  TALLY_RETURN_IF_ERROR(CheckKeys(w, wp, {"min", "max"}));
  if (!w["min"] || !w["max"]) return FieldError(wp, "needs min and max");
  TALLY_RETURN_IF_ERROR(ReadInt(w, wp, "min", 1, 1024, &t->workers));
  TALLY_RETURN_IF_ERROR(ReadInt(w, wp, "max", 1, 1024, &t->max_workers));
  if (t->max_workers < t->workers) {
    return FieldError(Join(wp, "max"),
                      absl::StrCat("must be at least min (", t->workers,
                                   "), got ", t->max_workers));
  }
  return absl::OkStatus();
}

absl::Status ParseTraining(const YAML::Node& n, TrainingSpec* t) {
  const std::string p = "training";
  if (!n) return absl::OkStatus();
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p,
                                  {"epochs", "batch_size", "max_steps", "seed",
                                   "workers", "shards", "tf32",
                                   "wire_dtype", "consistency"}));
  TALLY_RETURN_IF_ERROR(ReadBool(n, p, "tf32", &t->tf32));
  std::string wire = "float32";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "wire_dtype", &wire));
  if (wire == "float32") {
    t->wire_dtype = WireDtype::kFloat32;
  } else if (wire == "bfloat16") {
    t->wire_dtype = WireDtype::kBfloat16;
  } else {
    return FieldError(
        "training.wire_dtype",
        absl::StrCat("unknown dtype '", wire, "' (float32 or bfloat16)"));
  }
  TALLY_RETURN_IF_ERROR(ParseWorkers(n, p, t));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "shards", 0, 1024, &t->shards));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "epochs", 1, 1000000, &t->epochs));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "batch_size", 1, 1 << 20, &t->batch_size));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "max_steps", 0, int64_t{1} << 40, &t->max_steps));
  int64_t seed = static_cast<int64_t>(t->seed);
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "seed", 0, std::numeric_limits<int64_t>::max(), &seed));
  t->seed = static_cast<uint64_t>(seed);
  return ParseConsistency(n["consistency"], *t, &t->consistency);
}

// optimizer.schedule: {type: constant|step|cosine, warmup_steps, step_size,
// gamma, min_lr}.
absl::Status ParseSchedule(const YAML::Node& n, OptimizerConfig* o) {
  const std::string p = "optimizer.schedule";
  if (!n) return absl::OkStatus();
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p, {"type", "warmup_steps", "step_size", "gamma", "min_lr"}));
  std::string type = "constant";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "type", &type));
  if (type == "constant") {
    o->schedule = OptimizerConfig::Schedule::kConstant;
  } else if (type == "step") {
    o->schedule = OptimizerConfig::Schedule::kStep;
    if (!n["step_size"]) return FieldError(p, "type step needs step_size");
  } else if (type == "cosine") {
    o->schedule = OptimizerConfig::Schedule::kCosine;
  } else {
    return FieldError(p + ".type", absl::StrCat("unknown schedule '", type,
                                                "' (known: constant, step, "
                                                "cosine)"));
  }
  constexpr int64_t kMaxSteps = int64_t{1} << 40;
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "warmup_steps", 0, kMaxSteps, &o->warmup_steps));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "step_size", 1, kMaxSteps, &o->step_size));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "gamma", &o->gamma));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "min_lr", &o->min_lr));
  return absl::OkStatus();
}

absl::Status ParseOptimizer(const YAML::Node& n, OptimizerConfig* o) {
  const std::string p = "optimizer";
  if (!n) return absl::OkStatus();
  if (!n.IsMap()) return FieldError(p, "must be a mapping");
  std::string type = "sgd";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "type", &type));
  auto t = ParseOptimizerType(type);
  if (!t.ok()) return FieldError("optimizer.type", t.status().message());
  o->type = *t;
  if (o->type == OptimizerType::kSgd) {
    TALLY_RETURN_IF_ERROR(CheckKeys(
        n, p,
        {"type", "lr", "momentum", "dampening", "nesterov", "weight_decay",
         "schedule", "clip_grad_norm"}));
  } else {
    TALLY_RETURN_IF_ERROR(CheckKeys(
        n, p,
        {"type", "lr", "betas", "beta1", "beta2", "eps", "weight_decay",
         "schedule", "clip_grad_norm"}));
    // PyTorch's AdamW defaults to weight_decay 0.01.
    if (o->type == OptimizerType::kAdamW) o->weight_decay = 0.01;
    o->lr = 0.001;
  }
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "lr", &o->lr));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "momentum", &o->momentum));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "dampening", &o->dampening));
  TALLY_RETURN_IF_ERROR(ReadBool(n, p, "nesterov", &o->nesterov));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "weight_decay", &o->weight_decay));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "beta1", &o->beta1));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "beta2", &o->beta2));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "eps", &o->eps));
  TALLY_RETURN_IF_ERROR(
      ReadDouble(n, p, "clip_grad_norm", &o->clip_grad_norm));
  if (const YAML::Node betas = n["betas"]) {
    if (!betas.IsSequence() || betas.size() != 2) {
      return FieldError("optimizer.betas", "must be a list of two numbers");
    }
    YAML::Node pair(YAML::NodeType::Map);
    pair["beta1"] = betas[0];
    pair["beta2"] = betas[1];
    TALLY_RETURN_IF_ERROR(
        ReadDouble(pair, "optimizer.betas", "beta1", &o->beta1));
    TALLY_RETURN_IF_ERROR(
        ReadDouble(pair, "optimizer.betas", "beta2", &o->beta2));
  }
  TALLY_RETURN_IF_ERROR(ParseSchedule(n["schedule"], o));
  if (absl::Status s = ValidateOptimizerConfig(*o); !s.ok()) {
    return FieldError(p, s.message());
  }
  return absl::OkStatus();
}

// A tensor's shape: a list of at most 8 sizes in [min, kMaxDim].
absl::Status ReadShape(const YAML::Node& shape, const std::string& at,
                       int64_t min, Shape* out) {
  if (!shape || !shape.IsSequence() || shape.size() > 8) {
    return FieldError(at, "must be a list of at most 8 sizes");
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t v = 0;
    if (!shape[d].IsScalar() || !YAML::convert<int64_t>::decode(shape[d], v) ||
        v < min || v > kMaxDim) {
      return FieldError(
          at, absl::StrCat("sizes must be in [", min, ", ", kMaxDim, "]"));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
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

// model.embeddings: [{name, dim, num_embeddings, ids, combiner, init,
// init_scale, optimizer: {type, lr, weight_decay, eps,
// initial_accumulator_value}}], for a Python model (the tables are its
// nn.Embedding / nn.EmbeddingBag modules of those names).
constexpr int64_t kMaxTables = 256;
constexpr int64_t kMaxTableDim = 4096;
constexpr int64_t kMaxTableRows = int64_t{1} << 40;

// A table's lazy Adam (torch.optim.SparseAdam: lr, betas, eps; no
// weight decay).
absl::Status ParseTableAdam(const YAML::Node& n, const std::string& p,
                            TableOptimizer* o) {
  o->type = TableOptimizer::Type::kAdam;
  o->eps = 1e-8;
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p, {"type", "lr", "betas", "eps"}));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "lr", &o->lr));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "eps", &o->eps));
  if (const YAML::Node betas = n["betas"]) {
    if (!betas.IsSequence() || betas.size() != 2) {
      return FieldError(p + ".betas", "must be a list of two numbers");
    }
    YAML::Node pair(YAML::NodeType::Map);
    pair["beta1"] = betas[0];
    pair["beta2"] = betas[1];
    TALLY_RETURN_IF_ERROR(ReadDouble(pair, p + ".betas", "beta1", &o->beta1));
    TALLY_RETURN_IF_ERROR(ReadDouble(pair, p + ".betas", "beta2", &o->beta2));
  }
  if (o->lr <= 0) return FieldError(p + ".lr", "must be positive");
  if (o->eps <= 0) return FieldError(p + ".eps", "must be positive");
  if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
    return FieldError(p + ".betas", "must each be in [0, 1)");
  return absl::OkStatus();
}

absl::Status ParseTableOptimizer(const YAML::Node& n, const std::string& p,
                                 double job_lr, TableOptimizer* o) {
  o->lr = job_lr;
  if (!n) return absl::OkStatus();
  std::string type = "sgd";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "type", &type));
  if (type == "sgd") {
    o->type = TableOptimizer::Type::kSgd;
  } else if (type == "adagrad") {
    o->type = TableOptimizer::Type::kAdagrad;
  } else if (type == "adam") {
    return ParseTableAdam(n, p, o);
  } else {
    return FieldError(p + ".type",
                      absl::StrCat("unknown table optimizer '", type,
                                   "' (known: sgd, adagrad, adam)"));
  }
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p,
                                  {"type", "lr", "weight_decay", "eps",
                                   "initial_accumulator_value"}));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "lr", &o->lr));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "weight_decay", &o->weight_decay));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "eps", &o->eps));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "initial_accumulator_value",
                                   &o->initial_accumulator_value));
  if (o->lr <= 0) return FieldError(p + ".lr", "must be positive");
  if (o->weight_decay < 0)
    return FieldError(p + ".weight_decay", "must be >= 0");
  if (o->eps <= 0) return FieldError(p + ".eps", "must be positive");
  if (o->initial_accumulator_value < 0)
    return FieldError(p + ".initial_accumulator_value", "must be >= 0");
  return absl::OkStatus();
}

// A table's ids, combiner and initialiser.
absl::Status ParseTableLookup(const YAML::Node& n, const std::string& p,
                              EmbeddingTableSpec* t) {
  std::string ids = "hashed";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "ids", &ids));
  if (t->dynamic()) {
    if (n["ids"]) {
      return FieldError(p + ".ids",
                        "is for a fixed table; a dynamic table's rows are "
                        "keyed by the ids themselves");
    }
  } else if (ids == "hashed") {
    t->ids = TableIds::kHashed;
  } else if (ids == "direct") {
    t->ids = TableIds::kDirect;
  } else {
    return FieldError(p + ".ids", absl::StrCat("must be hashed or direct, got '",
                                               ids, "'"));
  }
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "combiner", &t->combiner));
  if (!t->combiner.empty() && t->combiner != "sum" && t->combiner != "mean") {
    return FieldError(p + ".combiner",
                      absl::StrCat("must be sum or mean (nn.EmbeddingBag's "
                                   "mode), got '", t->combiner, "'"));
  }
  std::string init = "normal";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "init", &init));
  if (init == "normal") {
    t->init = TableInit::kNormal;
    t->init_scale = 1.0;
  } else if (init == "uniform") {
    t->init = TableInit::kUniform;
    if (t->dynamic() && !n["init_scale"]) {
      return FieldError(p + ".init_scale",
                        "is required with init: uniform on a dynamic table "
                        "(there is no num_embeddings to take sqrt(1/n) of)");
    }
    if (!t->dynamic())
      t->init_scale = std::sqrt(1.0 / static_cast<double>(t->num_embeddings));
  } else if (init == "zeros") {
    t->init = TableInit::kZeros;
  } else {
    return FieldError(p + ".init", absl::StrCat("must be normal, uniform or "
                                                "zeros, got '", init, "'"));
  }
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "init_scale", &t->init_scale));
  if (t->init_scale < 0) return FieldError(p + ".init_scale", "must be >= 0");
  return absl::OkStatus();
}

// The input columns a table looks up (features).
absl::Status ParseTableFeatures(const YAML::Node& f, const std::string& p,
                                EmbeddingTableSpec* t) {
  if (f) {
    if (!f.IsSequence() || f.size() == 0 || f.size() > 4096) {
      return FieldError(p,
                        "must list the input columns the table looks up");
    }
    for (size_t i = 0; i < f.size(); ++i) {
      YAML::Node one(YAML::NodeType::Map);
      one["c"] = f[i];
      int64_t c = 0;
      TALLY_RETURN_IF_ERROR(ReadInt(one, absl::StrCat(p, "[", i, "]"),
                                    "c", 0, kMaxDim - 1, &c));
      t->features.push_back(c);
    }
  }
  return absl::OkStatus();
}

// A fixed table's num_embeddings, or a dynamic one's bounds.
absl::Status ParseTableRows(const YAML::Node& n, const std::string& p,
                            EmbeddingTableSpec* t) {
  bool dynamic = false;
  TALLY_RETURN_IF_ERROR(ReadBool(n, p, "dynamic", &dynamic));
  if (!dynamic) {
    for (const char* key : {"max_rows", "evict_after_steps", "min_count"}) {
      if (n[key]) {
        return FieldError(absl::StrCat(p, ".", key),
                          "is for a dynamic table (dynamic: true)");
      }
    }
    if (!n["num_embeddings"])
      return FieldError(p + ".num_embeddings", "is required");
    return ReadInt(n, p, "num_embeddings", 1, kMaxTableRows,
                   &t->num_embeddings);
  }
  if (n["num_embeddings"]) {
    return FieldError(p + ".num_embeddings",
                      "is for a fixed table; a dynamic table makes a row for "
                      "each id it is given (bound it with max_rows)");
  }
  t->ids = TableIds::kDynamic;
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "max_rows", 0, kMaxTableRows, &t->max_rows));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "evict_after_steps", 0,
                                int64_t{1} << 40, &t->evict_after_steps));
  return ReadInt(n, p, "min_count", 1, 255, &t->min_count);
}

absl::Status ParseTable(const YAML::Node& n, const std::string& p,
                        double job_lr, EmbeddingTableSpec* t) {
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p,
      {"name", "dim", "num_embeddings", "dynamic", "max_rows",
       "evict_after_steps", "min_count", "ids", "combiner", "init",
       "init_scale", "optimizer", "features"}));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "name", &t->name));
  if (t->name.empty() || t->name.size() > 256) {
    return FieldError(p + ".name",
                      "must name the model's nn.Embedding or nn.EmbeddingBag "
                      "(its module path, e.g. emb or tables.3)");
  }
  if (!n["dim"]) return FieldError(p + ".dim", "is required");
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "dim", 1, kMaxTableDim, &t->dim));
  TALLY_RETURN_IF_ERROR(ParseTableRows(n, p, t));
  TALLY_RETURN_IF_ERROR(ParseTableLookup(n, p, t));
  TALLY_RETURN_IF_ERROR(
      ParseTableOptimizer(n["optimizer"], p + ".optimizer", job_lr,
                          &t->optimizer));
  TALLY_RETURN_IF_ERROR(
      ParseTableFeatures(n["features"], p + ".features", t));
  t->salt = TableSalt(t->name);
  return absl::OkStatus();
}

absl::Status ParseEmbeddings(const YAML::Node& n, JobSpec* spec) {
  if (!n) return absl::OkStatus();
  const std::string p = "model.embeddings";
  if (!n.IsSequence()) return FieldError(p, "must be a list of tables");
  if (!spec->is_python) {
    return FieldError(p, "tables are a Python model's nn.Embedding and "
                         "nn.EmbeddingBag modules: they need model.python");
  }
  if (static_cast<int64_t>(n.size()) > kMaxTables) {
    return FieldError(p, absl::StrCat(n.size(), " tables, over the limit of ",
                                      kMaxTables));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < n.size(); ++i) {
    EmbeddingTableSpec t;
    TALLY_RETURN_IF_ERROR(ParseTable(n[i], absl::StrCat(p, "[", i, "]"),
                                     spec->optimizer.lr, &t));
    if (!names.insert(t.name).second) {
      return FieldError(absl::StrCat(p, "[", i, "].name"),
                        absl::StrCat("table '", t.name, "' is listed twice"));
    }
    spec->embeddings.push_back(std::move(t));
  }
  return absl::OkStatus();
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

// A generated dataset is made on every worker: its values and its teacher
// network's.
absl::Status CheckSyntheticFits(const SpecLimits& limits, const JobSpec& spec) {
  if (spec.dataset.name == "clicks") {
    const ClicksOptions& c = spec.dataset.clicks;
    const int64_t values = (c.integer_features + c.categorical_features) *
                               (c.train_size + c.test_size) +
                           c.cardinality;
    if (values > limits.max_dataset_values) {
      return FieldError("dataset",
                        absl::StrCat("a clicks dataset of ", values,
                                     " values, over the limit of ",
                                     limits.max_dataset_values,
                                     " (max_dataset_values)"));
    }
    return absl::OkStatus();
  }
  if (spec.dataset.name != "synthetic") return absl::OkStatus();
  const SyntheticOptions& s = spec.dataset.synthetic;
  const int64_t values = s.features * (s.train_size + s.test_size) +
                         s.teacher_hidden * (s.features + s.num_classes);
  if (values > limits.max_dataset_values) {
    return FieldError("dataset",
                      absl::StrCat("a synthetic dataset of ", values,
                                   " values, over the limit of ",
                                   limits.max_dataset_values,
                                   " (max_dataset_values)"));
  }
  return absl::OkStatus();
}

// The model against the data and the limits, before anything is allocated:
// its layout, its size, its activations, a generated dataset's size, the
// last layer against the classes.
// A batch's inputs and labels, which every worker's loader allocates.
absl::Status CheckBatchFits(const SpecLimits& limits, const JobSpec& spec) {
  Shape batch = spec.input_shape;
  batch.insert(batch.begin(), spec.training.batch_size);
  int64_t inputs = 0, labels = 0;
  Shape label_rows = spec.label_shape;
  label_rows.insert(label_rows.begin(), spec.training.batch_size);
  if (!CheckedNumElements(batch, &inputs) ||
      !CheckedNumElements(label_rows, &labels) ||
      inputs > limits.max_batch_values - labels) {
    return FieldError(
        "training.batch_size",
        absl::StrCat("batches of ", spec.training.batch_size, " samples of ",
                     ShapeString(spec.input_shape), " are over the limit of ",
                     limits.max_batch_values, " values (max_batch_values)"));
  }
  return absl::OkStatus();
}

absl::Status CheckModelFits(const SpecLimits& limits, JobSpec* spec) {
  // A Python model's shapes are the client's and the workers' to check
  // (they build it); its size was checked with its parameters.
  if (spec->is_python) return CheckSyntheticFits(limits, *spec);
  auto layout = ComputeLayout(spec->layers, spec->input_shape);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.", layout.status().message(), " (dataset samples are ",
        ShapeString(spec->input_shape), ")"));
  }
  if (layout->num_params > limits.max_params) {
    return FieldError(
        "model", absl::StrCat(layout->num_params,
                              " parameters, over the limit of ",
                              limits.max_params, " (max_params)"));
  }
  for (size_t i = 0; i < layout->activation_shapes.size(); ++i) {
    const int64_t n = NumElements(layout->activation_shapes[i]);  // checked
    if (n > limits.max_sample_elements) {
      return FieldError(
          absl::StrCat("model.layers[", i, "]"),
          absl::StrCat("its output has ", n,
                       " elements per sample, over the limit of ",
                       limits.max_sample_elements, " (max_sample_elements)"));
    }
  }
  TALLY_RETURN_IF_ERROR(CheckSyntheticFits(limits, *spec));
  const Shape& out = layout->activation_shapes.back();
  if (out != Shape{spec->num_classes}) {
    return FieldError(
        "model",
        absl::StrCat("the last layer yields ", ShapeString(out),
                     " per sample but the dataset has ", spec->num_classes,
                     " classes: end with a linear layer of out_features ",
                     spec->num_classes));
  }
  spec->layout = *std::move(layout);
  return absl::OkStatus();
}

// Token ids (text) go to a Python model, whose embedding takes them; the
// native engine's layers take floats. Their targets are a sequence, which
// mse's one-hot cannot take.
absl::Status CheckTokenModel(const JobSpec& spec) {
  if (spec.input_type != InputType::kInt64) return absl::OkStatus();
  if (!spec.is_python) {
    return FieldError("model",
                      absl::StrCat("a ", spec.dataset.name,
                                   " dataset's samples are int64 ids; train "
                                   "it with a Python model (model.python), "
                                   "whose embeddings take them"));
  }
  if (spec.loss == LossKind::kMse && !spec.label_shape.empty()) {
    return FieldError("model.loss",
                      "mse takes one class a sample; a text dataset's targets "
                      "are next tokens (cross_entropy or model)");
  }
  return absl::OkStatus();
}

// The tables' input columns are the samples', and the rows' own
// consistency needs tables.
absl::Status CheckEmbeddings(const JobSpec& spec) {
  const ConsistencySpec& rule = spec.training.consistency;
  if (rule.tables_async && rule.mode != ConsistencyMode::kAsync &&
      spec.embeddings.empty()) {
    return FieldError("training.consistency.tables",
                      "applies to a model with tables (model.embeddings)");
  }
  for (size_t i = 0; i < spec.embeddings.size(); ++i) {
    for (int64_t c : spec.embeddings[i].features) {
      if (spec.input_type != InputType::kInt64 || spec.input_shape.size() != 1 ||
          c >= spec.input_shape[0]) {
        return FieldError(
            absl::StrCat("model.embeddings[", i, "].features"),
            absl::StrCat("column ", c, " is not one of the samples' ",
                         spec.input_type == InputType::kInt64 &&
                                 spec.input_shape.size() == 1
                             ? absl::StrCat(spec.input_shape[0], " int64 ids")
                             : std::string("inputs (features need 1-D int64 "
                                           "samples, as clicks')")));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseAndValidate(const YAML::Node& root,
                                         const SpecLimits& limits) {
  TALLY_RETURN_IF_ERROR(CheckKeys(
      root, "",
      {"version", "name", "model", "dataset", "training", "optimizer"}));
  JobSpec spec;
  int64_t version = 1;
  TALLY_RETURN_IF_ERROR(ReadInt(root, "", "version", 1, 1, &version));
  TALLY_RETURN_IF_ERROR(ReadString(root, "", "name", &spec.name));
  TALLY_RETURN_IF_ERROR(ParseDataset(root["dataset"], &spec.dataset));
  TALLY_RETURN_IF_ERROR(ParseTraining(root["training"], &spec.training));
  TALLY_RETURN_IF_ERROR(ParseOptimizer(root["optimizer"], &spec.optimizer));
  TALLY_RETURN_IF_ERROR(DescribeDataset(&spec));
  TALLY_RETURN_IF_ERROR(ParseModel(root["model"], limits, &spec));
  TALLY_RETURN_IF_ERROR(CheckTokenModel(spec));
  if (spec.optimizer.clip_grad_norm > 0 && !spec.is_python) {
    // The native engine pushes each layer's gradient while backward still
    // runs, before the norm is known.
    return FieldError("optimizer.clip_grad_norm",
                      "is for a Python model (model.python); the native "
                      "engine does not clip");
  }
  TALLY_RETURN_IF_ERROR(CheckEmbeddings(spec));
  if (spec.loss == LossKind::kBinaryCrossEntropy &&
      (spec.num_classes != 2 || !spec.label_shape.empty())) {
    return FieldError("model.loss",
                      absl::StrCat("binary_cross_entropy takes 0/1 labels, "
                                   "one a sample; the dataset has ",
                                   spec.num_classes, " classes"));
  }
  if (!spec.embeddings.empty() &&
      spec.training.consistency.backup_workers > 0) {
    // A backup's late rows would be refused as of a closed step, failing
    // its step instead of being dropped as a late dense push is.
    return FieldError("model.embeddings",
                      "tables do not train with backup_workers (for now)");
  }
  TALLY_RETURN_IF_ERROR(CheckModelFits(limits, &spec));
  TALLY_RETURN_IF_ERROR(CheckBatchFits(limits, spec));
  return spec;
}

}  // namespace

const char* LossName(LossKind loss) {
  switch (loss) {
    case LossKind::kCrossEntropy:
      return "cross_entropy";
    case LossKind::kMse:
      return "mse";
    case LossKind::kModel:
      return "model";
    case LossKind::kBinaryCrossEntropy:
      return "binary_cross_entropy";
  }
  return "cross_entropy";
}

const char* ConsistencyModeName(ConsistencyMode mode) {
  switch (mode) {
    case ConsistencyMode::kBsp:
      return "bsp";
    case ConsistencyMode::kSsp:
      return "ssp";
    case ConsistencyMode::kAsync:
      return "async";
  }
  return "bsp";
}

namespace {

constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max();

int64_t SatMul(int64_t a, int64_t b) {
  return b != 0 && a > kNoEnd / b ? kNoEnd : a * b;
}
int64_t SatAdd(int64_t a, int64_t b) { return a > kNoEnd - b ? kNoEnd : a + b; }

// Epochs of world period i of `s` (the last runs to the end).
int64_t PeriodEpochs(const Schedule& s, size_t i) {
  const int64_t end = std::min(
      s.epochs, i + 1 < s.worlds.size() ? s.worlds[i + 1].first_epoch : s.epochs);
  return std::max<int64_t>(0, end - s.worlds[i].first_epoch);
}

// Steps (or versions) from the start to the first epoch of period i's
// epoch `epoch` (within it), summed over the periods before.
template <typename PerEpoch>
int64_t StartOf(const Schedule& s, int64_t epoch, PerEpoch per_epoch) {
  int64_t at = 0;
  for (size_t i = 0; i < s.worlds.size(); ++i) {
    const int64_t first = s.worlds[i].first_epoch;
    const int64_t last = i + 1 < s.worlds.size() ? s.worlds[i + 1].first_epoch
                                                 : kNoEnd;
    const int64_t n = std::min(epoch, last) - first;
    if (n <= 0) break;
    at = SatAdd(at, SatMul(n, per_epoch(s.worlds[i].world)));
    if (epoch <= last) break;
  }
  return at;
}

void Total(Schedule& s, int64_t max_steps) {
  s.total_steps = 0;
  for (size_t i = 0; i < s.worlds.size(); ++i) {
    s.total_steps = SatAdd(
        s.total_steps,
        SatMul(PeriodEpochs(s, i), s.VersionsPerEpoch(s.worlds[i].world)));
  }
  if (max_steps > 0) s.total_steps = std::min(s.total_steps, max_steps);
}

}  // namespace

int64_t Schedule::StepsPerEpoch(int world) const {
  world = std::max(1, world);
  const int64_t largest_shard = (train_size + world - 1) / world;
  return std::max<int64_t>(1, (largest_shard + batch_size - 1) / batch_size);
}

int64_t Schedule::VersionsPerEpoch(int world) const {
  return StepsPerEpoch(world) * (async ? std::max(1, world) : 1);
}

Schedule::Place Schedule::Locate(int64_t step) const {
  Place p;
  int64_t first = 0;  // the period's first step
  for (size_t i = 0; i < worlds.size(); ++i) {
    const int64_t spe = StepsPerEpoch(worlds[i].world);
    const bool last = i + 1 == worlds.size();
    const int64_t steps =
        last ? kNoEnd
             : SatMul(worlds[i + 1].first_epoch - worlds[i].first_epoch, spe);
    if (last || step - first < steps) {
      p.world = worlds[i].world;
      p.steps_per_epoch = spe;
      p.epoch = worlds[i].first_epoch + (step - first) / spe;
      p.index = (step - first) % spe;
      p.period_end = last ? kNoEnd : first + steps;
      return p;
    }
    first = SatAdd(first, steps);
  }
  return p;
}

int64_t Schedule::EpochStart(int64_t epoch) const {
  return StartOf(*this, epoch, [this](int w) { return StepsPerEpoch(w); });
}

int64_t Schedule::EpochStartVersion(int64_t epoch) const {
  return StartOf(*this, epoch, [this](int w) { return VersionsPerEpoch(w); });
}

int64_t Schedule::EpochOfVersion(int64_t v) const {
  int64_t first = 0;
  for (size_t i = 0; i < worlds.size(); ++i) {
    const int64_t vpe = VersionsPerEpoch(worlds[i].world);
    const int64_t span = SatMul(PeriodEpochs(*this, i), vpe);
    if (v - first < span || i + 1 == worlds.size()) {
      return std::min(epochs - 1, worlds[i].first_epoch + (v - first) / vpe);
    }
    first = SatAdd(first, span);
  }
  return 0;
}

int64_t Schedule::ClockOfVersion(int64_t v) const {
  const int64_t e = EpochOfVersion(v);
  const int64_t start = EpochStart(e);
  const int world = Locate(start).world;
  const int64_t per_step = async ? std::max(1, world) : 1;
  return SatAdd(start, std::max<int64_t>(0, v - EpochStartVersion(e)) /
                           per_step);
}

int64_t Schedule::FirstStepOfRank(int rank) const {
  for (const WorldPeriod& p : worlds) {
    if (rank < p.world) return EpochStart(p.first_epoch);
  }
  return EpochStart(epochs);
}

Schedule MakeSchedule(const JobSpec& spec, int64_t train_size, int world) {
  Schedule s;
  s.train_size = train_size;
  s.batch_size = std::max<int64_t>(1, spec.training.batch_size);
  s.epochs = std::max<int64_t>(1, spec.training.epochs);
  s.async = spec.training.consistency.mode == ConsistencyMode::kAsync;
  s.worlds = {WorldPeriod{0, std::max(1, world)}};
  s.steps_per_epoch = s.StepsPerEpoch(world);
  // Saturating: a schedule longer than any run could be is still a bound.
  s.versions_per_epoch = s.VersionsPerEpoch(world);  // at most 1024 * 2^20
  Total(s, spec.training.max_steps);
  return s;
}

Schedule GrowSchedule(const Schedule& s, int64_t epoch, int world,
                      int64_t max_steps) {
  Schedule g = s;
  while (!g.worlds.empty() && g.worlds.back().first_epoch >= epoch)
    g.worlds.pop_back();
  g.worlds.push_back(WorldPeriod{epoch, std::max(1, world)});
  g.steps_per_epoch = g.StepsPerEpoch(g.worlds.front().world);
  g.versions_per_epoch = g.VersionsPerEpoch(g.worlds.front().world);
  ++g.plan;
  Total(g, max_steps);
  return g;
}

Schedule ScheduleOf(const JobSpec& spec, int64_t train_size,
                    const std::vector<WorldPeriod>& worlds, int64_t plan) {
  Schedule s = MakeSchedule(
      spec, train_size,
      worlds.empty() ? 1 : std::clamp(worlds.front().world, 1, 1024));
  // As GrowSchedule made them; whatever a peer sent, a later period
  // replaces those at or past its epoch, and no world is below one.
  for (size_t i = 1; i < worlds.size(); ++i) {
    if (worlds[i].first_epoch >= s.epochs) break;  // past the end: nothing
    s = GrowSchedule(s, std::max<int64_t>(1, worlds[i].first_epoch),
                     std::clamp(worlds[i].world, 1, 1024),
                     spec.training.max_steps);
  }
  s.plan = plan;
  return s;
}

int64_t TrainSize(const DatasetSpec& spec) {
  if (spec.name == "synthetic") return spec.synthetic.train_size;
  if (spec.name == "arrays") return spec.arrays.train_size;
  if (spec.name == "csv") return spec.csv.train_size;
  if (spec.name == "image_folder") return spec.images.train_size;
  if (spec.name == "text") return spec.text.train_size;
  if (spec.name == "clicks") return spec.clicks.train_size;
  if (spec.name == "criteo") return spec.criteo.train_size;
  return 60000;  // fashion-mnist
}

const char* MetricLossName(const JobSpec& spec) {
  if (spec.loss == LossKind::kCrossEntropy && !spec.label_shape.empty()) {
    return "token_cross_entropy";
  }
  return LossName(spec.loss);
}

namespace {

absl::Status DescribeSamples(const DatasetSpec& spec, Shape* input_shape,
                             int* num_classes) {
  if (spec.name == "fashion-mnist") {
    *input_shape = {1, 28, 28};
    *num_classes = 10;
    return absl::OkStatus();
  }
  if (spec.name == "synthetic") {
    *input_shape = {spec.synthetic.features};
    *num_classes = spec.synthetic.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "clicks") {
    *input_shape = {spec.clicks.integer_features +
                    spec.clicks.categorical_features};
    *num_classes = 2;
    return absl::OkStatus();
  }
  if (spec.name == "criteo") {
    *input_shape = {spec.criteo.integer_features +
                    spec.criteo.categorical_features};
    *num_classes = 2;
    return absl::OkStatus();
  }
  if (spec.name == "arrays") {
    *input_shape = spec.arrays.shape;
    *num_classes = spec.arrays.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "csv") {
    *input_shape = {spec.csv.num_features};
    *num_classes = spec.csv.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "image_folder") {
    *input_shape = spec.images.shape;
    *num_classes = spec.images.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "text") {
    *input_shape = {spec.text.seq_len};
    *num_classes = static_cast<int>(spec.text.vocab_size);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dataset.name: unknown dataset '", spec.name, "'"));
}

}  // namespace

absl::Status DescribeDataset(JobSpec* spec) {
  TALLY_RETURN_IF_ERROR(
      DescribeSamples(spec->dataset, &spec->input_shape, &spec->num_classes));
  if (spec->dataset.name == "text") {
    spec->input_type = InputType::kInt64;
    spec->label_shape = {spec->dataset.text.seq_len};
  }
  if (spec->dataset.name == "clicks" || spec->dataset.name == "criteo")
    spec->input_type = InputType::kInt64;
  return absl::OkStatus();
}

namespace {

// The arrays' splits, mapped; the test split (evaluated in one go) read
// into memory. A worker whose files disagree with the spec says how.
absl::StatusOr<TrainTest> OpenArrays(const ArraysSpec& a) {
  TrainTest out;
  TALLY_ASSIGN_OR_RETURN(
      std::shared_ptr<const NpyArrays> train,
      NpyArrays::Open(a.train, a.shape, a.num_classes));
  if (train->size() != a.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        a.train.file.empty() ? a.train.inputs : a.train.file, " holds ",
        train->size(),
        " samples; the job was submitted with dataset.train_size ",
        a.train_size));
  }
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = a.shape;
    d->num_classes = a.num_classes;
  }
  out.train.source = std::move(train);
  Fingerprint f;
  out.train.source->Describe(&f);
  if (!a.test.inputs.empty()) {
    TALLY_ASSIGN_OR_RETURN(out.test.source,
                           NpyArrays::Open(a.test, a.shape, a.num_classes));
    out.test.source->Describe(&f);
    TALLY_RETURN_IF_ERROR(out.test.Materialize());
  }
  out.fingerprint = f.Text();
  return out;
}

// A file's size and its first 4 KiB (a CSV's header and first rows).
void DescribeFile(const std::string& path, Fingerprint* f) {
  absl::StatusOr<DataFile> file = DataFile::Open(path);
  std::string head(4096, '\0');
  ssize_t n = file.ok() ? ::pread(file->fd(), head.data(), head.size(), 0) : 0;
  head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  f->AddFile(file.ok() ? file->size() : -1);
  f->Add(head);
}

// A table's splits, checked against the spec.
absl::StatusOr<TrainTest> OpenCsv(const CsvSpec& c) {
  CsvOptions o;
  o.label = c.label;
  o.features = c.features;
  o.num_classes = c.num_classes;
  TrainTest out;
  TALLY_ASSIGN_OR_RETURN(out.train, LoadCsv(c.train, o));
  if (out.train.sample_numel() != c.num_features ||
      out.train.size() != c.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        c.train, " holds ", out.train.size(), " rows of ",
        out.train.sample_numel(), " features; the job was submitted with ",
        c.train_size, " of ", c.num_features));
  }
  if (!c.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(out.test, LoadCsv(c.test, o));
    if (out.test.sample_numel() != c.num_features) {
      return absl::FailedPreconditionError(
          absl::StrCat(c.test, " has ", out.test.sample_numel(),
                       " features; ", c.train, " ", c.num_features));
    }
  } else {
    out.test.sample_shape = out.train.sample_shape;
    out.test.num_classes = c.num_classes;
  }
  Fingerprint f;
  for (const std::string* path : {&c.train, &c.test}) {
    if (!path->empty()) DescribeFile(*path, &f);
  }
  out.fingerprint = f.Text();
  return out;
}

// An image folder's splits: the files listed (each worker checks its own
// count against the spec's), the test split decoded into memory.
absl::StatusOr<TrainTest> OpenImageFolder(const ImageFolderSpec& f,
                                          const DataRoots& roots) {
  ImageFolderOptions o;
  o.shape = f.shape;
  o.fit = f.fit;
  o.mean = f.mean;
  o.std = f.std;
  o.crop_padding = f.crop_padding;
  o.hflip = f.hflip;
  o.skip_bad = f.skip_bad;
  TALLY_ASSIGN_OR_RETURN(ImageFolderListing train, ListImageFolder(f.train, nullptr, roots));
  if (static_cast<int>(train.classes.size()) != f.num_classes ||
      static_cast<int64_t>(train.files.size()) != f.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        f.train, " holds ", train.files.size(), " images in ",
        train.classes.size(), " classes; the job was submitted with ",
        f.train_size, " in ", f.num_classes,
        " (dataset.train_size, dataset.classes)"));
  }
  TrainTest out;
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = f.shape;
    d->num_classes = f.num_classes;
  }
  std::vector<std::string> classes = train.classes;
  TALLY_ASSIGN_OR_RETURN(out.train.source,
                         ImageFolder::Open(std::move(train), o, true));
  Fingerprint print;
  out.train.source->Describe(&print);
  if (!f.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(ImageFolderListing test,
                           ListImageFolder(f.test, &classes, roots));
    TALLY_ASSIGN_OR_RETURN(out.test.source,
                           ImageFolder::Open(std::move(test), o, false));
    out.test.source->Describe(&print);
    TALLY_RETURN_IF_ERROR(out.test.Materialize());
  }
  out.fingerprint = print.Text();
  return out;
}

// The files of a list of paths and globs, in order.
absl::StatusOr<std::vector<std::string>> ExpandAll(
    const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    TALLY_ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandGlob(p));
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

// Criteo logs' splits, both read as they are gathered (evaluation gathers
// the test split in pieces). A worker whose files
// hold another count of lines than the job was submitted with says so.
absl::StatusOr<TrainTest> OpenCriteo(const CriteoSpec& c) {
  CriteoOptions o;
  o.integer_features = c.integer_features;
  o.categorical_features = c.categorical_features;
  TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(c.train));
  o.end = 1.0 - c.test_fraction;
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const CriteoLines> train,
                         CriteoLines::Open(o));
  if (train->size() != c.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(c.train, ", "), " hold ", train->size(),
        " training lines (", train->lines(),
        " in all); the job was submitted with dataset.train_size ",
        c.train_size));
  }
  if (!c.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(c.test));
    o.end = 1.0;
  } else {
    o.begin = 1.0 - c.test_fraction;
    o.end = 1.0;
  }
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const CriteoLines> test,
                         CriteoLines::Open(o));
  TrainTest out;
  Fingerprint print;
  train->Describe(&print);
  test->Describe(&print);
  out.fingerprint = print.Text();
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = {c.integer_features + c.categorical_features};
    d->input_type = InputType::kInt64;
    d->num_classes = 2;
  }
  out.train.source = std::move(train);
  if (test->size() > 0) out.test.source = std::move(test);
  return out;
}

// A corpus's splits, both read as they are gathered (evaluation gathers
// the test split in pieces). A worker whose files give another vocabulary
// or another count of windows than the job was submitted with says so.
absl::StatusOr<TrainTest> OpenText(const TextSpec& t) {
  TextOptions o;
  o.vocab = t.vocab;
  o.seq_len = t.seq_len;
  TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(t.train));
  o.end = 1.0 - t.test_fraction;
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const TextTokens> train,
                         TextTokens::Open(o));
  if (train->vocabulary() != t.vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        t.vocab, " holds ", train->vocabulary(),
        " tokens; the job was submitted with dataset.vocab_size ",
        t.vocab_size));
  }
  if (train->size() != t.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(t.train, ", "), " hold ", train->size(),
        " training windows of ", t.seq_len + 1, " tokens (", train->tokens(),
        " tokens); the job was submitted with dataset.train_size ",
        t.train_size));
  }
  if (!t.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(t.test));
    o.end = 1.0;
  } else {
    o.begin = 1.0 - t.test_fraction;
    o.end = 1.0;
  }
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const TextTokens> test,
                         TextTokens::Open(o));
  TrainTest out;
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = {t.seq_len};
    d->input_type = InputType::kInt64;
    d->label_shape = {t.seq_len};
    d->num_classes = static_cast<int>(t.vocab_size);
  }
  Fingerprint f;
  train->Describe(&f);
  if (!t.test.empty()) test->Describe(&f);
  out.fingerprint = f.Text();
  out.train.source = std::move(train);
  if (test->size() > 0) out.test.source = std::move(test);
  return out;
}

}  // namespace

namespace {

// A field's path as its reader opens it, literally, under the roots.
absl::Status CheckPath(absl::string_view what, const std::string& path,
                       const DataRoots& roots) {
  if (path.empty()) return absl::OkStatus();
  return roots.Resolve(what, path).status();
}

// What a glob can match: at most this many files a pattern.
constexpr size_t kMaxGlobMatches = size_t{1} << 20;

// Each path of a list its reader expands (globs), under the roots: the
// pattern's fixed directory first, lexically, so that a pattern outside
// the roots is refused before it is expanded (its matches never reach a
// message), then every match.
absl::Status CheckPaths(absl::string_view what,
                        const std::vector<std::string>& paths,
                        const DataRoots& roots) {
  for (const std::string& p : paths) {
    if (p.empty()) continue;
    const size_t glob = p.find_first_of("*?[");
    if (glob != std::string::npos) {
      const size_t slash = p.rfind('/', glob);
      const std::string dir =
          slash == std::string::npos ? "." : p.substr(0, slash + 1);
      if (!roots.Contains(DataRoots::Absolute(dir))) {
        return roots.Outside(what, p);
      }
    }
    TALLY_ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandGlob(p));
    if (files.size() > kMaxGlobMatches) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": ", p, " matches more than ", kMaxGlobMatches,
                       " files"));
    }
    for (const std::string& file : files) {
      TALLY_RETURN_IF_ERROR(roots.Resolve(what, file).status());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDataPaths(const DatasetSpec& spec, const DataRoots& roots) {
  if (roots.any()) return absl::OkStatus();
  if (spec.name == "fashion-mnist") {
    for (const char* f :
         {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      TALLY_RETURN_IF_ERROR(CheckPath(
          "dataset.root", absl::StrCat(spec.root, "/", f), roots));
    }
    return absl::OkStatus();
  }
  if (spec.name == "arrays") {
    const ArraysSpec& a = spec.arrays;
    for (const ArrayFiles* split : {&a.train, &a.test}) {
      // With a file (.npz, .safetensors), inputs and labels are its keys.
      TALLY_RETURN_IF_ERROR(CheckPaths(
          split == &a.train ? "dataset.train" : "dataset.test",
          split->file.empty()
              ? std::vector<std::string>{split->inputs, split->labels}
              : std::vector<std::string>{split->file},
          roots));
    }
    return absl::OkStatus();
  }
  if (spec.name == "csv") {
    TALLY_RETURN_IF_ERROR(CheckPath("dataset.train", spec.csv.train, roots));
    return CheckPath("dataset.test", spec.csv.test, roots);
  }
  if (spec.name == "image_folder") {
    TALLY_RETURN_IF_ERROR(
        CheckPath("dataset.train", spec.images.train, roots));
    return CheckPath("dataset.test", spec.images.test, roots);
  }
  if (spec.name == "text") {
    TALLY_RETURN_IF_ERROR(CheckPaths("dataset.train", spec.text.train, roots));
    TALLY_RETURN_IF_ERROR(CheckPaths("dataset.test", spec.text.test, roots));
    return CheckPath("dataset.vocab", spec.text.vocab, roots);
  }
  if (spec.name == "criteo") {
    TALLY_RETURN_IF_ERROR(
        CheckPaths("dataset.train", spec.criteo.train, roots));
    return CheckPaths("dataset.test", spec.criteo.test, roots);
  }
  return absl::OkStatus();  // synthetic and clicks name no file
}

absl::StatusOr<TrainTest> OpenDataset(const DatasetSpec& spec,
                                      const DataRoots& roots) {
  TALLY_RETURN_IF_ERROR(CheckDataPaths(spec, roots));
  if (spec.name == "fashion-mnist") {
    return LoadFashionMnist(spec.root, spec.normalize);
  }
  if (spec.name == "synthetic") return MakeSynthetic(spec.synthetic);
  if (spec.name == "arrays") return OpenArrays(spec.arrays);
  if (spec.name == "csv") return OpenCsv(spec.csv);
  if (spec.name == "image_folder") return OpenImageFolder(spec.images, roots);
  if (spec.name == "text") return OpenText(spec.text);
  if (spec.name == "clicks") return MakeClicks(spec.clicks);
  if (spec.name == "criteo") return OpenCriteo(spec.criteo);
  return absl::InvalidArgumentError(
      absl::StrCat("dataset.name: unknown dataset '", spec.name, "'"));
}

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

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text,
                                     const SpecLimits& limits) {
  if (static_cast<int64_t>(text.size()) > limits.max_spec_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", text.size(), " bytes, over the limit of ",
                     limits.max_spec_bytes, " (max_spec_bytes)"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec is not valid YAML/JSON: ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        "job spec must be a mapping at the top level");
  }
  try {
    return ParseAndValidate(root, limits);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", e.what()));
  }
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read the job spec: ",
                                     text.status().message()));
  }
  auto spec = ParseJobSpec(*text);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace tally
