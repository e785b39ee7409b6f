// The worker's parameter client against a real one-process server over a
// socket, on Exchange streams (over TCP, and through memory the shard
// shares) and on a call per push and pull: a push fed
// range by range (as the backward pass produces it) moves the weights
// exactly as a whole push does; a feed closed early stages nothing, and the
// retry counts once; an exchange on a stream that breaks fails with the
// stream's code, and the next one goes on a new stream.
#include "worker/param_client.h"

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "proto/errors.h"
#include "proto/transport.h"
#include "server/tally_server.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;

// 4 x 3 weights and 3 biases; plain SGD with lr 1, so the next weights are
// exactly the old ones minus the (one worker's) gradient.
constexpr char kSpec[] = R"(
name: tiny
model: {layers: [{linear: {in_features: 4, out_features: 3}}]}
dataset: {name: synthetic, features: 4, classes: 3}
training: {workers: 1}
optimizer: {type: sgd, lr: 1.0}
)";
constexpr int64_t kParams = 15;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

enum class Transport { kCalls, kExchange, kShared };

// Mappings of shared regions in this process (the shard's and the
// client's: both live here).
int SharedMappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    n += line.find("memfd:tally-shared") != std::string::npos;
  return n;
}

class ParamClientTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.lease_timeout = absl::Seconds(30);
    auto s = TallyServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    auto channel = Dial(address_);
    auto jobs = v1::JobService::NewStub(channel);
    auto workers = v1::WorkerService::NewStub(channel);
    grpc::ClientContext c1, c2;
    v1::SubmitJobRequest req;
    req.set_spec(kSpec);
    v1::SubmitJobResponse job;
    ASSERT_TRUE(jobs->SubmitJob(&c1, req, &job).ok());
    v1::RegisterWorkerRequest reg;
    reg.set_name("t");
    reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    v1::RegisterWorkerResponse worker;
    ASSERT_TRUE(workers->RegisterWorker(&c2, reg, &worker).ok());

    ParamClientOptions po;
    po.job_id = job.job().id();
    job_id_ = po.job_id;
    po.worker_id = worker.worker_id();
    po.incarnation = worker.incarnation();
    po.chunk_elements = 4;  // a push of 15 is several messages
    po.pull_wait = absl::Seconds(1);
    po.exchange = GetParam() != Transport::kCalls;
    po.shared_memory = GetParam() == Transport::kShared;
    po.stream_lifetime = stream_lifetime_;
    v1::ShardMap map;
    v1::ShardMap::Entry* own = map.add_shards();  // the coordinator's shard
    own->set_address(absl::StrCat(":", server_->data_port()));
    own->set_count(kParams);
    options_ = po;
    map_ = map;
    auto client = ParameterClient::Create(map, kParams, address_, po);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    for (int64_t i = 0; i < kParams; ++i) grads_[i] = 0.125f * (i + 1);
  }

  std::vector<float> PullVersion(int64_t v) {
    std::vector<float> w(kParams);
    auto version = client_->Pull(v, w.data())->WaitVersion(Soon());
    EXPECT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(*version, v);
    return w;
  }

  PushInfo Step(int64_t step) {
    PushInfo info;
    info.step = step;
    info.samples = 4;
    info.commit = true;  // one shard: the push commits its step
    return info;
  }

  absl::Duration stream_lifetime_ = absl::Minutes(10);
  ParamClientOptions options_;  // client_'s
  v1::ShardMap map_;            // client_'s: no version (any placement)
  std::unique_ptr<TallyServer> server_;
  std::string address_;
  std::string job_id_;
  std::unique_ptr<ParameterClient> client_;
  float grads_[kParams];
};

TEST_P(ParamClientTest, AFedPushInAnyOrderMovesTheWeightsAsAWholePushDoes) {
  const std::vector<float> w0 = PullVersion(0);
  std::unique_ptr<PushFeed> feed;
  auto push = client_->Push(Step(0), grads_, &feed);
  ASSERT_NE(feed, nullptr);
  // The last layer first, as backward produces them: the biases (less than
  // a chunk: they wait for their neighbours), then the weights in two
  // pieces, from another thread.
  feed->Offer(12, 15);
  std::thread([&] {
    feed->Offer(5, 12);
    feed->Offer(0, 5);
  }).join();
  ASSERT_TRUE(push->Wait(Soon()).ok()) << push->Results()[0];
  EXPECT_TRUE(push->Committed());
  const std::vector<float> w1 = PullVersion(1);
  for (int64_t i = 0; i < kParams; ++i) EXPECT_EQ(w1[i], w0[i] - grads_[i]);

  // The same gradient pushed whole, for the next step: the same move.
  auto whole = client_->Push(Step(1), grads_);
  ASSERT_TRUE(whole->Wait(Soon()).ok()) << whole->Results()[0];
  const std::vector<float> w2 = PullVersion(2);
  for (int64_t i = 0; i < kParams; ++i) EXPECT_EQ(w2[i], w1[i] - grads_[i]);
  // Only the shared transport went through shared memory, both ways: the
  // fed push from several threads, the whole one, every pull but the
  // first (which asked for the region).
  const bool shared = GetParam() == Transport::kShared;
  EXPECT_EQ(SharedMappings() >= 2, shared) << SharedMappings();
  ShardHost* host = server_->shard_host();
  EXPECT_EQ(host->shared_pushed_bytes(), shared ? 2 * 4 * kParams : 0);
  EXPECT_EQ(host->shared_pulled_bytes(), shared ? 2 * 4 * kParams : 0);
  // The region goes with the stream.
  client_.reset();
  for (int i = 0; i < 100 && host->shared_regions() > 0; ++i)
    absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(host->shared_regions(), 0);
  EXPECT_EQ(SharedMappings(), 0);
}

TEST_P(ParamClientTest, AFeedClosedEarlyStagesNothingAndTheRetryCountsOnce) {
  const std::vector<float> w0 = PullVersion(0);
  {
    std::unique_ptr<PushFeed> feed;
    auto push = client_->Push(Step(0), grads_, &feed);
    feed->Offer(4, 15);  // sent: more than a bucket
    feed->Close();       // the step failed before the first layer's gradient
    EXPECT_THAT(push->Wait(Soon()),
                StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  }
  // The push sent again, whole: its first arrival, counted once.
  auto retry = client_->Push(Step(0), grads_);
  ASSERT_TRUE(retry->Wait(Soon()).ok()) << retry->Results()[0];
  EXPECT_TRUE(retry->Committed());
  const std::vector<float> w1 = PullVersion(1);
  for (int64_t i = 0; i < kParams; ++i) EXPECT_EQ(w1[i], w0[i] - grads_[i]);
  // A feed destroyed without a word closes too: the work ends.
  std::unique_ptr<PushFeed> feed;
  auto abandoned = client_->Push(Step(1), grads_, &feed);
  feed.reset();
  EXPECT_THAT(abandoned->Wait(Soon()),
              StatusIs(absl::StatusCode::kCancelled, ::testing::_));
}

TEST_P(ParamClientTest, ANonFiniteValueInAFedRangeIsRefusedAsAWholePushIs) {
  PullVersion(0);
  grads_[13] = std::numeric_limits<float>::quiet_NaN();
  std::unique_ptr<PushFeed> feed;
  auto push = client_->Push(Step(0), grads_, &feed);
  feed->Offer(8, 15);
  feed->Offer(0, 8);
  EXPECT_THAT(push->Wait(Soon()),
              HasReason(absl::StatusCode::kInvalidArgument, v1::NON_FINITE));
  // Refused and committed as nothing: the step closed without moving.
  std::vector<float> w(kParams);
  EXPECT_EQ(*client_->Pull(1, w.data())->WaitVersion(Soon()), 1);
}

// A pull's ranges can be waited for before the whole pull is done; a range
// of a pull that fails gives the pull's error.
TEST_P(ParamClientTest, APullsRangesAreThereOnceArrivedAndItsErrorIfItFails) {
  const std::vector<float> w0 = PullVersion(0);
  std::vector<float> w(kParams);
  auto pull = client_->Pull(0, w.data());
  ASSERT_TRUE(pull->WaitRange(0, 5, Soon()).ok());
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(w[i], w0[i]);
  ASSERT_TRUE(pull->WaitRange(5, kParams, Soon()).ok());
  EXPECT_EQ(*pull->WaitVersion(Soon()), 0);
  EXPECT_EQ(w, w0);
  // Version 1 does not come (step 0 was not pushed): the shard's bound
  // ends the wait, and so the range's.
  auto late = client_->Pull(1, w.data());
  EXPECT_THAT(late->WaitRange(0, 5, Soon()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
}

// A Python model's buffer region rides on the first range's pushes and
// pulls (PushHeader.buffers, PullResponse.buffers), on every transport.
TEST_P(ParamClientTest, TheBufferRegionGoesWithThePushAndComesBackWithThePull) {
  auto range = server_->shard_host()->Find(job_id_);
  ASSERT_TRUE(range.ok()) << range.status();
  // The job's range placed again here as a Python model's of the same
  // shape, with 5 bytes of buffers (a range keeps its region from its
  // install on); the client's map names no placement, so it follows.
  v1::InstallRangeRequest req;
  req.set_job_id(job_id_);
  req.set_spec(R"(
name: tiny
model: {python: {file: m.py, code: x,
                 params: [{name: fc.weight, shape: [3, 4]},
                          {name: fc.bias, shape: [3]}],
                 buffers: [{name: bn.stats, dtype: U8, shape: [5]}]}}
dataset: {name: synthetic, features: 4, classes: 3}
training: {workers: 1}
optimizer: {type: sgd, lr: 1.0}
)");
  req.set_map_version(range->map_version + 1);
  req.set_offset(0);
  req.set_count(kParams);
  const ShardMetrics placed = range->shard->Metrics();
  req.mutable_schedule()->set_total_steps(placed.total_steps);
  req.mutable_schedule()->set_steps_per_epoch(placed.steps_per_epoch);
  int64_t at = 0;
  const std::vector<float> w0 = *range->shard->Snapshot(&at);
  req.mutable_state()->set_version(at);
  req.mutable_state()->set_weights(w0.data(), 4 * w0.size());
  v1::MemberSpec* member = req.add_members();
  member->set_worker_id(options_.worker_id);
  member->set_incarnation(options_.incarnation);
  TALLY_ASSERT_OK(server_->shard_host()->Install(req));
  std::vector<float> w(kParams);
  auto buffers = std::make_shared<std::string>("untouched");
  auto v = client_->Pull(0, w.data(), nullptr, -1, buffers)->WaitVersion(Soon());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*buffers, "untouched");  // no region yet: left as it is
  const std::string mine("bn\0\1\2", 5);
  PushInfo info = Step(0);
  info.buffers = &mine;
  auto push = client_->Push(info, grads_);
  ASSERT_TRUE(push->Wait(Soon()).ok()) << push->Results()[0];
  v = client_->Pull(1, w.data(), nullptr, -1, buffers)->WaitVersion(Soon());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 1);
  EXPECT_EQ(*buffers, mine);
  // Buffers of another size are refused, by their size.
  const std::string wrong = "bn";
  info = Step(1);
  info.buffers = &wrong;
  push = client_->Push(info, grads_);
  EXPECT_THAT(push->Wait(Soon()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("buffers of 2 bytes")));
}

// A client built from another placement's map (the job was placed again
// since: a lost shard, a roll-back to a checkpoint) is answered NOT_FOUND,
// a stale map, on every transport, and its push stages nothing: the
// placement's own map then closes the step with its own gradient.
TEST_P(ParamClientTest, AnotherPlacementsMapIsAnsweredAsStale) {
  auto range = server_->shard_host()->Find(job_id_);
  ASSERT_TRUE(range.ok()) << range.status();
  const int64_t placed = range->map_version;
  ASSERT_GT(placed, 1);
  v1::ShardMap stale = map_;
  stale.set_version(placed - 1);
  auto old = ParameterClient::Create(stale, kParams, address_, options_);
  ASSERT_TRUE(old.ok()) << old.status();
  std::vector<float> w(kParams);
  EXPECT_THAT((*old)->Pull(0, w.data())->WaitVersion(Soon()),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::HasSubstr("map version")));
  std::vector<float> twice(kParams);
  for (int64_t i = 0; i < kParams; ++i) twice[i] = 2 * grads_[i];
  auto refused = (*old)->Push(Step(0), twice.data());
  EXPECT_THAT(refused->Wait(Soon()),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::HasSubstr("map version")));
  v1::ShardMap own = map_;
  own.set_version(placed);
  auto current = ParameterClient::Create(own, kParams, address_, options_);
  ASSERT_TRUE(current.ok()) << current.status();
  auto v = (*current)->Pull(0, w.data())->WaitVersion(Soon());
  ASSERT_TRUE(v.ok()) << v.status();
  const std::vector<float> w0 = w;
  auto push = (*current)->Push(Step(0), grads_);
  ASSERT_TRUE(push->Wait(Soon()).ok()) << push->Results()[0];
  v = (*current)->Pull(1, w.data())->WaitVersion(Soon());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 1);
  for (int64_t i = 0; i < kParams; ++i) EXPECT_EQ(w[i], w0[i] - grads_[i]);
}

class ShortStreamTest : public ParamClientTest {
 protected:
  void SetUp() override {
    stream_lifetime_ = absl::Milliseconds(400);
    ParamClientTest::SetUp();
  }
};

// A stream that ends under an exchange (here its deadline passes while a
// pull waits for a version that does not come) fails that exchange with
// the stream's code; the next exchange opens a new stream and goes on.
TEST_P(ShortStreamTest, AnExchangeOnABrokenStreamFailsAndTheNextOneGoesOn) {
  const std::vector<float> w0 = PullVersion(0);
  std::vector<float> w(kParams);
  auto stuck = client_->Pull(1, w.data());  // step 0 was never pushed
  EXPECT_THAT(stuck->Wait(Soon()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  auto push = client_->Push(Step(0), grads_);
  ASSERT_TRUE(push->Wait(Soon()).ok()) << push->Results()[0];
  EXPECT_TRUE(push->Committed());
  const std::vector<float> w1 = PullVersion(1);
  for (int64_t i = 0; i < kParams; ++i) EXPECT_EQ(w1[i], w0[i] - grads_[i]);
  // An old stream is retired between exchanges, never under one: many
  // exchanges over several lifetimes all succeed.
  for (int64_t step = 1; step < 8; ++step) {
    absl::SleepFor(absl::Milliseconds(100));
    auto p = client_->Push(Step(step), grads_);
    ASSERT_TRUE(p->Wait(Soon()).ok()) << p->Results()[0];
    PullVersion(step + 1);
  }
}

std::string Name(const ::testing::TestParamInfo<Transport>& info) {
  switch (info.param) {
    case Transport::kCalls:
      return "Calls";
    case Transport::kExchange:
      return "Exchange";
    case Transport::kShared:
      return "SharedMemory";
  }
  return "";
}
INSTANTIATE_TEST_SUITE_P(Transport, ParamClientTest,
                         ::testing::Values(Transport::kCalls,
                                           Transport::kExchange,
                                           Transport::kShared),
                         Name);
INSTANTIATE_TEST_SUITE_P(Transport, ShortStreamTest,
                         ::testing::Values(Transport::kExchange,
                                           Transport::kShared),
                         Name);

}  // namespace
}  // namespace tally
