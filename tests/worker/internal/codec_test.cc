// The worker's codec without a server: a push's messages, parsed as the
// .proto's ExchangeRequest, carry the header once, the range in chunks of
// at most chunk_elements (small offers going together) and push_done on
// the last, in either dtype or through a shared region; the gradient stays
// lent until the last message lets go of it. A shard's pull answers
// decode into the flat vector, and what a shard does not send is refused.
#include "worker/internal/codec.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/bfloat16.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "worker/internal/shard_work.h"

namespace tally {
namespace internal {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

std::string Bytes(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Values exact in bfloat16 too: i / 4 - 2.
std::vector<float> Gradient(int n) {
  std::vector<float> g(n);
  for (int i = 0; i < n; ++i) g[i] = static_cast<float>(i) / 4 - 2;
  return g;
}

ParamClientOptions Options(int64_t chunk, v1::DType dtype) {
  ParamClientOptions o;
  o.job_id = "job-1";
  o.worker_id = "w";
  o.incarnation = 3;
  o.map_version = 2;
  o.chunk_elements = chunk;
  o.dtype = dtype;
  return o;
}

PushInfo Info(int64_t samples) {
  PushInfo info;
  info.step = 5;
  info.samples = samples;
  info.loss_sum = 1.5;
  info.correct = 7;
  return info;
}

// A push's parts as the test reads them.
class PushMessagesTest : public ::testing::Test {
 protected:
  // Every message ready now, parsed (the raw ones kept in sent_).
  std::vector<v1::ExchangeRequest> Drain(PushMessages& m) {
    std::vector<v1::ExchangeRequest> out;
    grpc::ByteBuffer b;
    while (m.Next(&b)) {
      v1::ExchangeRequest r;
      EXPECT_TRUE(r.ParseFromString(Bytes(b)));
      out.push_back(r);
      sent_.push_back(b);
    }
    return out;
  }

  std::shared_ptr<ShardWork> work_ = std::make_shared<ShardWork>(1);
  std::shared_ptr<InFlightCalls> in_flight_ =
      std::make_shared<InFlightCalls>();
  std::vector<grpc::ByteBuffer> sent_;
};

TEST_F(PushMessagesTest, AWholeRangeGoesInChunksWithTheHeaderFirst) {
  const std::vector<float> grads = Gradient(200);
  {
    PushMessages m(work_, in_flight_, Options(64, v1::FLOAT32), Info(8),
                   /*commit=*/true, grads.data(), 20, 150, PushDone());
    EXPECT_EQ(m.begin(), 20);
    EXPECT_EQ(m.end(), 170);
    m.Queue(m.begin(), m.end());
    const std::vector<v1::ExchangeRequest> msgs = Drain(m);
    ASSERT_EQ(msgs.size(), 3u);
    EXPECT_TRUE(m.done());
    const v1::PushHeader& h = msgs[0].header();
    EXPECT_EQ(h.job_id(), "job-1");
    EXPECT_EQ(h.worker_id(), "w");
    EXPECT_EQ(h.incarnation(), 3);
    EXPECT_EQ(h.map_version(), 2);
    EXPECT_EQ(h.step(), 5);
    EXPECT_EQ(h.base_version(), 5);  // none given: the step's
    EXPECT_EQ(h.samples(), 8);
    EXPECT_EQ(h.loss_sum(), 1.5);
    EXPECT_EQ(h.correct(), 7);
    EXPECT_TRUE(h.commit());
    std::vector<float> got(200, 0.0f);
    int64_t at = 20;
    for (size_t i = 0; i < msgs.size(); ++i) {
      EXPECT_EQ(msgs[i].has_header(), i == 0);
      EXPECT_EQ(msgs[i].push_done(), i + 1 == msgs.size());
      const v1::TensorChunk& c = msgs[i].chunk();
      EXPECT_EQ(c.offset(), at);
      EXPECT_EQ(c.count(), i < 2 ? 64 : 22);
      TALLY_ASSERT_OK(CheckChunk(c, 200));
      DecodeChunk(c, got.data());
      at += c.count();
    }
    std::vector<float> want(200, 0.0f);
    std::copy(grads.begin() + 20, grads.begin() + 170, want.begin() + 20);
    EXPECT_EQ(got, want);
  }
  // The float32 messages are slices of the caller's gradient: lent until
  // the last of them goes.
  work_->Failed(0, absl::CancelledError("done"));
  EXPECT_FALSE(work_->Done());
  sent_.clear();
  EXPECT_TRUE(work_->Done());
}

// Offers that are final a layer at a time, last layer first: a message
// goes once a chunk of adjacent offers is ready, and the rest once the
// range is whole.
TEST_F(PushMessagesTest, OffersGoTogetherUntilAChunkIsReady) {
  const std::vector<float> grads = Gradient(10);
  PushMessages m(work_, in_flight_, Options(4, v1::FLOAT32), Info(1),
                 /*commit=*/false, grads.data(), 0, 10, std::string());
  m.Queue(6, 8);
  EXPECT_TRUE(Drain(m).empty());
  m.Queue(8, 10);
  std::vector<v1::ExchangeRequest> msgs = Drain(m);
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_TRUE(msgs[0].has_header());
  EXPECT_EQ(msgs[0].chunk().offset(), 6);
  EXPECT_EQ(msgs[0].chunk().count(), 4);
  m.Queue(0, 3);
  EXPECT_TRUE(Drain(m).empty());
  EXPECT_FALSE(m.done());
  m.Queue(3, 6);
  msgs = Drain(m);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_FALSE(msgs[0].has_header());
  EXPECT_EQ(msgs[0].chunk().offset(), 0);
  EXPECT_EQ(msgs[0].chunk().count(), 4);
  EXPECT_EQ(msgs[1].chunk().offset(), 4);
  EXPECT_EQ(msgs[1].chunk().count(), 2);
  EXPECT_FALSE(msgs[1].push_done());  // no suffix asked
  EXPECT_TRUE(m.done());
}

TEST_F(PushMessagesTest, Bfloat16IsEncodedAsOffered) {
  std::vector<float> grads = Gradient(6);
  PushMessages m(work_, in_flight_, Options(100, v1::BFLOAT16), Info(1),
                 /*commit=*/false, grads.data(), 0, 6, PushDone());
  m.Queue(0, 6);
  grads.assign(6, 99.0f);  // encoded already: later changes do not count
  const std::vector<v1::ExchangeRequest> msgs = Drain(m);
  ASSERT_EQ(msgs.size(), 1u);
  const v1::TensorChunk& c = msgs[0].chunk();
  EXPECT_EQ(c.dtype(), v1::BFLOAT16);
  EXPECT_EQ(c.data().size(), 2u * 6);
  std::vector<float> got(6);
  DecodeChunk(c, got.data());
  EXPECT_EQ(got, Gradient(6));
}

TEST_F(PushMessagesTest, APushOfNoSamplesIsItsHeaderAlone) {
  const std::vector<float> grads = Gradient(4);
  PushMessages m(work_, in_flight_, Options(2, v1::FLOAT32), Info(0),
                 /*commit=*/false, grads.data(), 0, 4, PushDone());
  EXPECT_EQ(m.begin(), m.end());
  m.Queue(m.begin(), m.end());
  const std::vector<v1::ExchangeRequest> msgs = Drain(m);
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_TRUE(msgs[0].has_header());
  EXPECT_FALSE(msgs[0].has_chunk());
  EXPECT_TRUE(msgs[0].push_done());
}

TEST_F(PushMessagesTest, DropSendsNothingMoreAndLetsGoOfTheGradient) {
  const std::vector<float> grads = Gradient(8);
  {
    PushMessages m(work_, in_flight_, Options(2, v1::FLOAT32), Info(1),
                   /*commit=*/false, grads.data(), 0, 8, PushDone());
    m.Queue(0, 4);
    m.Drop();
    grpc::ByteBuffer b;
    EXPECT_FALSE(m.Next(&b));
    EXPECT_TRUE(m.done());
    work_->Failed(0, absl::CancelledError("dropped"));
    EXPECT_TRUE(work_->Done());
  }
}

// Through a shared region the values go into the region's push part and
// the messages only say where.
TEST_F(PushMessagesTest, InSharedMemoryTheMessagesSayWhere) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> made =
      SharedRegion::Create(4 * 8, 4 * 8);
  if (!made.ok()) GTEST_SKIP() << made.status();
  std::shared_ptr<SharedRegion> region = *std::move(made);
  const std::vector<float> grads = Gradient(12);
  PushMessages m(work_, in_flight_, Options(4, v1::FLOAT32), Info(1),
                 /*commit=*/false, grads.data(), 4, 8, PushDone(), region);
  m.Queue(4, 12);
  const std::vector<v1::ExchangeRequest> msgs = Drain(m);
  ASSERT_EQ(msgs.size(), 2u);
  for (const v1::ExchangeRequest& r : msgs) {
    const v1::TensorChunk& c = r.chunk();
    EXPECT_TRUE(c.data().empty());
    EXPECT_EQ(c.shared_offset(), region->push_at() + 4 * (c.offset() - 4));
    std::vector<float> got(c.count());
    std::memcpy(got.data(), region->data() + c.shared_offset(),
                4 * c.count());
    EXPECT_EQ(got, std::vector<float>(grads.begin() + c.offset(),
                                      grads.begin() + c.offset() + c.count()));
  }
  EXPECT_TRUE(msgs.back().push_done());
}

TEST(MakePullRequestTest, SaysWhatTheOptionsSay) {
  ParamClientOptions o = Options(4, v1::BFLOAT16);
  o.pull_wait = absl::Milliseconds(1500);
  o.total_steps = 40;
  o.steps_per_epoch = 4;
  o.plan = 2;
  o.data_fingerprint = "fp";
  v1::StepCommit commit;
  commit.set_step(6);
  const v1::PullRequest req = MakePullRequest(o, 7, &commit, 8);
  EXPECT_EQ(req.job_id(), "job-1");
  EXPECT_EQ(req.worker_id(), "w");
  EXPECT_EQ(req.incarnation(), 3);
  EXPECT_EQ(req.map_version(), 2);
  EXPECT_EQ(req.min_version(), 7);
  EXPECT_EQ(req.max_wait_ms(), 1500);
  EXPECT_EQ(req.total_steps(), 40);
  EXPECT_EQ(req.steps_per_epoch(), 4);
  EXPECT_EQ(req.plan(), 2);
  EXPECT_EQ(req.data_fingerprint(), "fp");
  EXPECT_EQ(req.dtype(), v1::BFLOAT16);
  EXPECT_EQ(req.commit().step(), 6);
  EXPECT_EQ(req.clock(), 8);
  EXPECT_FALSE(MakePullRequest(o, 7, nullptr, -1).has_clock());
}

// A shard's answer for its range [offset, offset + count) of a vector of
// n: its weights in chunks of `chunk`, as the shard encodes them.
std::vector<grpc::ByteBuffer> Answer(const std::vector<float>& weights,
                                     int64_t offset, int64_t chunk,
                                     v1::DType dtype, int64_t version,
                                     const std::string& buffers) {
  const int64_t count = static_cast<int64_t>(weights.size());
  grpc::Slice values;
  if (dtype == v1::BFLOAT16) {
    auto encoded = std::make_shared<std::vector<uint16_t>>(count);
    FloatToBfloat16(weights.data(), reinterpret_cast<char*>(encoded->data()),
                    count);
    values = SnapshotSlice(
        std::shared_ptr<const std::vector<uint16_t>>(std::move(encoded)));
  } else {
    values = SnapshotSlice(std::make_shared<const std::vector<float>>(weights));
  }
  std::vector<grpc::ByteBuffer> out;
  for (int64_t at = 0; at < count; at += chunk) {
    out.emplace_back();
    EncodePullResponse(version, 100, offset + at,
                       std::min(chunk, count - at), dtype, values, at,
                       &out.back(), at == 0 ? buffers : std::string());
  }
  return out;
}

TEST(PullDecoderTest, AShardsAnswerLandsInItsRange) {
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    const std::vector<float> weights = Gradient(6);
    std::vector<float> params(12, 9.0f);
    auto buffers = std::make_shared<std::string>();
    PullDecoder d(params.data(), 12, 4, 6, buffers);
    EXPECT_EQ(d.contiguous(), 4);
    std::vector<int64_t> contiguous;
    for (const grpc::ByteBuffer& b :
         Answer(weights, 4, 4, dtype, 7, "running stats")) {
      WireMessage msg;
      TALLY_ASSERT_OK(msg.Parse(b, 3));
      EXPECT_FALSE(d.complete());
      TALLY_ASSERT_OK(d.Take(msg));
      contiguous.push_back(d.contiguous());
    }
    EXPECT_EQ(contiguous, (std::vector<int64_t>{8, 10}));
    EXPECT_TRUE(d.complete());
    EXPECT_EQ(d.version(), 7);
    TALLY_EXPECT_OK(d.Result());
    std::vector<float> want(12, 9.0f);
    std::copy(weights.begin(), weights.end(), want.begin() + 4);
    EXPECT_EQ(params, want);
    EXPECT_EQ(*buffers, "running stats");
  }
}

TEST(PullDecoderTest, RefusesWhatAShardDoesNotSend) {
  std::vector<float> params(12);
  WireMessage msg;
  {
    PullDecoder d(params.data(), 12, 4, 6, nullptr);
    // Inside the vector, outside the shard's range.
    const std::vector<grpc::ByteBuffer> wide =
        Answer(Gradient(8), 4, 8, v1::FLOAT32, 1, "");
    TALLY_ASSERT_OK(msg.Parse(wide[0], 3));
    EXPECT_THAT(d.Take(msg), StatusIs(absl::StatusCode::kDataLoss,
                                      HasSubstr("outside the shard's")));
  }
  {
    PullDecoder d(params.data(), 12, 4, 6, nullptr);
    const std::vector<grpc::ByteBuffer> v1s =
        Answer(Gradient(6), 4, 4, v1::FLOAT32, 1, "");
    const std::vector<grpc::ByteBuffer> v2s =
        Answer(Gradient(6), 4, 4, v1::FLOAT32, 2, "");
    TALLY_ASSERT_OK(msg.Parse(v1s[0], 3));
    TALLY_ASSERT_OK(d.Take(msg));
    EXPECT_THAT(d.Result(), StatusIs(absl::StatusCode::kDataLoss,
                                     HasSubstr("pulled 4 of the 6")));
    TALLY_ASSERT_OK(msg.Parse(v2s[1], 3));
    EXPECT_THAT(d.Take(msg), StatusIs(absl::StatusCode::kDataLoss,
                                      HasSubstr("version changed")));
  }
}

}  // namespace
}  // namespace internal
}  // namespace tally
