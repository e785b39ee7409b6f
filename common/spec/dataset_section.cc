// dataset: one parser a dataset name, each checking its own keys.
#include "common/spec/internal/sections.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/data/text.h"
#include "common/spec/internal/yaml_fields.h"
#include "common/status_macros.h"

namespace tally::spec_internal {

namespace {

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


}  // namespace

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

}  // namespace tally::spec_internal
