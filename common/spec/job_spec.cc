// ParseJobSpec: the YAML read, the sections parsed in order
// (internal/sections.h), then the checks across sections (the model against
// the data and the limits, the tables against the samples and the rule).
#include "common/spec/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec/internal/sections.h"
#include "common/spec/internal/yaml_fields.h"
#include "common/status_macros.h"

namespace tally {

namespace {

using spec_internal::CheckKeys;
using spec_internal::FieldError;
using spec_internal::ParseDataset;
using spec_internal::ParseModel;
using spec_internal::ParseOptimizer;
using spec_internal::ParseTraining;
using spec_internal::ReadInt;
using spec_internal::ReadString;

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

// The model against the data and the limits, before anything is allocated:
// its layout, its size, its activations, a generated dataset's size, the
// last layer against the classes.
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

// Why the job cannot have two copies of a range ("": it can). Two need
// steps that close, a plan that does not change and no tables
// (docs/cluster.md, "Replicated ranges").
const char* WhyOneCopy(const JobSpec& spec) {
  if (spec.training.consistency.mode == ConsistencyMode::kAsync) {
    // A push the lost primary applied alone could not be told to come
    // again: async commits are pushes applied one by one.
    return "two copies need steps that close (bsp or ssp)";
  }
  if (spec.training.ranks == 0 &&
      spec.training.max_workers > spec.training.workers) {
    // A job that grows changes its plan (its learning rate schedule's
    // length) on every copy apart from the steps the backup is sent.
    return "two copies are for a job that does not grow: fix "
           "training.workers, or set training.ranks";
  }
  if (!spec.embeddings.empty()) {
    // A backup makes its versions from the dense mean its primary sends;
    // table rows are stepped apart from it.
    return "a model with tables (model.embeddings) keeps one copy of each "
           "range (for now)";
  }
  return "";
}

// training.replicas: 2 where the job cannot have two copies is refused
// (unset, it has one: RangeCopies).
absl::Status CheckReplicas(const JobSpec& spec) {
  if (const char* why = WhyOneCopy(spec);
      spec.training.replicas > 1 && *why != '\0') {
    return FieldError("training.replicas", why);
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
  TALLY_RETURN_IF_ERROR(CheckReplicas(spec));
  TALLY_RETURN_IF_ERROR(CheckModelFits(limits, &spec));
  TALLY_RETURN_IF_ERROR(CheckBatchFits(limits, spec));
  return spec;
}

}  // namespace

int64_t RangeCopies(const JobSpec& spec) {
  if (spec.training.replicas > 0) return spec.training.replicas;
  // ssp, and bsp with backup workers, may ask for two; unset, they are for
  // plain bsp alone, whose failover the byte-identical tests cover.
  const ConsistencySpec& c = spec.training.consistency;
  return *WhyOneCopy(spec) == '\0' && c.mode == ConsistencyMode::kBsp &&
                 c.backup_workers == 0
             ? 2
             : 1;
}

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

const char* MetricLossName(const JobSpec& spec) {
  if (spec.loss == LossKind::kCrossEntropy && !spec.label_shape.empty()) {
    return "token_cross_entropy";
  }
  return LossName(spec.loss);
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
