#include "common/bfloat16.h"

#include <cstring>

#include "common/vectorize.h"

namespace tally {

TALLY_VECTORIZE void FloatToBfloat16(const float* __restrict src,
                                     char* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, 4);
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    // Round to nearest even on the 16 bits dropped; a NaN is kept quiet (its
    // payload could round to an infinity otherwise).
    const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
    const uint16_t out = nan ? static_cast<uint16_t>((bits >> 16) | 0x0040u)
                             : static_cast<uint16_t>(rounded >> 16);
    std::memcpy(dst + 2 * i, &out, 2);
  }
}

TALLY_VECTORIZE void Bfloat16ToFloat(const char* __restrict src,
                                     float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

}  // namespace tally
