// The worker's row client against a real shard process over a socket. A
// shard map is a placement: rows routed by the map the client was built
// from reach that placement, and a map of another placement (a stale one:
// the job was placed again after a lost shard, perhaps at the same
// address, in another order, rolled back to its checkpoint) is answered
// NOT_FOUND, never with rows or a step of the new placement. A shard that
// is away is retried only while the client's owner still wants the answer.
#include "worker/row_client.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "gtest/gtest.h"
#include "proto/errors.h"
#include "server/tally_server.h"
#include "tests/test_util.h"
#include "worker/reaction.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

// A Python model of 8 parameters and one table of 64 rows x 4 (SGD).
constexpr char kSpec[] = R"(
name: rows
model:
  python: {file: m.py, code: x, params: [{name: fc.weight, shape: [2, 4]}]}
  embeddings: [{name: emb, dim: 4, num_embeddings: 64}]
dataset: {name: synthetic, features: 4, classes: 2, train_size: 64}
training: {workers: 1, batch_size: 8, seed: 3}
optimizer: {type: sgd, lr: 0.5}
)";
constexpr char kJob[] = "job-1";
constexpr int64_t kPlaced = 7;  // the map version of the range installed

class RowClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.join = "127.0.0.1:1";  // no coordinator there: it keeps retrying
    auto server = TallyServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(kSpec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    tables_ = spec->embeddings;
    seed_ = spec->training.seed;
    // The whole vector and every row on this one shard (slot 0 of 1), at
    // version 0, with one member.
    v1::InstallRangeRequest req;
    req.set_job_id(kJob);
    req.set_spec(kSpec);
    req.set_map_version(kPlaced);
    req.set_offset(0);
    req.set_count(8);
    req.set_slot(0);
    req.set_slots(1);
    req.mutable_schedule()->set_train_size(64);
    req.mutable_schedule()->set_steps_per_epoch(8);
    req.mutable_schedule()->set_total_steps(8);
    const std::vector<float> w(8, 0.5f);
    req.mutable_state()->set_version(0);
    req.mutable_state()->set_weights(w.data(), 4 * w.size());
    v1::MemberSpec* m = req.add_members();
    m->set_worker_id("w");
    m->set_incarnation(1);
    TALLY_ASSERT_OK(server_->shard_host()->Install(req));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  // A client whose map names this shard (or `address`) at `map_version`.
  std::unique_ptr<RowClient> Client(int64_t map_version,
                                    std::string address = "",
                                    RowClientOptions o = {}) {
    v1::ShardMap map;
    map.set_version(map_version);
    v1::ShardMap::Entry* e = map.add_shards();
    e->set_address(address.empty()
                       ? absl::StrCat("127.0.0.1:", server_->data_port())
                       : address);
    e->set_count(8);
    o.job_id = kJob;
    o.worker_id = "w";
    o.incarnation = 1;
    o.pull_wait = absl::Milliseconds(500);
    auto client = RowClient::Create(map, tables_, "127.0.0.1:1", o);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    return *std::move(client);
  }

  std::unique_ptr<TallyServer> server_;
  std::vector<EmbeddingTableSpec> tables_;
  uint64_t seed_ = 0;
};

TEST_F(RowClientTest, TheMapsPlacementServesItsRows) {
  std::unique_ptr<RowClient> client = Client(kPlaced);
  ASSERT_NE(client, nullptr);
  client->BeginStep(0, 0);
  const int64_t rows[] = {1, 2, 60};
  std::vector<float> got(3 * 4), want(4);
  TALLY_ASSERT_OK(client->Pull(0, rows, 3, got.data()));
  for (int i = 0; i < 3; ++i) {
    InitRow(tables_[0], seed_, rows[i], want.data());
    EXPECT_EQ(std::vector<float>(got.begin() + 4 * i, got.begin() + 4 * i + 4),
              want);
  }
  const std::vector<float> grads(3 * 4, 0.25f);
  TALLY_EXPECT_OK(client->Push(1, {{0, rows, 3, grads.data()}}));
  // A client that names no placement (0) is served too.
  std::unique_ptr<RowClient> any = Client(0);
  ASSERT_NE(any, nullptr);
  any->BeginStep(0, 0);
  TALLY_EXPECT_OK(any->Pull(0, rows, 3, got.data()));
}

// The scenario of a shard killed and restarted at its address: the runner
// of the old map still holds a step past the version the job was restored
// to. Its rows reach the new placement's shard, which answers NOT_FOUND:
// a stale map, not a row of another slot nor a step that is not open.
TEST_F(RowClientTest, AnotherPlacementsMapIsAnsweredAsStale) {
  std::unique_ptr<RowClient> stale = Client(kPlaced - 1);
  ASSERT_NE(stale, nullptr);
  stale->BeginStep(5, 5);
  const int64_t rows[] = {1, 2};
  std::vector<float> out(2 * 4);
  absl::Status pulled = stale->Pull(0, rows, 2, out.data());
  EXPECT_THAT(pulled, StatusIs(absl::StatusCode::kNotFound,
                               HasSubstr("map version 7, not 6")));
  EXPECT_EQ(ReactTo(Call::kRows, pulled), Reaction::kStaleMap);
  const std::vector<float> grads(2 * 4, 1.0f);
  absl::Status pushed = stale->Push(1, {{0, rows, 2, grads.data()}});
  EXPECT_THAT(pushed, StatusIs(absl::StatusCode::kNotFound,
                               HasSubstr("map version 7, not 6")));
  EXPECT_EQ(ReactTo(Call::kRows, pushed), Reaction::kStaleMap);
  // The same step from the placement's own map: the step is not open (the
  // range is at version 0), which the runner answers by pulling again.
  std::unique_ptr<RowClient> current = Client(kPlaced);
  ASSERT_NE(current, nullptr);
  current->BeginStep(5, 0);
  absl::Status ahead = current->Push(1, {{0, rows, 2, grads.data()}});
  EXPECT_THAT(ahead,
              HasReason(absl::StatusCode::kAborted, v1::STEP_NOT_OPEN));
  EXPECT_EQ(ReactTo(Call::kRows, ahead), Reaction::kPullAgain);
}

// A shard that is gone is tried again only while keep_trying says so: the
// call is not held for the RPC timeout once its answer no longer matters.
TEST_F(RowClientTest, AShardAwayIsRetriedOnlyWhileWanted) {
  auto asked = std::make_shared<std::atomic<int>>(0);
  RowClientOptions o;
  o.rpc_timeout = absl::Minutes(5);
  o.keep_trying = [asked] {
    ++*asked;
    return false;
  };
  // Nothing listens on port 1: every attempt is UNAVAILABLE.
  std::unique_ptr<RowClient> client = Client(kPlaced, "127.0.0.1:1", o);
  ASSERT_NE(client, nullptr);
  client->BeginStep(0, 0);
  const int64_t rows[] = {3};
  std::vector<float> out(4);
  const absl::Time began = absl::Now();
  absl::Status s = client->Pull(0, rows, 1, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(asked->load(), 1);  // asked before the first retry, which went
  EXPECT_LT(absl::Now() - began, absl::Minutes(1));
  const std::vector<float> grads(4, 1.0f);
  s = client->Push(1, {{0, rows, 1, grads.data()}});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(asked->load(), 2);
}

}  // namespace
}  // namespace tally
