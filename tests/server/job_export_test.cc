// A job's weights file: from its final weights, its running ranges or its
// start; a Python model's buffers, or a note of why they are missing.
#include "server/control/job_export.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/io/safetensors.h"
#include "gtest/gtest.h"
#include "server/control/job_store.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::FakeShardControl;
using ::tally::testing::HasReason;
using ::testing::HasSubstr;

constexpr char kSpec[] = TALLY_TINY_MODEL;
constexpr char kBatchNormSpec[] =
    "model: {python: {code: x, params: [{name: w, shape: [2, 4]}], buffers: "
    "[{name: bn.running_mean, dtype: F32, shape: [2]}, {name: "
    "bn.num_batches_tracked, dtype: I64, shape: []}]}}\n"
    "dataset: {name: synthetic, features: 4, classes: 2}\n";

const absl::Time kNow = ::tally::testing::kPartsNow;

JobEntry Job(const char* text) {
  JobEntry job;
  job.proto.set_id("job-1");
  job.proto.set_spec(text);
  job.spec = *ParseJobSpec(text, SpecLimits());
  job.schedule.total_steps = 100;
  return job;
}

// The file's "__metadata__".
std::map<std::string, std::string> Metadata(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return nlohmann::json::parse(file.substr(8, n))["__metadata__"]
      .get<std::map<std::string, std::string>>();
}

struct Made {
  std::string head;
  std::unique_ptr<TableExport> tables;
  std::string buffers_note;
};

absl::StatusOr<Made> Make(const JobEntry& job, const Registry& registry) {
  absl::StatusOr<JobExport> e = JobExport::Take(job, registry);
  if (!e.ok()) return e.status();
  Made out;
  absl::Status s = e->Make(&out.head, &out.tables, &out.buffers_note);
  if (!s.ok()) return s;
  return out;
}

TEST(JobExportTest, AJobWithoutWeightsHasNoFile) {
  Registry registry(absl::Seconds(3), 10, kNow);
  EXPECT_THAT(Make(Job(kSpec), registry),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::JOB_NOT_STARTED));
}

TEST(JobExportTest, AnEndedJobsFileIsItsFinalWeights) {
  Registry registry(absl::Seconds(3), 10, kNow);
  JobEntry job = Job(kSpec);
  job.proto.set_state(v1::SUCCEEDED);
  job.proto.mutable_metrics()->set_step(9);
  job.final_weights = std::make_shared<std::vector<float>>(10, 0.5f);
  auto made = Make(job, registry);
  TALLY_ASSERT_OK(made);
  EXPECT_EQ(made->tables, nullptr);
  EXPECT_EQ(made->buffers_note, "");
  auto tensors = DecodeSafetensors(made->head);
  TALLY_ASSERT_OK(tensors);
  EXPECT_EQ(tensors->size(), 2u);
  std::map<std::string, std::string> metadata = Metadata(made->head);
  EXPECT_EQ(metadata["version"], "9");
  EXPECT_EQ(metadata["job"], "job-1");
  EXPECT_EQ(metadata["format"], "pt");
}

TEST(JobExportTest, ARunningJobsRangesAreReadAtOneVersion) {
  Registry registry(absl::Seconds(3), 10, kNow);
  auto shard = std::make_shared<FakeShardControl>();
  shard->count = 10;
  shard->value = 2.0f;
  v1::RangeStatus r;
  r.set_job_id("job-1");
  r.set_version(6);
  shard->ranges = {r};
  registry.AddLocalShard(shard, "", kNow);
  JobEntry job = Job(kSpec);
  job.proto.set_state(v1::RUNNING);
  job.ranges = {{Registry::kLocalShard, 0, 10}};
  job.installed = true;
  auto made = Make(job, registry);
  TALLY_ASSERT_OK(made);
  EXPECT_EQ(shard->saves, std::vector<int64_t>{6});
  EXPECT_EQ(Metadata(made->head)["version"], "6");
  auto weights = FlattenTensors(*DecodeSafetensors(made->head),
                                job.spec.layout.params);
  TALLY_ASSERT_OK(weights);
  EXPECT_EQ(*weights, std::vector<float>(10, 2.0f));
}

TEST(JobExportTest, APythonModelsMissingBuffersAreSaid) {
  Registry registry(absl::Seconds(3), 10, kNow);
  JobEntry job = Job(kBatchNormSpec);
  job.proto.set_state(v1::RUNNING);
  auto start = std::make_shared<StoredJob>();
  start->state.weights = std::make_shared<std::vector<float>>(8, 0.5f);
  start->state.metrics.version = 3;
  job.start = start;
  auto made = Make(job, registry);
  TALLY_ASSERT_OK(made);
  EXPECT_THAT(made->buffers_note, HasSubstr("strict=False"));
  EXPECT_THAT(Metadata(made->head)["buffers"], HasSubstr("missing"));
  EXPECT_EQ(Metadata(made->head)["version"], "3");
  start->state.buffers = std::make_shared<const std::string>(16, '\x01');
  made = Make(job, registry);
  TALLY_ASSERT_OK(made);
  EXPECT_EQ(made->buffers_note, "");
  EXPECT_EQ(Metadata(made->head).count("buffers"), 0u);
}

}  // namespace
}  // namespace tally
