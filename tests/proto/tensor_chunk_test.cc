// TensorChunk helpers: encode, check and decode in both wire dtypes.
#include "proto/tensor_chunk.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <memory>
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

// The hand-written PullResponse is the one protobuf writes, for both dtypes,
// at the vector's start and past it, for zero and large fields, so every
// protobuf client (the worker's, Python's) reads it.
TEST(TensorChunkTest, PullResponseBytesAreProtobufs) {
  auto values = std::make_shared<std::vector<float>>(300000);
  for (size_t i = 0; i < values->size(); ++i)
    (*values)[i] = static_cast<float>(i) * 0.37f - 1000.0f;
  auto encoded = std::make_shared<std::vector<uint16_t>>(values->size());
  FloatToBfloat16(values->data(), reinterpret_cast<char*>(encoded->data()),
                  static_cast<int64_t>(values->size()));
  const grpc::Slice whole = SnapshotSlice(values);
  const grpc::Slice whole_bf16 = SnapshotSlice(
      std::shared_ptr<const std::vector<uint16_t>>(encoded));
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
      grpc::ByteBuffer got;
      EncodePullResponse(c.version, c.total, c.offset, c.count, dtype,
                         dtype == v1::BFLOAT16 ? whole_bf16 : whole, c.first,
                         &got);
      const std::string bytes = Bytes(got);
      EXPECT_EQ(bytes, want.SerializeAsString());
      v1::PullResponse back;
      ASSERT_TRUE(back.ParseFromString(bytes));
      EXPECT_EQ(back.chunk().count(), c.count);
    }
  }
}

}  // namespace
}  // namespace tally
