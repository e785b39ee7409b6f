#include "server/control/job_store.h"

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/io/safetensors.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "proto/checkpoint.pb.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"(
name: tiny
model: {layers: [{linear: {in_features: 4, out_features: 2}}]}
dataset: {name: synthetic, features: 4, classes: 2}
training: {workers: 2}
)";
constexpr int kParams = 10;  // kSpec's 4 x 2 weights and 2 biases

StoredJob RunningJob(const std::string& id) {
  StoredJob job;
  job.job.set_id(id);
  job.job.set_state(v1::RUNNING);
  job.job.set_spec(kSpec);
  job.has_state = true;
  job.state.metrics.version = 7;
  job.state.metrics.samples = 448;
  job.state.metrics.rejected_pushes = 2;
  job.state.metrics.loss = 0.25;
  job.state.metrics.accuracy = 0.75;
  job.state.metrics.train_seconds = 1.5;
  job.state.optimizer.step = 7;
  job.state.weights = std::make_shared<std::vector<float>>(kParams, 0.5f);
  job.state.optimizer.slots.assign(1, std::vector<float>(kParams, 0.25f));
  return job;
}

void ExpectSameState(const ShardState& got, const ShardState& want) {
  EXPECT_EQ(got.metrics.version, want.metrics.version);
  EXPECT_EQ(got.metrics.samples, want.metrics.samples);
  EXPECT_EQ(got.metrics.rejected_pushes, want.metrics.rejected_pushes);
  EXPECT_EQ(got.metrics.loss, want.metrics.loss);
  EXPECT_EQ(got.metrics.accuracy, want.metrics.accuracy);
  EXPECT_EQ(got.metrics.train_seconds, want.metrics.train_seconds);
  EXPECT_EQ(got.optimizer.step, want.optimizer.step);
  EXPECT_EQ(*got.weights, *want.weights);
  EXPECT_EQ(got.optimizer.slots, want.optimizer.slots);
  EXPECT_EQ(got.table_files, want.table_files);
}

// A job's state goes into its file as the record a range keeps, and comes
// back whole: counters, weights, optimizer state, table files and homes.
TEST(JobStoreTest, AJobsStateComesBackAsItWasSaved) {
  const std::string dir = testing::TempDir("job_store_round_trip");
  JobStore store(dir, SpecLimits());
  TALLY_ASSERT_OK(store.Open());
  StoredJob job = RunningJob("job-2");
  job.state.table_files = {"t0.base", "t0.delta1"};
  job.table_homes = {"", "10.0.0.2:7000"};
  TALLY_ASSERT_OK(store.Save(job));
  auto loaded = store.Load("job-2");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_state);
  ExpectSameState(loaded->state, job.state);
  EXPECT_EQ(loaded->table_homes, job.table_homes);
  auto raw = ReadFile(dir + "/job-2.ckpt");
  TALLY_ASSERT_OK(raw);
  v1::JobCheckpoint ck;
  ASSERT_TRUE(ck.ParseFromString(*raw));
  EXPECT_EQ(ck.format(), 2u);
  EXPECT_EQ(ck.state().version(), 7);
  EXPECT_EQ(ck.state().weights().size(), 4u * kParams);
  EXPECT_TRUE(ck.weights().empty());  // format 1's place
}

// A file an earlier server wrote (format 1: the state's fields at the top
// level) is read into the same record.
TEST(JobStoreTest, AFormatOneFileIsRead) {
  const std::string dir = testing::TempDir("job_store_format1");
  JobStore store(dir, SpecLimits());
  TALLY_ASSERT_OK(store.Open());
  const StoredJob job = RunningJob("job-6");
  v1::JobCheckpoint ck;
  ck.set_format(1);
  *ck.mutable_job() = job.job;
  ck.set_has_shard(true);
  ck.set_version(7);
  ck.set_samples(448);
  ck.set_rejected_pushes(2);
  ck.set_loss(0.25);
  ck.set_accuracy(0.75);
  ck.set_train_seconds(1.5);
  ck.set_optimizer_step(7);
  ck.set_weights(job.state.weights->data(), 4 * kParams);
  ck.add_optimizer_slots(job.state.optimizer.slots[0].data(), 4 * kParams);
  ck.add_table_files("t0.base");
  TALLY_ASSERT_OK(
      WriteFileAtomic(dir + "/job-6.ckpt", ck.SerializeAsString()));
  auto loaded = store.Load("job-6");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  StoredJob want = job;
  want.state.table_files = {"t0.base"};
  ExpectSameState(loaded->state, want.state);
}

// A checkpoint whose parameters changed since it was written, or whose job
// id could name a file elsewhere, is refused, naming the file.
TEST(JobStoreTest, DamagedFilesAndForeignIdsAreRefused) {
  const std::string dir = testing::TempDir("job_store_damage");
  JobStore store(dir, SpecLimits());
  TALLY_ASSERT_OK(store.Open());
  StoredJob job = RunningJob("job-3");
  TALLY_ASSERT_OK(store.Save(job));
  auto loaded = store.Load("job-3");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded->state.weights, *job.state.weights);
  // One weight turned into a NaN, same size: refused.
  std::string bytes = *ReadFile(dir + "/job-3.ckpt");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::string half(
      reinterpret_cast<const char*>(job.state.weights->data()), 4);
  const size_t at = bytes.find(std::string(half) + half);
  ASSERT_NE(at, std::string::npos);
  std::memcpy(&bytes[at], &nan, 4);
  TALLY_ASSERT_OK(WriteFileAtomic(dir + "/job-3.ckpt", bytes));
  EXPECT_THAT(store.Load("job-3"), StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr("checksum")));
  // A record whose id is a path.
  job.job.set_id("../../etc/job-4");
  v1::JobCheckpoint ck;
  ck.set_format(2);
  *ck.mutable_job() = job.job;
  TALLY_ASSERT_OK(WriteFileAtomic(dir + "/job-4.ckpt", ck.SerializeAsString()));
  EXPECT_THAT(store.Load("job-4"), StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr("not one this server")));
  // A format no server wrote.
  ck.set_format(9);
  ck.mutable_job()->set_id("job-4");
  TALLY_ASSERT_OK(WriteFileAtomic(dir + "/job-4.ckpt", ck.SerializeAsString()));
  EXPECT_THAT(store.Load("job-4"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("format 9")));
}

// An ended Python model keeps its buffers in its file (they are checked
// with the parameters), and a file whose buffers are not the model's size
// is refused.
TEST(JobStoreTest, APythonModelsBuffersAreKept) {
  const std::string dir = testing::TempDir("job_store_buffers");
  JobStore store(dir, SpecLimits());
  TALLY_ASSERT_OK(store.Open());
  StoredJob job;
  job.job.set_id("job-5");
  job.job.set_state(v1::SUCCEEDED);
  job.job.set_spec(
      "model: {python: {code: x, params: [{name: w, shape: [2]}], buffers: "
      "[{name: bn.running_mean, dtype: F32, shape: [2]}, {name: "
      "bn.num_batches_tracked, dtype: I64, shape: []}]}}\n"
      "dataset: {name: synthetic, features: 4, classes: 2}\n");
  job.has_state = true;
  job.state.weights = std::make_shared<std::vector<float>>(2, 0.5f);
  job.state.buffers = std::make_shared<const std::string>(16, '\x07');
  TALLY_ASSERT_OK(store.Save(job));
  auto loaded = store.Load("job-5");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE(loaded->state.buffers, nullptr);
  EXPECT_EQ(*loaded->state.buffers, *job.state.buffers);
  job.state.buffers = std::make_shared<const std::string>(12, '\x07');
  TALLY_ASSERT_OK(store.Save(job));
  EXPECT_THAT(store.Load("job-5"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("buffers do not match")));
}

}  // namespace
}  // namespace tally
