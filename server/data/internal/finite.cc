#include "server/data/internal/finite.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/bfloat16.h"
#include "common/vectorize.h"

namespace tally::internal {

namespace {

// The largest exponent field in x[0, n): 0x7f800000 exactly when some value
// is an infinity or a NaN. No early exit, so it vectorises.
TALLY_VECTORIZE uint32_t MaxExponent(const float* __restrict x, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    top = std::max(top, bits & 0x7f800000u);
  }
  return top;
}

// Block by block: decode (or copy) a block, then check it while it is in
// cache.
template <typename Decode>
int64_t DecodeAndFind(float* dst, const char* src, int64_t n, int bytes_each,
                      Decode decode) {
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    decode(src + bytes_each * b, dst + b, m);
    if (MaxExponent(dst + b, m) != 0x7f800000u) continue;
    for (int64_t i = b; i < b + m; ++i) {
      if (!std::isfinite(dst[i])) return i;
    }
  }
  return -1;
}

}  // namespace

int64_t CopyAndFindNonFinite(float* dst, const char* src, int64_t n) {
  return DecodeAndFind(dst, src, n, 4, [](const char* s, float* d, int64_t m) {
    std::memcpy(d, s, 4 * m);
  });
}

int64_t DecodeBfloat16AndFindNonFinite(float* dst, const char* src, int64_t n) {
  return DecodeAndFind(dst, src, n, 2, &Bfloat16ToFloat);
}

}  // namespace tally::internal
