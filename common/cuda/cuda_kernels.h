// Launchers of Tally's CUDA kernels, behind a plain C++ header so that code
// compiled without nvcc can call them. Every launcher enqueues on `stream`
// and returns at once; launch errors surface from cudaGetLastError at the
// device's next synchronisation. Pointers are device memory.
#ifndef TALLY_COMMON_CUDA_CUDA_KERNELS_H_
#define TALLY_COMMON_CUDA_CUDA_KERNELS_H_

#include <cstdint>

#include "common/kernels.h"

struct CUstream_st;

namespace tally::cuda {

using Stream = CUstream_st*;  // = cudaStream_t

void Fill(float* x, int64_t n, float value, Stream s);
void Axpy(int64_t n, float alpha, const float* x, float* y, Stream s);
void Scale(int64_t n, float alpha, float* x, Stream s);
void BroadcastRows(const float* bias, int rows, int cols, float* y, Stream s);
void SumRows(const float* dy, int rows, int cols, float* db, Stream s);
void ReluForward(const float* x, float* y, int64_t n, Stream s);
void ReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                  Stream s);
void DropoutForward(const float* x, float* y, float* mask, int64_t n, float p,
                    uint64_t seed, int64_t index_offset, Stream s);
void Multiply(const float* a, const float* b, float* out, int64_t n, Stream s);

// col: [batch][in_channels * k * k][out_h * out_w]
void Im2ColBatch(const Conv2dGeometry& g, const float* x, float* col, Stream s);
// Overwrites x ([batch][c][h][w]) with the sum of the columns that read it.
void Col2ImBatch(const Conv2dGeometry& g, const float* col, float* x, Stream s);
// y[n][c][p] += b[c]
void AddChannelBias(const float* b, int batch, int channels, int plane,
                    float* y, Stream s);
// db[c] = sum over n, p of dy[n][c][p]
void ChannelSum(const float* dy, int batch, int channels, int plane, float* db,
                Stream s);

void MaxPoolForward(const Pool2dGeometry& g, const float* x, float* y,
                    int32_t* argmax, Stream s);
void MaxPoolBackward(const Pool2dGeometry& g, const float* dy,
                     const int32_t* argmax, float* dx, Stream s);

// Softmax cross-entropy; dlogits may be null (statistics only). stats[0] =
// summed loss, stats[1] = correct count. A label outside [0, classes) sets
// *error_flag to 1.
void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int batch,
                         int classes, float grad_scale, float* dlogits,
                         float* stats, int* error_flag, Stream s);

}  // namespace tally::cuda

#endif  // TALLY_COMMON_CUDA_CUDA_KERNELS_H_
