// TensorChunk helpers: encode, check and decode in both wire dtypes.
#include "proto/tensor_chunk.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/bfloat16.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TensorChunkTest, RoundTripsInBothDtypes) {
  const std::vector<float> values = {1.0f, -2.5f, 0.375f};
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    v1::TensorChunk c;
    EncodeChunk(values.data(), 2, 3, dtype, &c);
    EXPECT_EQ(c.data().size(), (dtype == v1::FLOAT32 ? 4u : 2u) * 3);
    TALLY_ASSERT_OK(CheckChunk(c, 5));
    std::vector<float> vec(5, 9.0f);
    DecodeChunk(c, vec.data());
    // These values are exact in bfloat16 too.
    EXPECT_EQ(vec, (std::vector<float>{9, 9, 1.0f, -2.5f, 0.375f}));
  }
}

TEST(TensorChunkTest, CheckSaysWhatIsWrong) {
  const std::vector<float> values(4, 1.0f);
  v1::TensorChunk c;
  EncodeChunk(values.data(), 2, 4, v1::FLOAT32, &c);
  EXPECT_THAT(CheckChunk(c, 5), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("outside the 5-element")));
  EncodeChunk(values.data(), 0, 4, v1::BFLOAT16, &c);
  c.mutable_data()->push_back('x');
  EXPECT_THAT(CheckChunk(c, 5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4 BFLOAT16 elements but carries 9 bytes")));
  c.set_dtype(static_cast<v1::DType>(3));
  EXPECT_THAT(CheckChunk(c, 5), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("unknown tensor dtype 3")));
  v1::TensorChunk empty;
  TALLY_EXPECT_OK(CheckChunk(empty, 0));  // a model with no parameters
  EXPECT_THAT(CheckChunk(empty, 5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("+0")));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

std::string Bytes(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// n values a * i + b, and slices over them in float32 and in bfloat16.
struct TestValues {
  std::shared_ptr<std::vector<float>> values;
  grpc::Slice f32, bf16;
};
TestValues MakeValues(size_t n, float a, float b) {
  TestValues t;
  t.values = std::make_shared<std::vector<float>>(n);
  for (size_t i = 0; i < n; ++i)
    (*t.values)[i] = static_cast<float>(i) * a + b;
  auto encoded = std::make_shared<std::vector<uint16_t>>(n);
  FloatToBfloat16(t.values->data(), reinterpret_cast<char*>(encoded->data()),
                  static_cast<int64_t>(n));
  t.f32 = SnapshotSlice(t.values);
  t.bf16 = SnapshotSlice(std::shared_ptr<const std::vector<uint16_t>>(encoded));
  return t;
}

// The hand-written PullResponse is the one protobuf writes, for both dtypes,
// at the vector's start and past it, for zero and large fields, so every
// protobuf client (the worker's, Python's) reads it.
TEST(TensorChunkTest, PullResponseBytesAreProtobufs) {
  const TestValues t = MakeValues(300000, 0.37f, -1000.0f);
  const std::shared_ptr<std::vector<float>>& values = t.values;
  const grpc::Slice& whole = t.f32;
  const grpc::Slice& whole_bf16 = t.bf16;
  struct Case {
    int64_t version, total, offset, count, first;
  };
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    for (const Case& c : {Case{0, 0, 0, 1, 0}, Case{1, 938, 0, 262144, 0},
                          Case{5, 938, 262144, 37856, 262144},
                          Case{int64_t{1} << 40, int64_t{1} << 41,
                               int64_t{3} << 33, 127, 299873},
                          Case{127, 128, 128, 128, 5}}) {
      SCOPED_TRACE(::testing::Message()
                   << "dtype " << dtype << " version " << c.version
                   << " offset " << c.offset << " count " << c.count);
      v1::PullResponse want;
      want.set_version(c.version);
      want.set_total_steps(c.total);
      EncodeChunk(values->data() + c.first, c.offset, c.count, dtype,
                  want.mutable_chunk());
      // With a buffer region (a Python model's first message), too.
      for (const std::string buffers : {std::string(), std::string("\0\1bn", 4)}) {
        want.set_buffers(buffers);
        grpc::ByteBuffer got;
        EncodePullResponse(c.version, c.total, c.offset, c.count, dtype,
                           dtype == v1::BFLOAT16 ? whole_bf16 : whole, c.first,
                           &got, buffers);
        const std::string bytes = Bytes(got);
        EXPECT_EQ(bytes, want.SerializeAsString());
        v1::PullResponse back;
        ASSERT_TRUE(back.ParseFromString(bytes));
        EXPECT_EQ(back.chunk().count(), c.count);
        EXPECT_EQ(back.buffers(), buffers);
      }
    }
  }
}


// `bytes` as a ByteBuffer of slices cut at random points (gRPC hands a
// received message over in pieces of any size, empty ones included).
grpc::ByteBuffer Sliced(const std::string& bytes, std::mt19937* rng) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - at, (*rng)() % 9);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  if (slices.empty()) slices.emplace_back("", 0);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The chunk's data as WireMessage hands it out, reassembled.
std::string WireData(const WireMessage& m, int width) {
  std::string out(m.chunk().data_size, '\0');
  int64_t next = 0;
  m.ForEachValues(width, [&](const char* src, int64_t n, int64_t first) {
    EXPECT_EQ(first, next);  // in order, no gaps
    std::memcpy(&out[first * width], src, n * width);
    next = first + n;
  });
  EXPECT_EQ(next * width, m.chunk().data_size);
  return out;
}

std::string Varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}

// Random PushRequests and PullResponses, as protobuf writes them and then
// with what other encoders may write (fields reordered or repeated, unknown
// fields of every wire type), cut into random slices: WireMessage reads
// what the generated parser reads, and the values come out whole.
TEST(WireMessageTest, ReadsWhatProtobufReads) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    SCOPED_TRACE(iter);
    const v1::DType dtype = iter % 2 ? v1::BFLOAT16 : v1::FLOAT32;
    const int width = dtype == v1::BFLOAT16 ? 2 : 4;
    const int64_t count = rng() % 40;
    std::string data(count * width, '\0');
    for (char& ch : data) ch = static_cast<char>(rng());
    v1::TensorChunk chunk;
    chunk.set_offset(rng() % 3 == 0 ? 0 : (int64_t{1} << (rng() % 40)) + 3);
    chunk.set_count(count);
    chunk.set_data(data);
    chunk.set_dtype(dtype);
    std::string chunk_bytes = chunk.SerializeAsString();
    if (iter % 3 == 1) {
      // Unknown fields of each wire type, and a dtype before data that the
      // later one overrides.
      chunk_bytes = Varint((9 << 3) | 0) + Varint(rng()) +
                    Varint((10 << 3) | 1) + std::string(8, 'x') +
                    Varint((4 << 3) | 0) + Varint(7) + chunk_bytes +
                    Varint((11 << 3) | 5) + std::string(4, 'y') +
                    Varint((200 << 3) | 2) + Varint(3) + "abc";
    }
    const bool push = iter % 4 < 2;
    std::string bytes;
    if (push) {
      v1::PushRequest req;
      req.mutable_header()->set_job_id("job-" + std::to_string(iter));
      req.mutable_header()->set_step(iter);
      req.mutable_header()->set_loss_sum(0.25 * iter);
      bytes = req.SerializeAsString();
      if (iter % 5 == 0) {
        // A second header merges into the first.
        v1::PushRequest more;
        more.mutable_header()->set_samples(64);
        bytes += more.SerializeAsString();
      }
      bytes += Varint((2 << 3) | 2) + Varint(chunk_bytes.size()) + chunk_bytes;
    } else {
      v1::PullResponse resp;
      resp.set_version(iter % 7 == 0 ? -1 : iter);
      resp.set_total_steps(1000);
      bytes = Varint((3 << 3) | 2) + Varint(chunk_bytes.size()) + chunk_bytes +
              resp.SerializeAsString();
    }
    WireMessage m;
    TALLY_ASSERT_OK(m.Parse(Sliced(bytes, &rng), push ? 2 : 3));
    v1::TensorChunk want_chunk;
    if (push) {
      v1::PushRequest want;
      ASSERT_TRUE(want.ParseFromString(bytes));
      v1::PushHeader got;
      ASSERT_TRUE(m.has(1));
      ASSERT_TRUE(got.ParseFromString(m.bytes(1)));
      EXPECT_EQ(got.SerializeAsString(), want.header().SerializeAsString());
      want_chunk = want.chunk();
    } else {
      v1::PullResponse want;
      ASSERT_TRUE(want.ParseFromString(bytes));
      EXPECT_EQ(m.varint(1), want.version());
      EXPECT_EQ(m.varint(2), want.total_steps());
      want_chunk = want.chunk();
    }
    EXPECT_EQ(m.chunk().offset, want_chunk.offset());
    EXPECT_EQ(m.chunk().count, want_chunk.count());
    EXPECT_EQ(m.chunk().dtype, want_chunk.dtype());
    EXPECT_EQ(m.chunk().count, count);
    EXPECT_EQ(WireData(m, width), want_chunk.data());
    EXPECT_EQ(want_chunk.data(), data);
  }
}

TEST(WireMessageTest, MalformedBytesAreInvalidArgument) {
  std::mt19937 rng(3);
  v1::PushRequest req;
  req.mutable_header()->set_job_id("j");
  EncodeChunk(std::vector<float>(8, 1.0f).data(), 0, 8, v1::FLOAT32,
              req.mutable_chunk());
  const std::string good = req.SerializeAsString();
  WireMessage m;
  TALLY_ASSERT_OK(m.Parse(Sliced(good, &rng), 2));
  for (size_t cut = 1; cut < good.size(); ++cut) {
    v1::PushRequest pb;
    if (pb.ParseFromString(good.substr(0, cut))) continue;  // still a message
    EXPECT_THAT(m.Parse(Sliced(good.substr(0, cut), &rng), 2),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("malformed protobuf message")))
        << "cut at " << cut;
  }
  EXPECT_THAT(m.Parse(Sliced(std::string(11, '\xff'), &rng), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag")));
  EXPECT_THAT(m.Parse(Sliced(Varint((5 << 3) | 3), &rng), 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad group")));  // no end
  EXPECT_THAT(m.Parse(Sliced(Varint((5 << 3) | 6), &rng), 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wire type")));
  // Tags as protobuf reads them: five bytes at most, kept to 32 bits (so
  // this one is field 2, the chunk); a varint where the header should be
  // is an unknown field, not a header.
  EncodeChunk(std::vector<float>(3, 2.0f).data(), 0, 3, v1::FLOAT32,
              req.mutable_chunk());
  const std::string chunk_bytes = req.chunk().SerializeAsString();
  const std::string long_tag =
      Varint(((2 << 3) | 2) | (uint64_t{1} << 32)) +
      Varint(chunk_bytes.size()) + chunk_bytes + Varint((1 << 3) | 0) +
      Varint(5);
  v1::PushRequest pb;
  ASSERT_TRUE(pb.ParseFromString(long_tag));
  TALLY_ASSERT_OK(m.Parse(Sliced(long_tag, &rng), 2));
  EXPECT_EQ(m.has(2), pb.has_chunk());
  EXPECT_EQ(m.has(1), pb.has_header());
  EXPECT_EQ(m.chunk().count, 3);
  EXPECT_FALSE(m.has(1));
  const std::string six_byte_tag = Varint(((2 << 3) | 2) | (uint64_t{1} << 35));
  EXPECT_FALSE(pb.ParseFromString(six_byte_tag + Varint(0)));
  EXPECT_THAT(m.Parse(Sliced(six_byte_tag + Varint(0), &rng), 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag")));
  // A group, which protobuf skips as an unknown field, is skipped too.
  const std::string group = Varint((6 << 3) | 3) + Varint((1 << 3) | 0) +
                            Varint(5) + Varint((6 << 3) | 4);
  TALLY_ASSERT_OK(m.Parse(Sliced(group + good, &rng), 2));
  EXPECT_EQ(m.chunk().count, 8);
  EXPECT_THAT(m.Parse(Sliced(std::string("\x00\x01", 2), &rng), 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field 0")));
}

// What the worker sends: byte for byte what protobuf writes, header or
// not, chunk or not, at slice edges, in both dtypes.
TEST(TensorChunkTest, PushRequestBytesAreProtobufs) {
  const TestValues t = MakeValues(70000, -0.11f, 3.0f);
  const std::shared_ptr<std::vector<float>>& values = t.values;
  const grpc::Slice& whole = t.f32;
  const grpc::Slice& whole_bf16 = t.bf16;
  v1::PushHeader header;
  header.set_job_id("job-1");
  header.set_worker_id("w7");
  header.set_incarnation(3);
  header.set_step(int64_t{1} << 35);
  header.set_base_version(41);
  header.set_samples(64);
  header.set_loss_sum(12.5);
  header.set_correct(-1);
  for (v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16}) {
    for (bool with_header : {true, false}) {
      for (int64_t count : {0, 1, 262144 / 4, 69999}) {
        for (int64_t first : {int64_t{0}, int64_t{1}}) {
          if (count + first > 70000) continue;
          SCOPED_TRACE(::testing::Message() << "dtype " << dtype << " count "
                                            << count << " first " << first);
          v1::PushRequest want;
          if (with_header) *want.mutable_header() = header;
          if (count > 0) {
            EncodeChunk(values->data() + first, 1000 + first, count, dtype,
                        want.mutable_chunk());
          }
          grpc::ByteBuffer got;
          EncodePushRequest(with_header ? &header : nullptr, 1000 + first,
                            count, dtype,
                            dtype == v1::BFLOAT16 ? whole_bf16 : whole, first,
                            &got);
          EXPECT_EQ(Bytes(got), want.SerializeAsString());
        }
      }
    }
  }
}

}  // namespace
}  // namespace tally
