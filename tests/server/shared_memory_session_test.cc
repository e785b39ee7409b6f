// An Exchange stream's shared-memory handshake as a shard holds it,
// without a server: one offer a stream, to a member on this host within
// the host's bounds; a reply only to an offer and only once; values only
// through a mapped region, inside its parts; an offer unanswered for long
// loses its descriptor; the host counts the region until it is refused or
// the session ends.
#include "server/data/shared_memory_session.h"

#include <grpcpp/support/byte_buffer.h>

#include <cstring>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/data/shard_host.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;
using State = SharedMemorySession::State;

constexpr int64_t kCount = 8;  // the range's values

class SharedMemorySessionTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeHost(int64_t{16} << 20); }

  // A host whose ranges share at most `shared_bytes` (0: never), with
  // job-1's range installed and "w" its member.
  void MakeHost(int64_t shared_bytes) {
    ShardHost::Options options;
    options.shared_memory_max_bytes = shared_bytes;
    host_ = std::make_unique<ShardHost>(nullptr, SpecLimits(), options);
    v1::InstallRangeRequest req;
    req.set_job_id("job-1");
    req.set_spec(
        "name: s\nmodel: {layers: [{linear: {in_features: 3, "
        "out_features: 2}}]}\ndataset: {name: synthetic, features: 3, "
        "classes: 2, train_size: 64}\ntraining: {workers: 1}\n");
    req.set_map_version(1);
    req.set_count(kCount);
    req.mutable_schedule()->set_train_size(64);
    req.mutable_schedule()->set_steps_per_epoch(1);
    req.mutable_schedule()->set_total_steps(1);
    TALLY_ASSERT_OK(host_->Install(req));
    absl::StatusOr<Range> range = host_->Find("job-1");
    ASSERT_TRUE(range.ok()) << range.status();
    range->shard->AddMember("w", 1);
  }

  // A pull of member "w" that asks for an offer.
  static v1::PullRequest Asking(const std::string& worker = "w") {
    v1::PullRequest req;
    req.set_job_id("job-1");
    req.set_map_version(1);
    req.set_worker_id(worker);
    req.set_incarnation(1);
    req.set_offer_shared_memory(true);
    return req;
  }

  // Offers a region to "w", or skips the test where none can be made.
  void Offered(SharedMemorySession& s, v1::ExchangeResponse* offer) {
    if (!s.Offer(Asking(), now_, offer)) {
      ASSERT_EQ(host_->shared_regions(), 0);
      GTEST_SKIP() << "no shared memory here";
    }
    ASSERT_EQ(s.state(), State::kOffered);
    ASSERT_EQ(host_->shared_regions(), 1);
  }

  std::unique_ptr<ShardHost> host_;
  const absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(SharedMemorySessionTest, OffersOnceAStreamToAMemberOnThisHost) {
  SharedMemorySession s(host_.get(), /*colocated=*/true);
  EXPECT_EQ(s.state(), State::kNotAsked);
  v1::ExchangeResponse offer;
  v1::PullRequest quiet = Asking();
  quiet.set_offer_shared_memory(false);
  EXPECT_FALSE(s.Offer(quiet, now_, &offer));  // a pull that does not ask
  EXPECT_EQ(s.state(), State::kNotAsked);
  Offered(s, &offer);
  if (::testing::Test::IsSkipped()) return;
  EXPECT_TRUE(offer.has_shared());
  EXPECT_GE(offer.shared().size(), 8 * kCount);  // a push and a pull
  v1::ExchangeResponse again;
  EXPECT_FALSE(s.Offer(Asking(), now_, &again));
  EXPECT_FALSE(again.has_shared());
  EXPECT_EQ(host_->shared_regions(), 1);
}

TEST_F(SharedMemorySessionTest, OffersNothingToWhomItMayNot) {
  v1::ExchangeResponse offer;
  {
    SharedMemorySession s(host_.get(), /*colocated=*/false);  // another host
    EXPECT_FALSE(s.Offer(Asking(), now_, &offer));
    EXPECT_EQ(s.state(), State::kNotOffered);
    // Asked once: a later pull does not ask again.
    SharedMemorySession t(host_.get(), /*colocated=*/true);
    EXPECT_FALSE(t.Offer(Asking("stranger"), now_, &offer));
    EXPECT_EQ(t.state(), State::kNotOffered);
    EXPECT_FALSE(t.Offer(Asking(), now_, &offer));
    EXPECT_EQ(t.state(), State::kNotOffered);
    v1::PullRequest unknown = Asking();
    unknown.set_job_id("job-2");
    SharedMemorySession u(host_.get(), /*colocated=*/true);
    EXPECT_FALSE(u.Offer(unknown, now_, &offer));
  }
  MakeHost(0);  // sharing off
  SharedMemorySession s(host_.get(), /*colocated=*/true);
  EXPECT_FALSE(s.Offer(Asking(), now_, &offer));
  EXPECT_FALSE(offer.has_shared());
  EXPECT_EQ(host_->shared_regions(), 0);
}

TEST_F(SharedMemorySessionTest, RepliesGoToAnOfferOnlyAndOnce) {
  v1::SharedMemoryReply mapped;
  mapped.set_mapped(true);
  SharedMemorySession none(host_.get(), /*colocated=*/true);
  EXPECT_THAT(none.Reply(mapped),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("to no offer")));
  // Asked, none offered: a reply is taken, and ends the handshake.
  SharedMemorySession far(host_.get(), /*colocated=*/false);
  v1::ExchangeResponse offer;
  EXPECT_FALSE(far.Offer(Asking(), now_, &offer));
  TALLY_EXPECT_OK(far.Reply(v1::SharedMemoryReply()));
  EXPECT_EQ(far.state(), State::kDeclined);
  EXPECT_THAT(far.Reply(mapped), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("a second")));
}

TEST_F(SharedMemorySessionTest, AMappedRegionCarriesValuesWithinItsParts) {
  SharedMemorySession s(host_.get(), /*colocated=*/true);
  EXPECT_THAT(s.PullRegion(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("no region mapped")));
  v1::ExchangeResponse offer;
  Offered(s, &offer);
  if (::testing::Test::IsSkipped()) return;
  EXPECT_THAT(s.PullRegion(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("no region mapped")));
  v1::SharedMemoryReply mapped;
  mapped.set_mapped(true);
  TALLY_ASSERT_OK(s.Reply(mapped));
  EXPECT_EQ(s.state(), State::kMapped);
  absl::StatusOr<SharedRegion*> region = s.PullRegion();
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_GE((*region)->part_bytes(SharedRegion::kPull), 4 * kCount);

  // A push chunk of 4 values at the start of the push part.
  auto chunk_at = [](int64_t shared_offset) {
    v1::PushRequest r;
    v1::TensorChunk* c = r.mutable_chunk();
    c->set_offset(0);
    c->set_count(4);
    c->set_shared_offset(shared_offset);
    grpc::Slice slice(r.SerializeAsString());
    return grpc::ByteBuffer(&slice, 1);
  };
  const float values[4] = {1, 2, 3, 4};
  std::memcpy((*region)->data() + (*region)->push_at(), values, 16);
  WireMessage msg;
  TALLY_ASSERT_OK(msg.Parse(chunk_at((*region)->push_at()), 2));
  TALLY_ASSERT_OK(s.UsePushChunk(&msg));
  EXPECT_EQ(msg.chunk().data_size, 16);
  EXPECT_EQ(host_->shared_pushed_bytes(), 16);
  // The pull part is not the push part's.
  TALLY_ASSERT_OK(msg.Parse(chunk_at((*region)->pull_at()), 2));
  EXPECT_THAT(s.UsePushChunk(&msg),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("outside the shared region's part")));
}

TEST_F(SharedMemorySessionTest, NoValuesGoThroughARegionNotMapped) {
  SharedMemorySession s(host_.get(), /*colocated=*/true);
  v1::PushRequest r;
  r.mutable_chunk()->set_count(1);
  r.mutable_chunk()->set_shared_offset(0);
  grpc::Slice slice(r.SerializeAsString());
  WireMessage msg;
  TALLY_ASSERT_OK(msg.Parse(grpc::ByteBuffer(&slice, 1), 2));
  EXPECT_THAT(s.UsePushChunk(&msg),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no region mapped")));
}

TEST_F(SharedMemorySessionTest, ARefusedRegionIsNoLongerCounted) {
  SharedMemorySession s(host_.get(), /*colocated=*/true);
  v1::ExchangeResponse offer;
  Offered(s, &offer);
  if (::testing::Test::IsSkipped()) return;
  v1::SharedMemoryReply refused;
  refused.set_error("another pid namespace");
  TALLY_ASSERT_OK(s.Reply(refused));
  EXPECT_EQ(s.state(), State::kDeclined);
  EXPECT_EQ(host_->shared_regions(), 0);
  EXPECT_THAT(s.PullRegion(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("no region mapped")));
}

TEST_F(SharedMemorySessionTest, TheSessionsEndReleasesItsRegion) {
  {
    SharedMemorySession s(host_.get(), /*colocated=*/true);
    v1::ExchangeResponse offer;
    Offered(s, &offer);
    if (::testing::Test::IsSkipped()) return;
    v1::SharedMemoryReply mapped;
    mapped.set_mapped(true);
    TALLY_ASSERT_OK(s.Reply(mapped));
  }
  EXPECT_EQ(host_->shared_regions(), 0);
}

// The descriptor of an offer goes once the worker has had its time to
// open it; the region stays for the reply.
TEST_F(SharedMemorySessionTest, AnOfferUnansweredForLongClosesItsDescriptor) {
  SharedMemorySession s(host_.get(), /*colocated=*/true);
  v1::ExchangeResponse offer;
  Offered(s, &offer);
  if (::testing::Test::IsSkipped()) return;
  const absl::Duration answer = host_->waits().offer_answer;
  s.CloseIfUnanswered(now_ + answer);
  if (absl::Status open = SharedRegion::Map(offer.shared()).status();
      !open.ok()) {
    GTEST_SKIP() << "this process cannot map its own region: " << open;
  }
  s.CloseIfUnanswered(now_ + answer + absl::Milliseconds(1));
  EXPECT_FALSE(SharedRegion::Map(offer.shared()).ok());
  EXPECT_EQ(s.state(), State::kOffered);
  v1::SharedMemoryReply mapped;
  mapped.set_mapped(true);
  TALLY_EXPECT_OK(s.Reply(mapped));
  EXPECT_TRUE(s.PullRegion().ok());
}

}  // namespace
}  // namespace tally
