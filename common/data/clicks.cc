#include "common/data/clicks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/random.h"

namespace tally {

namespace {

// A normal value for key (counter-based: any worker computes the same).
double HashNormal(uint64_t seed, uint64_t key) {
  const double u1 = 1.0 - static_cast<double>(HashUniform(seed, 2 * key));
  const double u2 = static_cast<double>(HashUniform(seed, 2 * key + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// A uniform in [0, 1) with 53 bits, for sampling.
double Uniform53(uint64_t seed, uint64_t key) {
  return static_cast<double>(SplitMix64(SplitMix64(seed) ^ key) >> 11) *
         (1.0 / 9007199254740992.0);
}

// Sample `at` (over both splits) into x; its teacher logit.
double Sample(const ClicksOptions& o, const std::vector<double>& cdf,
              int64_t at, int64_t* x) {
  const int64_t width = o.integer_features + o.categorical_features;
  const uint64_t ids_seed = SplitMix64(o.seed ^ 0x1d5);
  const uint64_t teacher_seed = SplitMix64(o.seed ^ 0x7eac);
  const double scale = 1.0 / std::sqrt(static_cast<double>(width));
  double logit = -1.2;
  for (int64_t j = 0; j < o.integer_features; ++j) {
    // A count of geometric-like spread, its scale by feature.
    const double u = Uniform53(o.seed, static_cast<uint64_t>(at * width + j));
    const double mean = 1.0 + 40.0 * HashUniform(teacher_seed, 1000003 + j);
    x[j] = static_cast<int64_t>(-std::log(1.0 - u) * mean);
    logit += 0.5 * scale * HashNormal(teacher_seed, 7 * j + 3) *
             std::log1p(static_cast<double>(x[j]));
  }
  for (int64_t j = 0; j < o.categorical_features; ++j) {
    const uint64_t key = static_cast<uint64_t>(at * width + o.integer_features + j);
    const double u = Uniform53(o.seed, key);
    const int64_t rank = std::min<int64_t>(
        std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin(),
        o.cardinality - 1);
    // The id as a log's 32-bit hash of the category.
    const uint64_t raw = SplitMix64(ids_seed ^ (static_cast<uint64_t>(j) << 40) ^
                                    static_cast<uint64_t>(rank));
    x[o.integer_features + j] = static_cast<int64_t>(raw & 0xffffffffu);
    logit += 2.0 * scale *
             HashNormal(teacher_seed, (static_cast<uint64_t>(j) << 40) ^
                                          static_cast<uint64_t>(rank));
  }
  return logit;
}

}  // namespace

absl::StatusOr<TrainTest> MakeClicks(const ClicksOptions& o,
                                     std::vector<double>* teacher) {
  if (o.train_size <= 0 || o.test_size < 0 || o.integer_features < 0 ||
      o.categorical_features <= 0 || o.cardinality <= 0 || o.zipf <= 0) {
    return absl::InvalidArgumentError(
        "clicks: train_size > 0, test_size >= 0, integer_features >= 0, "
        "categorical_features > 0, cardinality > 0 and zipf > 0");
  }
  const int64_t width = o.integer_features + o.categorical_features;
  // Zipf's cumulative distribution over ranks.
  std::vector<double> cdf(o.cardinality);
  double total = 0;
  for (int64_t r = 0; r < o.cardinality; ++r) {
    total += 1.0 / std::pow(static_cast<double>(r + 1), o.zipf);
    cdf[r] = total;
  }
  for (double& c : cdf) c /= total;
  TrainTest out;
  int64_t at = 0;  // sample number over both splits
  for (Dataset* d : {&out.train, &out.test}) {
    const int64_t n = d == &out.train ? o.train_size : o.test_size;
    d->sample_shape = {width};
    d->input_type = InputType::kInt64;
    d->num_classes = 2;
    d->ids.resize(static_cast<size_t>(n * width));
    d->labels.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i, ++at) {
      int64_t* x = d->ids.data() + i * width;
      const double logit = Sample(o, cdf, at, x);
      const double p = 1.0 / (1.0 + std::exp(-logit));
      d->labels[i] = Uniform53(o.seed ^ 0xc11c, static_cast<uint64_t>(at)) < p;
      if (teacher != nullptr && d == &out.test) teacher->push_back(p);
    }
  }
  return out;
}

double Auc(const std::vector<double>& scores, const std::vector<int>& labels) {
  const size_t n = std::min(scores.size(), labels.size());
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // A NaN score ranks lowest (a strict order even then).
  auto key = [&](size_t i) {
    return std::isnan(scores[i]) ? -std::numeric_limits<double>::infinity()
                                 : scores[i];
  };
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return key(a) < key(b); });
  // Mann-Whitney: the positives' mean rank, ties given their mean rank.
  double positives = 0, rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && key(order[j]) == key(order[i])) ++j;
    const double mean_rank = (static_cast<double>(i + j - 1) / 2.0) + 1.0;
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] != 0) {
        positives += 1;
        rank_sum += mean_rank;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives);
}

}  // namespace tally
