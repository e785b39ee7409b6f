// The job spec's section parsers: each reads one top-level section (or
// part of one) into the JobSpec, checking what that section alone can
// check; ParseJobSpec (job_spec.cc) calls them in order and then checks the
// sections against each other. Each returns kInvalidArgument naming the
// offending field's path. Internal to common/spec.
//
//   dataset_section.cc     dataset:
//   training_section.cc    training: (with its consistency rule), optimizer:
//   model_section.cc       model: (preset, layers or python, loss)
//   embeddings_section.cc  model.embeddings:
//
// All functions are thread-safe (they touch only their arguments).
#ifndef TALLY_COMMON_SPEC_INTERNAL_SECTIONS_H_
#define TALLY_COMMON_SPEC_INTERNAL_SECTIONS_H_

#include "absl/status/status.h"
#include "common/spec/job_spec.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace tally::spec_internal {

// dataset: required; its name picks the keys it takes.
absl::Status ParseDataset(const YAML::Node& node, DatasetSpec* d);

// training: optional; every field has a default.
absl::Status ParseTraining(const YAML::Node& n, TrainingSpec* t);

// optimizer: optional; sgd by default, checked by ValidateOptimizerConfig.
absl::Status ParseOptimizer(const YAML::Node& n, OptimizerConfig* o);

// model: required. Runs after DescribeDataset: a preset's layers are made
// for spec->input_shape and spec->num_classes. Reads model.embeddings with
// ParseEmbeddings, after the optimizer (a table's lr defaults to the job's).
absl::Status ParseModel(const YAML::Node& model, const SpecLimits& limits,
                        JobSpec* spec);

// model.embeddings (`n` may be missing): the Python model's tables.
absl::Status ParseEmbeddings(const YAML::Node& n, JobSpec* spec);

}  // namespace tally::spec_internal

#endif  // TALLY_COMMON_SPEC_INTERNAL_SECTIONS_H_
