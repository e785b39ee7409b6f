// Cross-entropy loss computed on the replica's own device, so logits never
// travel; only two scalars (summed loss, correct count) come back.
//
// Not thread-safe: owned by the replica's driving thread.
#ifndef TALLY_COMMON_NN_LOSS_H_
#define TALLY_COMMON_NN_LOSS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/tensor.h"

namespace tally {

struct LossStats {
  double loss_sum = 0.0;  // sum over samples of -log softmax(label)
  int64_t correct = 0;    // samples whose argmax is the label
};

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Device* device) : device_(device) {}

  // logits: [batch, classes] on the device; labels: batch int32 on the
  // device. Writes dlogits = grad_scale * d(sum of losses)/dlogits into a
  // buffer owned here (see dlogits()). grad_scale = 1/batch gives PyTorch's
  // mean reduction. kInvalidArgument when a label is out of range.
  absl::StatusOr<LossStats> Compute(const Tensor& logits, const int32_t* labels,
                                    float grad_scale);
  // Statistics only, no gradient.
  absl::StatusOr<LossStats> Evaluate(const Tensor& logits,
                                     const int32_t* labels);

  const float* dlogits() const { return dlogits_.data(); }

 private:
  Device* device_;  // borrowed
  DeviceBuffer<float> dlogits_;
  DeviceBuffer<float> stats_;
};

}  // namespace tally

#endif  // TALLY_COMMON_NN_LOSS_H_
