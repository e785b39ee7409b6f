// Copying a pushed chunk while finding its first infinity or NaN.
#include "server/data/internal/finite.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/bfloat16.h"
#include "gtest/gtest.h"

namespace tally::internal {
namespace {

std::vector<float> Ramp(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.001f * static_cast<float>(i - n / 2);
  return v;
}

TEST(CopyAndFindNonFiniteTest, FiniteDataIsCopiedWhole) {
  for (int64_t n : {1, 7, 4095, 4096, 4097, 20000}) {
    std::vector<float> src = Ramp(n);
    src[0] = std::numeric_limits<float>::max();
    src[n - 1] = std::numeric_limits<float>::denorm_min();
    // An unaligned source, as a protobuf string may be.
    std::vector<char> bytes(4 * n + 1);
    std::memcpy(bytes.data() + 1, src.data(), 4 * n);
    std::vector<float> dst(n, -1.0f);
    EXPECT_EQ(CopyAndFindNonFinite(dst.data(), bytes.data() + 1, n), -1) << n;
    EXPECT_EQ(dst, src) << n;
  }
}

TEST(CopyAndFindNonFiniteTest, FindsTheFirstBadValueInAnyBlock) {
  const float kBad[] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  const int64_t n = 10000;
  for (float bad : kBad) {
    for (int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, n - 1}) {
      std::vector<float> src = Ramp(n);
      src[at] = bad;
      if (at + 10 < n) src[at + 10] = bad;  // a later one is not reported
      std::vector<float> dst(n);
      EXPECT_EQ(CopyAndFindNonFinite(
                    dst.data(), reinterpret_cast<const char*>(src.data()), n),
                at)
          << "bad value " << bad << " at " << at;
    }
  }
}

TEST(DecodeBfloat16AndFindNonFiniteTest, WidensAndFindsTheFirstBadValue) {
  const int64_t n = 9000;
  std::vector<float> src = Ramp(n);
  src[5000] = std::numeric_limits<float>::infinity();
  std::vector<char> bytes(2 * n);
  FloatToBfloat16(src.data(), bytes.data(), n);
  std::vector<float> dst(n);
  EXPECT_EQ(DecodeBfloat16AndFindNonFinite(dst.data(), bytes.data(), n), 5000);
  src[5000] = 1.0f;
  FloatToBfloat16(src.data(), bytes.data(), n);
  EXPECT_EQ(DecodeBfloat16AndFindNonFinite(dst.data(), bytes.data(), n), -1);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(dst[i], src[i], std::fabs(src[i]) / 256 + 1e-30) << i;
  }
}

}  // namespace
}  // namespace tally::internal
