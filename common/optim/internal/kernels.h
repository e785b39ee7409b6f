// The element loops of the update rules that dense and row optimizers
// share (optimizer.cc, row_optimizer.cc), so that each rule is written
// once and rounds the same in both. Compiled with -ffp-contract=off.
#ifndef TALLY_COMMON_OPTIM_INTERNAL_KERNELS_H_
#define TALLY_COMMON_OPTIM_INTERNAL_KERNELS_H_

#include <cstdint>

namespace tally::optim_internal {

// torch.optim.SGD without momentum on n values: d = g + wd * p, then
// p += -lr * d, each one fused multiply-add rounding once (optimizer.cc
// says why).
void SgdPlain(int64_t n, float lr, float wd, float* __restrict p,
              const float* __restrict g);

}  // namespace tally::optim_internal

#endif  // TALLY_COMMON_OPTIM_INTERNAL_KERNELS_H_
