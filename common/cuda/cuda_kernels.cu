#include <cuda_runtime.h>

#include <cfloat>

#include "common/cuda/cuda_kernels.h"

namespace tally::cuda {

namespace {

constexpr int kThreads = 256;

inline int Blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

#define TALLY_GRID_LOOP(i, n)                                           \
  for (int64_t i =                                                      \
           blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// The same SplitMix64 hash as common/random.cc, so CPU and GPU draw the
// same dropout masks.
__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float HashUniform(uint64_t seed, uint64_t index) {
  const uint64_t h = Mix(seed ^ Mix(index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

__global__ void FillKernel(float* x, int64_t n, float v) {
  TALLY_GRID_LOOP(i, n) x[i] = v;
}
__global__ void AxpyKernel(int64_t n, float a, const float* x, float* y) {
  TALLY_GRID_LOOP(i, n) y[i] += a * x[i];
}
__global__ void ScaleKernel(int64_t n, float a, float* x) {
  TALLY_GRID_LOOP(i, n) x[i] *= a;
}
__global__ void BroadcastRowsKernel(const float* b, int rows, int cols,
                                    float* y) {
  TALLY_GRID_LOOP(i, static_cast<int64_t>(rows) * cols) y[i] = b[i % cols];
}
__global__ void SumRowsKernel(const float* dy, int rows, int cols, float* db) {
  TALLY_GRID_LOOP(c, cols) {
    float s = 0.0f;
    for (int r = 0; r < rows; ++r) s += dy[static_cast<int64_t>(r) * cols + c];
    db[c] = s;
  }
}
__global__ void ReluKernel(const float* x, float* y, int64_t n) {
  TALLY_GRID_LOOP(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx,
                                   int64_t n) {
  TALLY_GRID_LOOP(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
__global__ void DropoutKernel(const float* x, float* y, float* mask, int64_t n,
                              float p, float keep_scale, uint64_t seed,
                              int64_t offset) {
  TALLY_GRID_LOOP(i, n) {
    const float m = HashUniform(seed, offset + i) < p ? 0.0f : keep_scale;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}
__global__ void MultiplyKernel(const float* a, const float* b, float* out,
                               int64_t n) {
  TALLY_GRID_LOOP(i, n) out[i] = a[i] * b[i];
}

__global__ void Im2ColKernel(Conv2dGeometry g, const float* x, float* col) {
  const int oh = g.out_h(), ow = g.out_w(), k = g.kernel;
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  const int64_t rows = static_cast<int64_t>(g.in_channels) * k * k;
  const int64_t total = g.batch * rows * plane;
  TALLY_GRID_LOOP(i, total) {
    const int64_t p = i % plane;
    const int64_t row = (i / plane) % rows;
    const int64_t n = i / (plane * rows);
    const int kj = row % k, ki = (row / k) % k,
              c = static_cast<int>(row / (k * k));
    const int y = static_cast<int>(p / ow), xo = static_cast<int>(p % ow);
    const int ih = y * g.stride - g.padding + ki,
              iw = xo * g.stride - g.padding + kj;
    float v = 0.0f;
    if (ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w) {
      v = x[((n * g.in_channels + c) * g.in_h + ih) * g.in_w + iw];
    }
    col[i] = v;
  }
}

// One thread per input element gathers every column entry that read it.
__global__ void Col2ImKernel(Conv2dGeometry g, const float* col, float* x) {
  const int oh = g.out_h(), ow = g.out_w(), k = g.kernel, s = g.stride;
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  const int64_t rows = static_cast<int64_t>(g.in_channels) * k * k;
  const int64_t total =
      static_cast<int64_t>(g.batch) * g.in_channels * g.in_h * g.in_w;
  TALLY_GRID_LOOP(i, total) {
    const int iw = static_cast<int>(i % g.in_w);
    const int ih = static_cast<int>((i / g.in_w) % g.in_h);
    const int c = static_cast<int>(
        (i / (static_cast<int64_t>(g.in_w) * g.in_h)) % g.in_channels);
    const int64_t n =
        i / (static_cast<int64_t>(g.in_w) * g.in_h * g.in_channels);
    float sum = 0.0f;
    for (int ki = 0; ki < k; ++ki) {
      const int yy = ih + g.padding - ki;
      if (yy < 0 || yy % s != 0 || yy / s >= oh) continue;
      for (int kj = 0; kj < k; ++kj) {
        const int xx = iw + g.padding - kj;
        if (xx < 0 || xx % s != 0 || xx / s >= ow) continue;
        const int64_t row = (static_cast<int64_t>(c) * k + ki) * k + kj;
        sum += col[(n * rows + row) * plane + (yy / s) * ow + xx / s];
      }
    }
    x[i] = sum;
  }
}

__global__ void AddChannelBiasKernel(const float* b, int batch, int channels,
                                     int plane, float* y) {
  TALLY_GRID_LOOP(i, static_cast<int64_t>(batch) * channels * plane) {
    y[i] += b[(i / plane) % channels];
  }
}

// One block per channel, a tree reduction over (n, p).
__global__ void ChannelSumKernel(const float* dy, int batch, int channels,
                                 int plane, float* db) {
  __shared__ float part[kThreads];
  const int c = blockIdx.x;
  float s = 0.0f;
  const int64_t count = static_cast<int64_t>(batch) * plane;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t n = j / plane, p = j % plane;
    s += dy[(n * channels + c) * plane + p];
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = part[0];
}

__global__ void MaxPoolForwardKernel(Pool2dGeometry g, const float* x, float* y,
                                     int32_t* argmax) {
  const int oh = g.out_h(), ow = g.out_w();
  const int64_t total = static_cast<int64_t>(g.batch) * g.channels * oh * ow;
  TALLY_GRID_LOOP(i, total) {
    const int j = static_cast<int>(i % ow);
    const int r = static_cast<int>((i / ow) % oh);
    const int64_t plane_index = i / (static_cast<int64_t>(oh) * ow);
    const float* xp = x + plane_index * g.in_h * g.in_w;
    const int h0 = r * g.stride - g.padding, w0 = j * g.stride - g.padding;
    const int hs = max(h0, 0), he = min(h0 + g.kernel, g.in_h);
    const int ws = max(w0, 0), we = min(w0 + g.kernel, g.in_w);
    float best = -FLT_MAX;
    bool any = false;
    int32_t best_idx = hs * g.in_w + ws;
    for (int h = hs; h < he; ++h) {
      for (int w = ws; w < we; ++w) {
        const float v = xp[h * g.in_w + w];
        if (!any || v > best || (v != v && best == best)) {
          best = v;
          best_idx = h * g.in_w + w;
          any = true;
        }
      }
    }
    y[i] = best;
    argmax[i] = best_idx;
  }
}

__global__ void MaxPoolBackwardKernel(Pool2dGeometry g, const float* dy,
                                      const int32_t* argmax, float* dx) {
  const int64_t out_plane = static_cast<int64_t>(g.out_h()) * g.out_w();
  const int64_t total = static_cast<int64_t>(g.batch) * g.channels * out_plane;
  TALLY_GRID_LOOP(i, total) {
    const int64_t plane_index = i / out_plane;
    atomicAdd(dx + plane_index * g.in_h * g.in_w + argmax[i], dy[i]);
  }
}

__global__ void SoftmaxXentKernel(const float* logits, const int32_t* labels,
                                  int batch, int classes, float scale,
                                  float* dlogits, float* stats,
                                  int* error_flag) {
  TALLY_GRID_LOOP(r, batch) {
    const float* row = logits + r * classes;
    const int label = labels[r];
    if (label < 0 || label >= classes) {
      atomicExch(error_flag, 1);
      continue;
    }
    int arg = 0;
    float mx = row[0];
    for (int c = 1; c < classes; ++c) {
      if (row[c] > mx) {
        mx = row[c];
        arg = c;
      }
    }
    double sum = 0.0;
    for (int c = 0; c < classes; ++c)
      sum += exp(static_cast<double>(row[c] - mx));
    const double lse = mx + log(sum);
    atomicAdd(stats, static_cast<float>(lse - row[label]));
    if (arg == label) atomicAdd(stats + 1, 1.0f);
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      const float inv = static_cast<float>(1.0 / sum);
      for (int c = 0; c < classes; ++c) d[c] = scale * expf(row[c] - mx) * inv;
      d[label] -= scale;
    }
  }
}

}  // namespace

void Fill(float* x, int64_t n, float v, Stream s) {
  FillKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, v);
}
void Axpy(int64_t n, float a, const float* x, float* y, Stream s) {
  AxpyKernel<<<Blocks(n), kThreads, 0, s>>>(n, a, x, y);
}
void Scale(int64_t n, float a, float* x, Stream s) {
  ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(n, a, x);
}
void BroadcastRows(const float* b, int rows, int cols, float* y, Stream s) {
  BroadcastRowsKernel<<<Blocks(static_cast<int64_t>(rows) * cols), kThreads, 0,
                        s>>>(b, rows, cols, y);
}
void SumRows(const float* dy, int rows, int cols, float* db, Stream s) {
  SumRowsKernel<<<Blocks(cols), kThreads, 0, s>>>(dy, rows, cols, db);
}
void ReluForward(const float* x, float* y, int64_t n, Stream s) {
  ReluKernel<<<Blocks(n), kThreads, 0, s>>>(x, y, n);
}
void ReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                  Stream s) {
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(y, dy, dx, n);
}
void DropoutForward(const float* x, float* y, float* mask, int64_t n, float p,
                    uint64_t seed, int64_t offset, Stream s) {
  const float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  DropoutKernel<<<Blocks(n), kThreads, 0, s>>>(x, y, mask, n, p, keep, seed,
                                               offset);
}
void Multiply(const float* a, const float* b, float* out, int64_t n, Stream s) {
  MultiplyKernel<<<Blocks(n), kThreads, 0, s>>>(a, b, out, n);
}
void Im2ColBatch(const Conv2dGeometry& g, const float* x, float* col,
                 Stream s) {
  const int64_t total = static_cast<int64_t>(g.batch) * g.in_channels *
                        g.kernel * g.kernel * g.out_h() * g.out_w();
  Im2ColKernel<<<Blocks(total), kThreads, 0, s>>>(g, x, col);
}
void Col2ImBatch(const Conv2dGeometry& g, const float* col, float* x,
                 Stream s) {
  const int64_t total =
      static_cast<int64_t>(g.batch) * g.in_channels * g.in_h * g.in_w;
  Col2ImKernel<<<Blocks(total), kThreads, 0, s>>>(g, col, x);
}
void AddChannelBias(const float* b, int batch, int channels, int plane,
                    float* y, Stream s) {
  AddChannelBiasKernel<<<Blocks(static_cast<int64_t>(batch) * channels * plane),
                         kThreads, 0, s>>>(b, batch, channels, plane, y);
}
void ChannelSum(const float* dy, int batch, int channels, int plane, float* db,
                Stream s) {
  ChannelSumKernel<<<channels, kThreads, 0, s>>>(dy, batch, channels, plane,
                                                 db);
}
void MaxPoolForward(const Pool2dGeometry& g, const float* x, float* y,
                    int32_t* argmax, Stream s) {
  const int64_t total =
      static_cast<int64_t>(g.batch) * g.channels * g.out_h() * g.out_w();
  MaxPoolForwardKernel<<<Blocks(total), kThreads, 0, s>>>(g, x, y, argmax);
}
void MaxPoolBackward(const Pool2dGeometry& g, const float* dy,
                     const int32_t* argmax, float* dx, Stream s) {
  const int64_t in_total =
      static_cast<int64_t>(g.batch) * g.channels * g.in_h * g.in_w;
  FillKernel<<<Blocks(in_total), kThreads, 0, s>>>(dx, in_total, 0.0f);
  const int64_t total =
      static_cast<int64_t>(g.batch) * g.channels * g.out_h() * g.out_w();
  MaxPoolBackwardKernel<<<Blocks(total), kThreads, 0, s>>>(g, dy, argmax, dx);
}
void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int batch,
                         int classes, float scale, float* dlogits, float* stats,
                         int* error_flag, Stream s) {
  cudaMemsetAsync(stats, 0, 2 * sizeof(float), s);
  SoftmaxXentKernel<<<Blocks(batch), kThreads, 0, s>>>(
      logits, labels, batch, classes, scale, dlogits, stats, error_flag);
}

}  // namespace tally::cuda
