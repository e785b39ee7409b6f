#include "worker/standalone.h"

#include <cmath>
#include <filesystem>

#include "common/device.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

JobSpec SyntheticSpec(const std::string& optimizer, int epochs) {
  auto spec = ParseJobSpec(R"(
dataset: {name: synthetic, train_size: 2048, test_size: 512, features: 16, classes: 4, seed: 3}
model:
  layers:
    - linear: {in_features: 16, out_features: 32}
    - relu
    - dropout: {p: 0.1}
    - linear: {in_features: 32, out_features: 4}
training: {epochs: )" + std::to_string(epochs) +
                           R"(, batch_size: 32, seed: 9}
optimizer: )" + optimizer + "\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(StandaloneTest, SyntheticLossFallsAndAccuracyRisesWellAboveChance) {
  JobSpec spec = SyntheticSpec("{type: sgd, lr: 0.05, momentum: 0.9}", 8);
  std::vector<ProgressReport> reports;
  StandaloneOptions options;
  options.report_every_sec = 1e9;  // only the per-epoch reports
  options.on_progress = [&](const ProgressReport& r) { reports.push_back(r); };
  auto summary = TrainStandalone(spec, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(reports.size(), 8u);
  EXPECT_LT(reports.back().loss, 0.6 * reports.front().loss);
  EXPECT_GT(summary->test_accuracy, 0.80);  // chance is 0.25
  EXPECT_EQ(summary->steps, 8 * 64);
  EXPECT_EQ(summary->samples, 8 * 2048);
  EXPECT_EQ(static_cast<int64_t>(summary->params.size()),
            spec.layout.num_params);
}

TEST(StandaloneTest, SameSeedSameWeightsAndMaxStepsStopsEarly) {
  JobSpec spec = SyntheticSpec("{type: adam, lr: 0.01}", 3);
  spec.training.max_steps = 10;
  auto a = TrainStandalone(spec, {});
  auto b = TrainStandalone(spec, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->steps, 10);
  EXPECT_EQ(a->params, b->params);
  spec.training.seed = 10;
  auto c = TrainStandalone(spec, {});
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->params, c->params);
}

TEST(StandaloneTest, MissingDatasetIsAClearError) {
  auto spec = ParseJobSpec(
      "model: {preset: mlp}\ndataset: {name: fashion-mnist, root: "
      "/nonexistent}\n");
  ASSERT_TRUE(spec.ok());
  EXPECT_THAT(TrainStandalone(*spec, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/nonexistent/train-images")));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

TEST(StandaloneDevicesTest, OneAndThreeReplicasExportTheSameWeights) {
  // On the real example where the dataset is installed: MLP, max_steps 20,
  // same seed; cpu:1 and cpu:3 must export the same weights.
  const bool have_data = std::filesystem::exists(
      "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  absl::StatusOr<JobSpec> spec =
      have_data
          ? LoadJobSpec(testing::SourcePath("examples/fashion-mnist-mlp.yaml"))
          : absl::StatusOr<JobSpec>(
                SyntheticSpec("{type: sgd, lr: 0.01, momentum: 0.9}", 1));
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->training.max_steps = 20;
  StandaloneOptions one, three;
  three.devices = *ParseDevices("cpu:3");
  auto a = TrainStandalone(*spec, one);
  auto b = TrainStandalone(*spec, three);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->params.size(), b->params.size());
  float worst = 0;
  for (size_t i = 0; i < a->params.size(); ++i) {
    worst = std::max(worst, std::fabs(a->params[i] - b->params[i]));
  }
  EXPECT_LT(worst, 1e-4f);
  EXPECT_NEAR(a->test_accuracy, b->test_accuracy, 0.002);
  EXPECT_EQ(b->reduction, "host");  // CPU replicas meet in host memory
}

TEST(StandaloneDevicesTest, TwoReplicasReachTheSameAccuracyBand) {
  JobSpec spec = SyntheticSpec("{type: sgd, lr: 0.05, momentum: 0.9}", 8);
  StandaloneOptions two;
  two.devices = *ParseDevices("cpu:2");
  auto a = TrainStandalone(spec, {});
  auto b = TrainStandalone(spec, two);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(b->test_accuracy, 0.80);
  EXPECT_NEAR(a->test_accuracy, b->test_accuracy, 0.02);
}

}  // namespace
}  // namespace tally
