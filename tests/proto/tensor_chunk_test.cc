// TensorChunk helpers: encode, check and decode in both wire dtypes.
#include "proto/tensor_chunk.h"

#include <vector>

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
