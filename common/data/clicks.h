// Click logs: the layout every published recommendation benchmark uses
// (Criteo's: a 0/1 label, integer features, hashed categorical features),
// generated with a hidden teacher (dataset.name: clicks).
//
// A sample's inputs are int64 [integer_features + categorical_features]:
// the integer features (non-negative counts) first, then one raw id a
// categorical feature (a 32-bit hash, as Criteo's are). Its label is 1 for
// a click. A model takes log1p of the counts and looks the ids up in its
// tables (examples/dlrm).
#ifndef TALLY_COMMON_DATA_CLICKS_H_
#define TALLY_COMMON_DATA_CLICKS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"

namespace tally {

struct ClicksOptions {
  int64_t train_size = 16384;
  int64_t test_size = 4096;
  int64_t integer_features = 13;
  int64_t categorical_features = 26;
  // Distinct ids of each categorical feature, drawn Zipf(zipf): id rank r
  // with probability proportional to 1 / (r + 1)^zipf, so a few ids are
  // most of the traffic and most ids are rare, as in real logs.
  int64_t cardinality = 10000;
  double zipf = 1.05;
  uint64_t seed = 1;
};

// Deterministic by seed. The label of a sample is drawn with probability
// sigmoid(teacher logit): a weight for each (feature, id) and for each
// count's log1p, plus a bias that makes clicks about a quarter of the
// samples. *teacher_probabilities (may be null) gets each test sample's
// true click probability, from which a test knows the AUC a perfect model
// reaches.
absl::StatusOr<TrainTest> MakeClicks(const ClicksOptions& options,
                                     std::vector<double>* teacher_probabilities =
                                         nullptr);

// The area under the ROC curve of `scores` for 0/1 `labels` (ties count
// half), computed once over all of them: AUCs of parts cannot be averaged.
// 0.5 when either class is missing.
double Auc(const std::vector<double>& scores, const std::vector<int>& labels);

}  // namespace tally

#endif  // TALLY_COMMON_DATA_CLICKS_H_
