// CPU implementation of Kernels (OpenBLAS for GEMM, plain loops the compiler
// vectorises for the rest). Internal to common/: callers reach it through
// OpenDevice() and Device::kernels().
#ifndef TALLY_COMMON_INTERNAL_CPU_KERNELS_H_
#define TALLY_COMMON_INTERNAL_CPU_KERNELS_H_

#include <vector>

#include "absl/status/status.h"
#include "common/kernels.h"

namespace tally::internal {

class CpuKernels final : public Kernels {
 public:
  // `error` (borrowed) receives the first failure, which the owning device
  // reports from Synchronize().
  explicit CpuKernels(absl::Status* error) : error_(error) {}

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, int lda, const float* b, int ldb, float beta,
            float* c, int ldc) override;
  void Fill(float* x, int64_t n, float value) override;
  void Copy(const float* src, float* dst, int64_t n) override;
  void Axpy(int64_t n, float alpha, const float* x, float* y) override;
  void Scale(int64_t n, float alpha, float* x) override;
  void BroadcastRows(const float* bias, int rows, int cols, float* y) override;
  void SumRows(const float* dy, int rows, int cols, float* db) override;
  void ReluForward(const float* x, float* y, int64_t n) override;
  void ReluBackward(const float* y, const float* dy, float* dx,
                    int64_t n) override;
  void DropoutForward(const float* x, float* y, float* mask, int64_t n, float p,
                      uint64_t seed, int64_t index_offset) override;
  void Multiply(const float* a, const float* b, float* out, int64_t n) override;
  void Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                     const float* b, float* y) override;
  void Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                      const float* dy, float* dw, float* db,
                      float* dx) override;
  void MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                        int32_t* argmax) override;
  void MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                         const int32_t* argmax, float* dx) override;
  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                           int batch, int classes, float grad_scale,
                           float* dlogits, float* stats) override;
  void SoftmaxCrossEntropyStats(const float* logits, const int32_t* labels,
                                int batch, int classes, float* stats) override;

 private:
  void Fail(absl::Status s) {
    if (error_->ok()) *error_ = std::move(s);
  }
  float* Scratch(size_t n) {
    if (scratch_.size() < n) scratch_.resize(n);
    return scratch_.data();
  }

  absl::Status* error_;  // borrowed from the device
  std::vector<float> scratch_;
};

// im2col for one image: col[(c*K + ki)*K + kj][oh*OW + ow].
void Im2Col(const Conv2dGeometry& g, const float* x, float* col);
// Adds columns back into one image (which the caller zeroed).
void Col2Im(const Conv2dGeometry& g, const float* col, float* x);

}  // namespace tally::internal

#endif  // TALLY_COMMON_INTERNAL_CPU_KERNELS_H_
