#include "common/nn/loss.h"

#include "absl/strings/str_cat.h"
#include "common/kernels.h"
#include "common/status_macros.h"

namespace tally {

namespace {
absl::Status CheckLogits(const Tensor& logits) {
  if (logits.rank() != 2 || logits.dim(0) <= 0 || logits.dim(1) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross-entropy needs logits [batch, classes], got ",
                     ShapeString(logits.shape)));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<LossStats> CrossEntropyLoss::Compute(const Tensor& logits,
                                                    const int32_t* labels,
                                                    float grad_scale) {
  TALLY_RETURN_IF_ERROR(CheckLogits(logits));
  if (dlogits_.size() < static_cast<size_t>(logits.numel())) {
    dlogits_.Reset();
    TALLY_ASSIGN_OR_RETURN(
        dlogits_, DeviceBuffer<float>::Create(device_, logits.numel()));
  }
  if (stats_.data() == nullptr) {
    TALLY_ASSIGN_OR_RETURN(stats_, DeviceBuffer<float>::Create(device_, 2));
  }
  device_->kernels().SoftmaxCrossEntropy(
      logits.data, labels, static_cast<int>(logits.dim(0)),
      static_cast<int>(logits.dim(1)), grad_scale, dlogits_.data(),
      stats_.data());
  float host[2];
  TALLY_RETURN_IF_ERROR(device_->CopyToHost(host, stats_.data(), sizeof(host)));
  return LossStats{host[0], static_cast<int64_t>(host[1])};
}

absl::StatusOr<LossStats> CrossEntropyLoss::Evaluate(const Tensor& logits,
                                                     const int32_t* labels) {
  TALLY_RETURN_IF_ERROR(CheckLogits(logits));
  if (stats_.data() == nullptr) {
    TALLY_ASSIGN_OR_RETURN(stats_, DeviceBuffer<float>::Create(device_, 2));
  }
  device_->kernels().SoftmaxCrossEntropyStats(
      logits.data, labels, static_cast<int>(logits.dim(0)),
      static_cast<int>(logits.dim(1)), stats_.data());
  float host[2];
  TALLY_RETURN_IF_ERROR(device_->CopyToHost(host, stats_.data(), sizeof(host)));
  return LossStats{host[0], static_cast<int64_t>(host[1])};
}

}  // namespace tally
