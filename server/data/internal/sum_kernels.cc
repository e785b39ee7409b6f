#include "server/data/internal/sum_kernels.h"

#include <cstring>

#include "common/vectorize.h"

namespace tally::internal {

TALLY_VECTORIZE void AddScaled(float* __restrict sum, const float* __restrict g,
                               float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sum[i] += w * g[i];
}

TALLY_VECTORIZE void Scale(float* __restrict x, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = w * x[i];
}

TALLY_VECTORIZE void PutScaled(float* __restrict x, const float* __restrict g,
                               float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = w * g[i];
}

TALLY_VECTORIZE bool ScaleFinite(float* __restrict x, float inv, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = x[i] * inv;
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace tally::internal
