// A shard process's ShardService over a real socket: a range's state far
// larger than the 4 MiB message limit goes in (InstallRange, streamed) and
// comes back out (SaveRange) unchanged, as when a lost shard's job is
// placed again from its checkpoint; a Python model's buffer region with it;
// pulls of rows checked before they wait, and bounded while they do.
#include "server/data/shard_service.h"

#include <grpcpp/grpcpp.h>

#include <future>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/errors.h"
#include "proto/transport.h"
#include "server/control/remote_shard_control.h"
#include "server/tally_server.h"
#include "tests/test_util.h"

namespace tally {
namespace {

constexpr char kSpec[] = R"(
name: big
model: {layers: [{linear: {in_features: 1024, out_features: 2048}}]}
dataset: {name: synthetic, features: 1024, classes: 2048, train_size: 64}
training: {workers: 1, epochs: 100}
optimizer: {type: adam, lr: 0.001}
)";

// Memory shared with workers is offered within its bounds: the range's
// size, the number of regions and their bytes at once.
TEST(ShardHostTest, SharedRegionsStayWithinTheirBounds) {
  EXPECT_FALSE(ShardHost(nullptr).ReserveSharedRegion("w", 10));  // off: 0
  ShardHost::Options o;
  o.shared_memory_max_bytes = int64_t{16} << 20;
  ShardHost host(nullptr, {}, o);
  EXPECT_FALSE(host.ReserveSharedRegion("w", (int64_t{16} << 20) / 4 + 1));
  EXPECT_FALSE(host.ReserveSharedRegion("w", 0));
  // Two a worker: its stream and the one replacing it.
  EXPECT_TRUE(host.ReserveSharedRegion("a", 1));
  EXPECT_TRUE(host.ReserveSharedRegion("a", 1));
  EXPECT_FALSE(host.ReserveSharedRegion("a", 1));
  host.ReleaseSharedRegion("a", 1);
  EXPECT_TRUE(host.ReserveSharedRegion("a", 1));
  host.ReleaseSharedRegion("a", 1);
  host.ReleaseSharedRegion("a", 1);
  EXPECT_EQ(host.shared_regions(), 0);
  // 1 GiB: 32 regions of 4 Mi values (two parts of 16 MiB each).
  constexpr int64_t kBig = int64_t{4} << 20;
  auto owner = [](int i) { return absl::StrCat("w", i); };
  for (int i = 0; i < 32; ++i)
    ASSERT_TRUE(host.ReserveSharedRegion(owner(i), kBig)) << i;
  EXPECT_FALSE(host.ReserveSharedRegion(owner(32), kBig));
  EXPECT_FALSE(host.ReserveSharedRegion(owner(32), 1));
  host.ReleaseSharedRegion(owner(0), kBig);
  EXPECT_TRUE(host.ReserveSharedRegion(owner(32), 1));
  EXPECT_FALSE(host.ReserveSharedRegion(owner(33), kBig));
  for (int i = 1; i < 32; ++i) host.ReleaseSharedRegion(owner(i), kBig);
  host.ReleaseSharedRegion(owner(32), 1);
  EXPECT_EQ(host.shared_regions(), 0);
  // 256 regions, however small.
  for (int i = 0; i < ShardHost::kMaxSharedRegions; ++i)
    ASSERT_TRUE(host.ReserveSharedRegion(owner(i), 1)) << i;
  EXPECT_FALSE(host.ReserveSharedRegion(owner(1000), 1));
}

// Pulls of rows waiting on a shard hold their requests within bounds: so
// much a worker of a job, so much in all; a refusal counts nothing.
TEST(ShardHostTest, WaitingPullsOfRowsStayWithinTheirBounds) {
  ShardHost::Options o;
  o.waiting_rows_per_worker = 100;
  o.waiting_rows_in_all = 150;
  ShardHost host(nullptr, {}, o);
  TALLY_EXPECT_OK(host.ReserveWaitingRows("job-1\nw", 60));
  TALLY_EXPECT_OK(host.ReserveWaitingRows("job-1\nw", 40));
  EXPECT_THAT(host.ReserveWaitingRows("job-1\nw", 1),
              testing::HasReason(absl::StatusCode::kResourceExhausted,
                                 v1::PULLS_WAITING));
  EXPECT_THAT(host.ReserveWaitingRows("job-1\nv", 51),
              testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                ::testing::HasSubstr("150")));
  TALLY_EXPECT_OK(host.ReserveWaitingRows("job-1\nv", 50));
  EXPECT_EQ(host.waiting_row_bytes(), 150);
  host.ReleaseWaitingRows("job-1\nw", 60);
  TALLY_EXPECT_OK(host.ReserveWaitingRows("job-1\nv", 50));
  host.ReleaseWaitingRows("job-1\nw", 40);
  host.ReleaseWaitingRows("job-1\nv", 100);
  EXPECT_EQ(host.waiting_row_bytes(), 0);
  // Unless set: 64 MiB a worker, 256 MiB in all.
  ShardHost fresh(nullptr);
  TALLY_EXPECT_OK(fresh.ReserveWaitingRows(
      "a", ShardHost::kMaxWaitingRowBytesPerWorker));
  EXPECT_THAT(fresh.ReserveWaitingRows("a", 1),
              testing::HasReason(absl::StatusCode::kResourceExhausted,
                                 v1::PULLS_WAITING));
  for (const char* w : {"b", "c", "d"}) {
    TALLY_EXPECT_OK(fresh.ReserveWaitingRows(
        w, ShardHost::kMaxWaitingRowBytesPerWorker));
  }
  EXPECT_EQ(fresh.waiting_row_bytes(), ShardHost::kMaxWaitingRowBytes);
  EXPECT_THAT(fresh.ReserveWaitingRows("e", 1),
              testing::HasReason(absl::StatusCode::kResourceExhausted,
                                 v1::PULLS_WAITING));
}

// A shard bounds its tables unless told not to (--max_table_bytes=0):
// without a bound a flood of new ids made rows as fast as it came.
TEST(ShardHostTest, TablesAreBoundedByDefault) {
  EXPECT_EQ(ServerOptions().max_table_bytes, int64_t{4} << 30);
}

// A range sums pushes as they arrive when it is large, or when its job's
// workers would stage as much in all (its most workers, if it may grow);
// otherwise it stages each push whole.
TEST(ShardHostTest, StreamsLargeRangesAndRangesOfManyWorkers) {
  ShardHost::Options o;
  o.streamed_sums = true;
  o.streamed_sums_min_elements = 1000;
  ShardHost host(nullptr, {}, o);
  auto streams = [](ShardHost& on, const std::string& workers, int64_t count) {
    static int job = 0;
    v1::InstallRangeRequest req;
    req.set_job_id(absl::StrCat("job-", ++job));
    req.set_spec(absl::StrCat(
        "name: s\nmodel: {layers: [{linear: {in_features: 99, "
        "out_features: 20}}]}\ndataset: {name: synthetic, features: 99, "
        "classes: 20, train_size: 64}\ntraining: {workers: ",
        workers, "}\n"));
    req.set_map_version(1);
    req.set_count(count);
    req.mutable_schedule()->set_train_size(64);
    req.mutable_schedule()->set_steps_per_epoch(1);
    req.mutable_schedule()->set_total_steps(1);
    absl::Status s = on.Install(req);
    EXPECT_TRUE(s.ok()) << s;
    absl::StatusOr<Range> range = on.Find(req.job_id());
    return range.ok() && range->shard->StreamsPushes();
  };
  EXPECT_FALSE(streams(host, "2", 100));  // 200 values staged at most
  EXPECT_FALSE(streams(host, "9", 100));  // 900
  EXPECT_TRUE(streams(host, "10", 100));  // 1000
  EXPECT_TRUE(streams(host, "1", 1000));  // the range alone
  EXPECT_FALSE(streams(host, "{min: 2, max: 9}", 100));
  EXPECT_TRUE(streams(host, "{min: 2, max: 16}", 100));  // from the start
  ShardHost::Options off;
  off.streamed_sums = false;
  ShardHost staging(nullptr, {}, off);
  EXPECT_FALSE(streams(staging, "16", 2000));
}

TEST(ShardServiceTest, ALargeRangeStateGoesInAndComesBackWhole) {
  ServerOptions o;
  o.join = "127.0.0.1:1";  // no coordinator there: it keeps retrying, harmless
  auto server = TallyServer::Start("127.0.0.1:0", o);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<ShardControl> shard = MakeRemoteShardControl(
      absl::StrCat("127.0.0.1:", (*server)->port()), TransportOptions{});
  constexpr int64_t kParams = 1024 * 2048 + 2048;
  const int64_t offset = 1000, count = kParams - 1000;  // 8.4 MB a part
  v1::InstallRangeRequest req;
  req.set_job_id("job-9");
  req.set_spec(kSpec);
  req.set_map_version(5);
  req.set_offset(offset);
  req.set_count(count);
  req.mutable_schedule()->set_train_size(64);
  req.mutable_schedule()->set_steps_per_epoch(1);
  req.mutable_schedule()->set_total_steps(100);
  std::vector<std::vector<float>> parts(3, std::vector<float>(count));
  for (int p = 0; p < 3; ++p) {
    for (int64_t i = 0; i < count; ++i) parts[p][i] = 0.001f * (i % 997) + p;
  }
  v1::RangeState* st = req.mutable_state();
  st->set_version(42);
  st->set_optimizer_step(42);
  st->set_weights(parts[0].data(), 4 * count);
  st->add_optimizer_slots(parts[1].data(), 4 * count);
  st->add_optimizer_slots(parts[2].data(), 4 * count);
  TALLY_ASSERT_OK(shard->Install(req));

  absl::StatusOr<Range> range = (*server)->shard_host()->Find("job-9");
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->offset, offset);
  EXPECT_EQ(range->shard->version(), 42);

  absl::StatusOr<ShardState> saved = shard->Save(
      "job-9", 5, 42, count, absl::Seconds(5), /*weights_only=*/false);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->metrics.version, 42);
  EXPECT_EQ(*saved->weights, parts[0]);
  ASSERT_EQ(saved->optimizer.slots.size(), 2u);
  EXPECT_EQ(saved->optimizer.slots[0], parts[1]);
  EXPECT_EQ(saved->optimizer.slots[1], parts[2]);
  EXPECT_EQ(saved->optimizer.step, 42);
  // Past that version: the shard says where it is.
  EXPECT_THAT(shard->Save("job-9", 5, 41, count, absl::Seconds(1), true),
              testing::HasReason(absl::StatusCode::kFailedPrecondition,
                                 v1::STEP_CLOSED));
  // Another placement of the job is not this one.
  EXPECT_THAT(shard->Save("job-9", 4, 42, count, absl::Seconds(1), true),
              testing::StatusIs(absl::StatusCode::kNotFound,
                                ::testing::HasSubstr("map version 5")));
  // A state that does not fit the range is refused, and nothing changes.
  req.set_map_version(6);
  req.mutable_state()->set_weights(parts[0].data(), 4 * (count - 1));
  EXPECT_THAT(shard->Install(req),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("weights")));
  EXPECT_EQ((*server)->shard_host()->Find("job-9")->map_version, 5);
  (*server)->Shutdown(absl::Seconds(1));
}

// A Python model's buffer region rides with its first range's state: in
// with an install, out with a save (a checkpoint, a move to another shard);
// one that does not fit the model is refused.
TEST(ShardServiceTest, TheBufferRegionGoesInAndComesBackWithTheFirstRange) {
  ServerOptions o;
  o.join = "127.0.0.1:1";
  auto server = TallyServer::Start("127.0.0.1:0", o);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<ShardControl> shard = MakeRemoteShardControl(
      absl::StrCat("127.0.0.1:", (*server)->port()), TransportOptions{});
  v1::InstallRangeRequest req;
  req.set_job_id("job-3");
  req.set_spec(R"(
name: py
model: {python: {file: m.py, code: x, params: [{name: fc.weight, shape: [2, 4]}],
        buffers: [{name: bn.num_batches_tracked, dtype: I64, shape: []},
                  {name: bn.running_mean, dtype: F32, shape: [2]}]}}
dataset: {name: synthetic, features: 4, classes: 2, train_size: 64}
training: {workers: 1}
)");
  req.set_map_version(1);
  req.set_offset(0);
  req.set_count(8);
  req.mutable_schedule()->set_train_size(64);
  req.mutable_schedule()->set_steps_per_epoch(2);
  req.mutable_schedule()->set_total_steps(2);
  const std::vector<float> w(8, 0.5f);
  const std::string region("\x07\0\0\0\0\0\0\0\0\0\x80?\0\0\0@", 16);
  req.mutable_state()->set_version(1);
  req.mutable_state()->set_weights(w.data(), 4 * w.size());
  req.mutable_state()->set_buffers(region);
  TALLY_ASSERT_OK(shard->Install(req));
  absl::StatusOr<ShardState> saved =
      shard->Save("job-3", 1, 1, 8, absl::Seconds(5), /*weights_only=*/true);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_NE(saved->buffers, nullptr);
  EXPECT_EQ(*saved->buffers, region);
  // Buffers of another size, or on a range that does not start the vector.
  req.set_map_version(2);
  req.mutable_state()->set_buffers(region.substr(0, 8));
  EXPECT_THAT(shard->Install(req),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("buffers do not fit")));
  req.mutable_state()->set_buffers(region);
  req.set_offset(4);
  req.set_count(4);
  req.mutable_state()->set_weights(w.data(), 16);
  EXPECT_THAT(shard->Install(req),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("buffers do not fit")));
  (*server)->Shutdown(absl::Seconds(1));
}

// A pull of rows is checked whole before it waits for its version (a
// waiting pull holds its request: one of a few million rows, checked only
// after its wait, was held for all of it), and the pulls waiting hold a
// bounded part of the shard: so much a worker, so much in all.
TEST(ShardServiceTest, PullsOfRowsAreCheckedBeforeTheyWaitAndBounded) {
  ServerOptions o;
  o.join = "127.0.0.1:1";
  // A pull of 60,000 rows holds 512 KiB: one a worker, one in all.
  o.waiting_rows_per_worker = 800 << 10;
  o.waiting_rows_in_all = 900 << 10;
  auto server = TallyServer::Start("127.0.0.1:0", o);
  ASSERT_TRUE(server.ok()) << server.status();
  ShardHost* host = (*server)->shard_host();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  std::unique_ptr<ShardControl> shard =
      MakeRemoteShardControl(address, TransportOptions{});
  v1::InstallRangeRequest req;
  req.set_job_id("job-4");
  req.set_spec(R"(
name: rows
model: {python: {file: m.py, code: x, params: [{name: fc.weight, shape: [2, 4]}]},
        embeddings: [{name: emb, ids: direct, num_embeddings: 1000000, dim: 1}]}
dataset: {name: synthetic, features: 4, classes: 2, train_size: 64}
training: {workers: 2}
)");
  req.set_map_version(1);
  req.set_offset(0);
  req.set_count(8);
  req.set_slot(0);
  req.set_slots(1);
  req.mutable_schedule()->set_train_size(64);
  req.mutable_schedule()->set_steps_per_epoch(2);
  req.mutable_schedule()->set_total_steps(2);
  const std::vector<float> w(8, 0.5f);
  req.mutable_state()->set_weights(w.data(), 4 * w.size());
  TALLY_ASSERT_OK(shard->Install(req));
  absl::StatusOr<Range> range = host->Find("job-4");
  ASSERT_TRUE(range.ok());
  range->shard->AddMember("w", 1);
  range->shard->AddMember("v", 1);
  auto params = v1::ParameterService::NewStub(Dial(address));
  // Pulls of version 1, which the range (at 0) does not reach.
  auto pull = [](const std::string& worker, int64_t rows, int64_t wait_ms) {
    v1::PullRowsRequest r;
    r.set_job_id("job-4");
    r.set_worker_id(worker);
    r.set_incarnation(1);
    r.set_min_version(1);
    r.set_max_wait_ms(wait_ms);
    v1::TableRows* t = r.add_tables();
    for (int64_t i = 0; i < rows; ++i) t->add_rows(i);
    return r;
  };
  auto call = [&params](const v1::PullRowsRequest& r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::PullRowsResponse resp;
    return FromGrpc(params->PullRows(&ctx, r, &resp));
  };
  // Refused at once, not after a wait of 5 s (DEADLINE_EXCEEDED).
  EXPECT_THAT(call(pull("w", 300000, 5000)),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("300000 row values")));
  v1::PullRowsRequest twice = pull("w", 3, 5000);
  *twice.add_tables() = v1::TableRows(twice.tables(0));
  EXPECT_THAT(call(twice),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("row 0 is listed twice")));
  EXPECT_THAT(call(pull("stranger", 3, 5000)),
              testing::HasReason(absl::StatusCode::kPermissionDenied,
                                 v1::NOT_A_MEMBER));
  EXPECT_EQ(host->waiting_row_bytes(), 0);
  // w's pull waits; its next one would pass w's bound, v's everyone's.
  std::future<absl::Status> waiting = std::async(
      std::launch::async, [&] { return call(pull("w", 60000, 2000)); });
  for (int i = 0; i < 500 && host->waiting_row_bytes() == 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(host->waiting_row_bytes(), 60000 * 8);
  const absl::Status mine = call(pull("w", 60000, 2000));
  EXPECT_THAT(mine, testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                      ::testing::HasSubstr("this worker's")));
  EXPECT_THAT(mine, testing::HasReason(absl::StatusCode::kResourceExhausted,
                                       v1::PULLS_WAITING));
  EXPECT_THAT(call(pull("v", 60000, 2000)),
              testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                ::testing::HasSubstr("in all")));
  // A small one still waits, and its wait runs out as any does.
  EXPECT_THAT(call(pull("v", 100, 100)),
              testing::StatusIs(absl::StatusCode::kDeadlineExceeded,
                                ::testing::_));
  EXPECT_THAT(waiting.get(),
              testing::StatusIs(absl::StatusCode::kDeadlineExceeded,
                                ::testing::_));
  EXPECT_EQ(host->waiting_row_bytes(), 0);  // given back with the answers
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A replicated range over a real socket: the primary host's sender hands
// each closed step to the backup's ShardService, which makes the same
// version; the primary publishes it once answered. The backup's service
// refuses what does not fit, and a promoted backup is the primary.
TEST(ReplicatedRangeServiceTest, AClosedStepReachesTheBackupOverItsService) {
  ShardHost backup(nullptr);
  ShardServiceImpl service(&backup);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  v1::InstallRangeRequest req;
  req.set_job_id("job-1");
  req.set_spec(
      "name: r\nmodel: {layers: [{linear: {in_features: 7, out_features: "
      "3}}]}\ndataset: {name: synthetic, features: 7, classes: 3, "
      "train_size: 64}\ntraining: {workers: 1}\noptimizer: {type: adam, "
      "lr: 0.01}\n");
  req.set_map_version(1);
  req.set_count(24);
  req.mutable_schedule()->set_train_size(64);
  req.mutable_schedule()->set_steps_per_epoch(1);
  req.mutable_schedule()->set_total_steps(10);
  MemberSpec w;
  w.worker_id = "w";
  w.incarnation = 1;
  *req.add_members() = ToProto(w);
  v1::InstallRangeRequest as_backup = req;
  as_backup.set_backup(true);
  TALLY_ASSERT_OK(backup.Install(as_backup));
  ShardHost primary(nullptr);
  req.set_backup_address(absl::StrCat("127.0.0.1:", port));
  TALLY_ASSERT_OK(primary.Install(req));
  auto p = primary.Find("job-1");
  auto b = backup.Find("job-1");
  ASSERT_TRUE(p.ok() && b.ok());
  EXPECT_TRUE(b->backup);
  EXPECT_EQ(p->peer_address, req.backup_address());
  for (int64_t t = 0; t < 2; ++t) {
    PushMeta meta;
    meta.worker_id = "w";
    meta.incarnation = 1;
    meta.step = t;
    meta.base_version = t;
    meta.samples = 4;
    std::vector<float> g(24);
    for (int i = 0; i < 24; ++i) g[i] = 0.1f * static_cast<float>(i - t);
    bool dup = false;
    TALLY_ASSERT_OK(p->shard->Accept(meta, g.data(), &dup));
    p->shard->Commit("w", 1, t, true);
    for (int i = 0;
         i < 200 && p->shard->copies().published_version < t + 1; ++i)
      absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(p->shard->copies().published_version, t + 1);
  }
  int64_t vp = 0, vb = 0;
  EXPECT_EQ(*p->shard->Snapshot(&vp), *b->shard->Snapshot(&vb));
  EXPECT_EQ(vb, 2);
  // What does not fit is refused, naming why.
  auto stub = v1::ShardService::NewStub(
      Dial(absl::StrCat("127.0.0.1:", port)));
  auto send = [&stub](const std::string& job, int64_t step, int64_t values) {
    grpc::ClientContext ctx;
    v1::ApplyClosedStepsResponse resp;
    auto writer = stub->ApplyClosedSteps(&ctx, &resp);
    v1::ClosedStepChunk first;
    first.mutable_header()->set_job_id(job);
    first.mutable_header()->set_map_version(1);
    first.mutable_header()->set_step(step);
    first.mutable_header()->set_samples(values > 0 ? 1 : 0);
    writer->Write(first);
    v1::ClosedStepChunk piece;
    piece.mutable_data()->assign(values * 4, '\0');
    if (values > 0) writer->Write(piece);
    writer->WritesDone();
    return FromGrpc(writer->Finish());
  };
  EXPECT_THAT(send("job-1", 2, 25),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("larger than the range")));
  EXPECT_THAT(send("job-1", 2, 23),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("mean")));
  EXPECT_THAT(send("job-1", 5, 24),
              testing::HasReason(absl::StatusCode::kFailedPrecondition,
                                 v1::STEP_NOT_OPEN));
  EXPECT_THAT(send("job-9", 2, 24),
              testing::StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("job-9")));
  TALLY_EXPECT_OK(send("job-1", 1, 24));  // made already: acknowledged
  EXPECT_EQ(b->shard->version(), 2);
  // The primary's shard is lost: the backup takes over; the primary (if
  // it were alive) would publish without it.
  absl::StatusOr<int64_t> promoted = backup.Promote("job-1", 1);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(*promoted, 2);
  EXPECT_FALSE(backup.Find("job-1")->backup);
  EXPECT_THAT(backup.Promote("job-1", 1),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("primary already")));
  TALLY_EXPECT_OK(primary.SetBackup("job-1", 1, "", 0));
  EXPECT_TRUE(primary.Find("job-1")->peer_address.empty());
  server->Shutdown();
}

}  // namespace
}  // namespace tally
