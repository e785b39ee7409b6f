// Synthetic click logs and the AUC.
#include "common/data/clicks.h"

#include <map>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

TEST(ClicksTest, SamplesAreCountsThenZipfIdsWithATeachersLabels) {
  ClicksOptions o;
  o.train_size = 20000;
  o.test_size = 5000;
  o.integer_features = 3;
  o.categorical_features = 4;
  o.cardinality = 1000;
  std::vector<double> p;
  absl::StatusOr<TrainTest> d = MakeClicks(o, &p);
  TALLY_ASSERT_OK(d.status());
  EXPECT_EQ(d->train.size(), 20000);
  EXPECT_EQ(d->test.size(), 5000);
  EXPECT_EQ(d->train.input_type, InputType::kInt64);
  EXPECT_EQ(d->train.sample_shape, (Shape{7}));
  ASSERT_EQ(p.size(), 5000u);
  int64_t clicks = 0;
  std::map<int64_t, int64_t> first_feature;
  for (int64_t i = 0; i < d->train.size(); ++i) {
    const int64_t* x = d->train.ids.data() + i * 7;
    for (int j = 0; j < 3; ++j) EXPECT_GE(x[j], 0);
    for (int j = 3; j < 7; ++j) {
      EXPECT_GE(x[j], 0);
      EXPECT_LE(x[j], 0xffffffffLL);
    }
    ++first_feature[x[3]];
    ASSERT_TRUE(d->train.labels[i] == 0 || d->train.labels[i] == 1);
    clicks += d->train.labels[i];
  }
  // About a quarter click; a few ids are most of the traffic.
  EXPECT_GT(clicks, 20000 * 0.1);
  EXPECT_LT(clicks, 20000 * 0.5);
  EXPECT_LE(first_feature.size(), 1000u);
  int64_t top = 0;
  for (const auto& [id, n] : first_feature) top = std::max(top, n);
  EXPECT_GT(top, 20000 / 20);  // the most frequent id: over 5%
  // Deterministic by seed; another seed, other samples.
  absl::StatusOr<TrainTest> again = MakeClicks(o);
  EXPECT_EQ(again->train.ids, d->train.ids);
  EXPECT_EQ(again->test.labels, d->test.labels);
  o.seed = 2;
  EXPECT_NE(MakeClicks(o)->train.ids, d->train.ids);
  // The teacher's own probabilities rank the test clicks well.
  std::vector<int> labels(d->test.labels.begin(), d->test.labels.end());
  const double auc = Auc(p, labels);
  EXPECT_GT(auc, 0.7);
  EXPECT_LT(auc, 1.0);
}

TEST(ClicksTest, AucCountsPairsAndTies) {
  EXPECT_DOUBLE_EQ(Auc({0.1, 0.2, 0.8, 0.9}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.9, 0.8, 0.2, 0.1}, {0, 0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(Auc({0.5, 0.5, 0.5, 0.5}, {0, 1, 0, 1}), 0.5);
  // One of the four (positive, negative) pairs is out of order.
  EXPECT_DOUBLE_EQ(Auc({0.1, 0.6, 0.5, 0.9}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(Auc({0.3, 0.4}, {1, 1}), 0.5);  // one class only
}

TEST(ClicksTest, BadOptionsAreRefused) {
  ClicksOptions o;
  o.cardinality = 0;
  EXPECT_THAT(MakeClicks(o).status(),
              tally::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                       ::testing::HasSubstr("cardinality > 0")));
}

}  // namespace
}  // namespace tally
