// The worker's half of a stream's shared-memory handshake, without a
// shard: asked once (if wanted), an offer taken only when asked for and
// only once, the reply written once, and the mapped region's parts taken
// one op at a time.
#include "worker/internal/shared_memory.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "proto/tally.pb.h"
#include "tests/test_util.h"

namespace tally {
namespace internal {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;
using State = StreamSharing::State;

v1::SharedMemoryReply ReplyOf(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  v1::ExchangeRequest r;
  EXPECT_TRUE(r.ParseFromString(bytes));
  return r.shared();
}

TEST(StreamSharingTest, NotWantedNeverAsksNorTakesAnOffer) {
  StreamSharing s(/*wanted=*/false);
  EXPECT_EQ(s.state(), State::kOff);
  EXPECT_FALSE(s.Ask());
  EXPECT_THAT(s.Offered(), StatusIs(absl::StatusCode::kDataLoss,
                                    HasSubstr("nobody asked for")));
  EXPECT_EQ(s.Take(SharedRegion::kPull, 1), nullptr);
}

TEST(StreamSharingTest, AsksOnceAndTakesOneOffer) {
  StreamSharing s(/*wanted=*/true);
  EXPECT_EQ(s.state(), State::kNotAsked);
  EXPECT_THAT(s.Offered(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("nobody asked for")));
  EXPECT_TRUE(s.Ask());
  EXPECT_FALSE(s.Ask());  // the stream's first pull alone asks
  EXPECT_EQ(s.state(), State::kAsked);
  TALLY_EXPECT_OK(s.Offered());
  EXPECT_EQ(s.state(), State::kAnswered);
  EXPECT_THAT(s.Offered(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("nobody asked for")));
}

TEST(StreamSharingTest, AnOfferThatDoesNotMapIsAnsweredWithWhy) {
  StreamSharing s(/*wanted=*/true);
  ASSERT_TRUE(s.Ask());
  TALLY_ASSERT_OK(s.Offered());
  grpc::ByteBuffer out;
  EXPECT_FALSE(s.TakeReply(&out));  // nothing before the mapping's outcome
  s.Answer(absl::PermissionDeniedError("another pid namespace"));
  ASSERT_TRUE(s.TakeReply(&out));
  const v1::SharedMemoryReply reply = ReplyOf(out);
  EXPECT_FALSE(reply.mapped());
  EXPECT_EQ(reply.error(), "another pid namespace");
  EXPECT_FALSE(s.TakeReply(&out));  // written once
  EXPECT_EQ(s.region(), nullptr);
  EXPECT_EQ(s.Take(SharedRegion::kPush, 1), nullptr);
}

// A region made here stands in for the shard's: mapped, it is used by one
// push and one pull at a time, each within its part.
TEST(StreamSharingTest, AMappedRegionIsTakenOnePartAtATime) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create(4 * 8, 4 * 16);
  if (!region.ok()) GTEST_SKIP() << region.status();
  const int64_t push_values = (*region)->part_bytes(SharedRegion::kPush) / 4;
  const int64_t pull_values = (*region)->part_bytes(SharedRegion::kPull) / 4;
  StreamSharing s(/*wanted=*/true);
  ASSERT_TRUE(s.Ask());
  TALLY_ASSERT_OK(s.Offered());
  s.Answer(std::move(region));
  grpc::ByteBuffer out;
  ASSERT_TRUE(s.TakeReply(&out));
  EXPECT_TRUE(ReplyOf(out).mapped());
  ASSERT_NE(s.region(), nullptr);
  // Larger than its part.
  EXPECT_EQ(s.Take(SharedRegion::kPush, push_values + 1), nullptr);
  std::unique_ptr<SharedPart> push = s.Take(SharedRegion::kPush, 8);
  ASSERT_NE(push, nullptr);
  EXPECT_EQ(s.Take(SharedRegion::kPush, 1), nullptr);  // in use
  std::unique_ptr<SharedPart> pull = s.Take(SharedRegion::kPull, pull_values);
  ASSERT_NE(pull, nullptr);
  push->Give();
  push->Give();  // once only: the part stays the next taker's
  std::unique_ptr<SharedPart> next = s.Take(SharedRegion::kPush, 8);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(s.Take(SharedRegion::kPush, 8), nullptr);
  pull.reset();  // given back with the op
  EXPECT_NE(s.Take(SharedRegion::kPull, 16), nullptr);
}

TEST(UseSharedPullTest, WeightsOutsideThePullPartAreRefused) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create(4 * 8, 4 * 8);
  if (!region.ok()) GTEST_SKIP() << region.status();
  v1::PullResponse r;
  r.set_version(1);
  v1::TensorChunk* c = r.mutable_chunk();
  c->set_offset(0);
  c->set_count(8);
  c->set_shared_offset((*region)->pull_at());
  grpc::Slice slice(r.SerializeAsString());
  grpc::ByteBuffer b(&slice, 1);
  WireMessage msg;
  TALLY_ASSERT_OK(msg.Parse(b, 3));
  TALLY_EXPECT_OK(UseSharedPull(region->get(), &msg));
  EXPECT_EQ(msg.chunk().data_size, 4 * 8);
  c->set_shared_offset((*region)->push_at());  // the push part's
  grpc::Slice push_slice(r.SerializeAsString());
  grpc::ByteBuffer push_b(&push_slice, 1);
  TALLY_ASSERT_OK(msg.Parse(push_b, 3));
  EXPECT_THAT(UseSharedPull(region->get(), &msg),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("outside the stream's region")));
  EXPECT_THAT(UseSharedPull(nullptr, &msg),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("outside the stream's region")));
}

}  // namespace
}  // namespace internal
}  // namespace tally
