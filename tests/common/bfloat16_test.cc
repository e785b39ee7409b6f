// float32 <-> bfloat16: rounding, special values, round trips.
#include "common/bfloat16.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/random.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

float RoundTrip(float x) {
  char buf[2];
  FloatToBfloat16(&x, buf, 1);
  float y;
  Bfloat16ToFloat(buf, &y, 1);
  return y;
}

TEST(Bfloat16Test, RoundsToNearestWithTiesToEven) {
  EXPECT_EQ(RoundTrip(1.0f), 1.0f);
  EXPECT_EQ(RoundTrip(-2.5f), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even, 1.
  EXPECT_EQ(RoundTrip(FromBits(0x3f808000u)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to the even one.
  EXPECT_EQ(RoundTrip(FromBits(0x3f818000u)), FromBits(0x3f820000u));
  // Just above halfway rounds up.
  EXPECT_EQ(RoundTrip(FromBits(0x3f808001u)), FromBits(0x3f810000u));
  // The largest float rounds to infinity, as in PyTorch.
  EXPECT_TRUE(std::isinf(RoundTrip(std::numeric_limits<float>::max())));
}

TEST(Bfloat16Test, SpecialValuesSurvive) {
  EXPECT_TRUE(std::isnan(RoundTrip(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload sits only in the dropped bits is still a NaN.
  EXPECT_TRUE(std::isnan(RoundTrip(FromBits(0x7f800001u))));
  EXPECT_EQ(RoundTrip(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(RoundTrip(-std::numeric_limits<float>::infinity()),
            -std::numeric_limits<float>::infinity());
  EXPECT_EQ(RoundTrip(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(RoundTrip(-0.0f)));
}

TEST(Bfloat16Test, ManyValuesKeepEightBitsOfPrecisionAtAnyAlignment) {
  Rng rng(5);
  const int n = 10001;
  std::vector<float> x(n);
  for (float& v : x) v = rng.Normal() * 3.0f;
  std::vector<char> bytes(2 * n + 1);
  FloatToBfloat16(x.data(), bytes.data() + 1, n);  // unaligned on purpose
  std::vector<float> y(n);
  Bfloat16ToFloat(bytes.data() + 1, y.data(), n);
  for (int i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) * (1.0f / 256)) << i;
    ASSERT_EQ(y[i], RoundTrip(x[i])) << i;  // the same as one at a time
  }
}

}  // namespace
}  // namespace tally
