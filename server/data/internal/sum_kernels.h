// The loops that sum a step's gradients (dense and rows) in rank order and
// scale the sum into its mean. Compiled without fused multiply-adds
// (-ffp-contract=off): every shard layout and every vector width rounds
// each element the same.
#ifndef TALLY_SERVER_DATA_INTERNAL_SUM_KERNELS_H_
#define TALLY_SERVER_DATA_INTERNAL_SUM_KERNELS_H_

#include <cstdint>

namespace tally::internal {

// sum += w * g
void AddScaled(float* __restrict sum, const float* __restrict g, float w,
               int64_t n);
// x = w * x
void Scale(float* __restrict x, float w, int64_t n);
// x = w * g: Scale's products, from another buffer.
void PutScaled(float* __restrict x, const float* __restrict g, float w,
               int64_t n);
// x *= inv; false when a value of x is then infinite or NaN (a sum of
// finite gradients can still overflow).
bool ScaleFinite(float* __restrict x, float inv, int64_t n);

}  // namespace tally::internal

#endif  // TALLY_SERVER_DATA_INTERNAL_SUM_KERNELS_H_
