// The registry of workers and shards: registration's checks, ids, leases
// and their expiry, lost shards, and what the shards report of a job's
// ranges.
#include "server/control/registry.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/fake_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::FakeShardControl;
using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const absl::Time kStart = absl::UnixEpoch() + absl::Hours(1);

v1::RegisterWorkerRequest Worker(const std::string& name) {
  v1::RegisterWorkerRequest r;
  r.set_name(name);
  r.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  return r;
}

v1::RangeStatus Range(const std::string& job_id, int64_t map_version,
                      int64_t version) {
  v1::RangeStatus r;
  r.set_job_id(job_id);
  r.set_map_version(map_version);
  r.set_version(version);
  r.set_count(10);
  return r;
}

TEST(RegistryTest, RegistrationsAreCheckedBeforeAnythingIsHeld) {
  v1::RegisterWorkerRequest old = Worker("old");
  old.set_protocol_version(0);
  EXPECT_THAT(Registry::CheckRegistration(old),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::PROTOCOL_TOO_OLD));
  v1::RegisterWorkerRequest long_name = Worker(std::string(257, 'x'));
  EXPECT_THAT(Registry::CheckRegistration(long_name),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at most 256 bytes")));
  TALLY_EXPECT_OK(Registry::CheckRegistration(Worker("a")));
}

TEST(RegistryTest, WorkersGetIdsOfThisLifetimeUpToTheLimit) {
  Registry registry(absl::Seconds(3), /*max_workers=*/2, kStart);
  auto a = registry.AddWorker(Worker("a"), kStart);
  auto b = registry.AddWorker(Worker("b"), kStart);
  TALLY_ASSERT_OK(a);
  TALLY_ASSERT_OK(b);
  EXPECT_THAT(a->worker_id(), StartsWith("worker-"));
  EXPECT_THAT(a->worker_id(), ::testing::EndsWith("-1"));
  EXPECT_EQ(a->lease_ms(), 3000);
  EXPECT_EQ(registry.Idle().size(), 2u);
  EXPECT_THAT(registry.AddWorker(Worker("c"), kStart),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("--max_workers")));
  // Another lifetime's ids never repeat this one's.
  Registry next(absl::Seconds(3), 2, kStart);
  auto again = next.AddWorker(Worker("a"), kStart);
  TALLY_ASSERT_OK(again);
  EXPECT_NE(again->worker_id(), a->worker_id());
}

TEST(RegistryTest, ALeaseIsRenewedOnlyByItsIncarnation) {
  Registry registry(absl::Seconds(3), 10, kStart);
  auto a = registry.AddWorker(Worker("a"), kStart);
  TALLY_ASSERT_OK(a);
  EXPECT_THAT(registry.RenewWorker(a->worker_id(), a->incarnation() + 1,
                                   kStart),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
  auto w = registry.RenewWorker(a->worker_id(), a->incarnation(),
                                kStart + absl::Seconds(2));
  TALLY_ASSERT_OK(w);
  EXPECT_EQ((*w)->name, "a");
  // Renewed at 2 s: alive at 4 s, gone after 5 s.
  EXPECT_TRUE(registry.Expire(kStart + absl::Seconds(4)).workers.empty());
  Registry::Expired expired = registry.Expire(kStart + absl::Seconds(6));
  EXPECT_EQ(expired.workers, std::vector<std::string>{a->worker_id()});
  EXPECT_EQ(registry.lease_expiries(), 1);
  registry.RemoveWorker(a->worker_id());
  EXPECT_EQ(registry.worker(a->worker_id()), nullptr);
  EXPECT_THAT(registry.CheckWorker(a->worker_id(), a->incarnation()),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
}

TEST(RegistryTest, ALostShardIsKeptUntilNoPlacementNamesIt) {
  Registry registry(absl::Seconds(3), 10, kStart);
  auto local = std::make_shared<FakeShardControl>();
  registry.AddLocalShard(local, ":7000", kStart);
  auto remote = std::make_shared<FakeShardControl>();
  remote->is_local = false;
  v1::RegisterShardResponse s = registry.AddShard("h:1", remote, kStart);
  EXPECT_THAT(s.shard_id(), StartsWith("shard-"));
  auto entry = registry.RenewShard(s.shard_id(), s.incarnation(), kStart);
  TALLY_ASSERT_OK(entry);
  (*entry)->ranges.push_back(Range("job-1", 1, 3));
  EXPECT_EQ(registry.LiveShardAt("h:1"), remote);
  EXPECT_EQ(registry.LiveShardAt(""), nullptr);
  // The coordinator's own shard never expires.
  Registry::Expired expired = registry.Expire(kStart + absl::Minutes(1));
  EXPECT_EQ(expired.shards, std::vector<std::string>{s.shard_id()});
  const ShardEntry& lost = registry.shard(s.shard_id());
  EXPECT_FALSE(lost.live);
  EXPECT_TRUE(lost.ranges.empty());
  EXPECT_TRUE(registry.shard(Registry::kLocalShard).live);
  EXPECT_EQ(registry.LiveShardAt("h:1"), nullptr);
  EXPECT_THAT(registry.RenewShard(s.shard_id(), s.incarnation(), kStart),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
  registry.ForgetLostShards(kStart + absl::Minutes(11), {s.shard_id()});
  EXPECT_EQ(registry.shards().size(), 2u);
  registry.ForgetLostShards(kStart + absl::Minutes(9), {});
  EXPECT_EQ(registry.shards().size(), 2u);
  registry.ForgetLostShards(kStart + absl::Minutes(11), {});
  EXPECT_EQ(registry.shards().size(), 1u);
}

TEST(RegistryTest, AJobIsAtTheVersionEveryRangeReached) {
  Registry registry(absl::Seconds(3), 10, kStart);
  auto local = std::make_shared<FakeShardControl>();
  local->ranges = {Range("job-1", 7, 5), Range("job-1", 6, 9),
                   Range("job-2", 7, 1)};
  registry.AddLocalShard(local, "", kStart);
  auto remote = std::make_shared<FakeShardControl>();
  remote->is_local = false;
  v1::RegisterShardResponse s = registry.AddShard("h:1", remote, kStart);
  JobEntry job;
  job.proto.set_id("job-1");
  job.proto.mutable_metrics()->set_step(2);
  job.map_version = 7;
  job.ranges = {{Registry::kLocalShard, 0, 10}, {s.shard_id(), 10, 10}};
  EXPECT_EQ(registry.Version(job), 2);  // not installed: the record's
  job.installed = true;
  std::vector<v1::RangeStatus> ranges = registry.RangeStatuses(job);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].version(), 5);
  EXPECT_TRUE(ranges[1].job_id().empty());  // not reported yet
  EXPECT_EQ(registry.Version(job), 2);
  (*registry.RenewShard(s.shard_id(), s.incarnation(), kStart))->ranges = {
      Range("job-1", 7, 4)};
  EXPECT_EQ(registry.Version(job), 4);
  std::vector<v1::ShardInfo> shards = registry.ListShards(kStart);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].ranges_size(), 3);
  EXPECT_EQ(shards[0].bytes(), 120);
}

TEST(RegistryTest, IdleAndBusyWorkers) {
  Registry registry(absl::Seconds(3), 10, kStart);
  v1::RegisterWorkerRequest py = Worker("py");
  auto a = registry.AddWorker(Worker("a"), kStart);
  EXPECT_FALSE(registry.AnyPythonWorker());
  py.set_python("Python 3, PyTorch");
  auto b = registry.AddWorker(py, kStart);
  EXPECT_TRUE(registry.AnyPythonWorker());
  registry.worker(a->worker_id())->job_id = "job-1";
  EXPECT_EQ(registry.Idle(), std::vector<std::string>{b->worker_id()});
  EXPECT_TRUE(registry.BusyJobs().count("job-1"));
}

}  // namespace
}  // namespace tally
