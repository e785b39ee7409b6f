// The compute primitives every device backend provides.
//
// All pointers are device memory of the Device that owns this Kernels. Arrays
// are row-major, NCHW for images. Calls are enqueued in order on the device's
// stream; they return nothing, and errors surface from Device::Synchronize().
// Not thread-safe: one driving thread per device.
#ifndef TALLY_COMMON_KERNELS_H_
#define TALLY_COMMON_KERNELS_H_

#include <cstdint>

// Geometry helpers are also called from CUDA kernels.
#if defined(__CUDACC__)
#define TALLY_HOST_DEVICE __host__ __device__
#else
#define TALLY_HOST_DEVICE
#endif

namespace tally {

struct Conv2dGeometry {
  int batch = 0;
  int in_channels = 0, in_h = 0, in_w = 0;
  int out_channels = 0, kernel = 0, stride = 1, padding = 0;
  TALLY_HOST_DEVICE int out_h() const {
    return (in_h + 2 * padding - kernel) / stride + 1;
  }
  TALLY_HOST_DEVICE int out_w() const {
    return (in_w + 2 * padding - kernel) / stride + 1;
  }
};

struct Pool2dGeometry {
  int batch = 0, channels = 0, in_h = 0, in_w = 0;
  int kernel = 2, stride = 2, padding = 0;
  TALLY_HOST_DEVICE int out_h() const {
    return (in_h + 2 * padding - kernel) / stride + 1;
  }
  TALLY_HOST_DEVICE int out_w() const {
    return (in_w + 2 * padding - kernel) / stride + 1;
  }
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // C[m,n] = alpha * op(A) * op(B) + beta * C, row-major, op = transpose
  // when the flag is set.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) = 0;

  virtual void Fill(float* x, int64_t n, float value) = 0;
  virtual void Copy(const float* src, float* dst, int64_t n) = 0;
  // y += alpha * x
  virtual void Axpy(int64_t n, float alpha, const float* x, float* y) = 0;
  // x *= alpha
  virtual void Scale(int64_t n, float alpha, float* x) = 0;

  // y[r, c] = bias[c] for every row (a GEMM with beta = 1 then adds on top).
  virtual void BroadcastRows(const float* bias, int rows, int cols,
                             float* y) = 0;
  // db[c] = sum over r of dy[r, c].
  virtual void SumRows(const float* dy, int rows, int cols, float* db) = 0;

  // x and y may be the same buffer.
  virtual void ReluForward(const float* x, float* y, int64_t n) = 0;
  // dx = dy where y > 0, else 0.
  virtual void ReluBackward(const float* y, const float* dy, float* dx,
                            int64_t n) = 0;

  // y = x * mask, mask[i] = 0 with probability p else 1/(1-p), drawn with
  // HashUniform(seed, index_offset + i) so every backend, and every split of
  // a batch across devices, draws the same mask for the same element.
  virtual void DropoutForward(const float* x, float* y, float* mask, int64_t n,
                              float p, uint64_t seed, int64_t index_offset) = 0;
  // Elementwise dx = dy * mask.
  virtual void Multiply(const float* a, const float* b, float* out,
                        int64_t n) = 0;

  // y = conv(x, w) + b. x: [N, Cin, H, W], w: [Cout, Cin, K, K], b: [Cout]
  // (may be null), y: [N, Cout, OH, OW].
  virtual void Conv2dForward(const Conv2dGeometry& g, const float* x,
                             const float* w, const float* b, float* y) = 0;
  // Writes dw and db (db may be null); writes dx when it is not null.
  virtual void Conv2dBackward(const Conv2dGeometry& g, const float* x,
                              const float* w, const float* dy, float* dw,
                              float* db, float* dx) = 0;

  // Max pooling; argmax[i] is the flat input index (within one image plane)
  // of the maximum that produced output i.
  virtual void MaxPool2dForward(const Pool2dGeometry& g, const float* x,
                                float* y, int32_t* argmax) = 0;
  virtual void MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                                 const int32_t* argmax, float* dx) = 0;

  // Softmax cross-entropy over logits [batch, classes]. Writes
  // dlogits = grad_scale * (softmax - onehot(label)) and stats[0] = sum of
  // per-sample losses, stats[1] = number of rows whose argmax is the label.
  virtual void SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                                   int batch, int classes, float grad_scale,
                                   float* dlogits, float* stats) = 0;
  // Same statistics without gradients (evaluation).
  virtual void SoftmaxCrossEntropyStats(const float* logits,
                                        const int32_t* labels, int batch,
                                        int classes, float* stats) = 0;
};

}  // namespace tally

#endif  // TALLY_COMMON_KERNELS_H_
