#include "common/internal/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/vectorize.h"

namespace tally::internal {

namespace {

// Loop bodies as free functions: GCC cannot multiversion virtual methods.
TALLY_VECTORIZE void AxpyLoop(int64_t n, float alpha, const float* __restrict x,
                              float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

TALLY_VECTORIZE void ScaleLoop(int64_t n, float alpha, float* __restrict x) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

TALLY_VECTORIZE void AddRowLoop(int cols, const float* __restrict row,
                                float* __restrict acc) {
  for (int c = 0; c < cols; ++c) acc[c] += row[c];
}

// x and y may be the same buffer (ReLU in place).
TALLY_VECTORIZE void ReluLoop(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

TALLY_VECTORIZE void ReluBackwardLoop(const float* __restrict y,
                                      const float* __restrict dy,
                                      float* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

TALLY_VECTORIZE void MultiplyLoop(const float* __restrict a,
                                  const float* __restrict b,
                                  float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

// Sum of x[0..n) with eight independent accumulators, which the compiler can
// keep in vector registers without reassociating a single chain.
TALLY_VECTORIZE float SumLoop(const float* __restrict x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  }
  float total = 0.0f;
  for (; i < n; ++i) total += x[i];
  for (float a : acc) total += a;
  return total;
}

// 2x2 max pooling with stride 2 and no padding, the common case. A NaN wins
// as in PyTorch: `v > m || v != v`.
TALLY_VECTORIZE void MaxPool2x2(const float* __restrict x, int in_w, int out_h,
                                int out_w, float* __restrict y,
                                int32_t* __restrict argmax) {
  for (int i = 0; i < out_h; ++i) {
    const float* r0 = x + static_cast<int64_t>(2 * i) * in_w;
    const float* r1 = r0 + in_w;
    float* yr = y + static_cast<int64_t>(i) * out_w;
    int32_t* ar = argmax + static_cast<int64_t>(i) * out_w;
    const int32_t base_row = 2 * i * in_w;
    for (int j = 0; j < out_w; ++j) {
      const int32_t base = base_row + 2 * j;
      float m = r0[2 * j];
      int32_t k = base;
      const float b = r0[2 * j + 1];
      if (b > m || b != b) {
        m = b;
        k = base + 1;
      }
      const float c = r1[2 * j];
      if (c > m || c != c) {
        m = c;
        k = base + in_w;
      }
      const float d = r1[2 * j + 1];
      if (d > m || d != d) {
        m = d;
        k = base + in_w + 1;
      }
      yr[j] = m;
      ar[j] = k;
    }
  }
}

// A short row copy; memcpy's call overhead dominates at these widths.
TALLY_VECTORIZE void CopyRow(const float* __restrict src, float* __restrict dst,
                             int n) {
  for (int i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace

void CpuKernels::Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                      float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
              ldb, beta, c, ldc);
}

void CpuKernels::Fill(float* x, int64_t n, float value) {
  std::fill(x, x + n, value);
}

void CpuKernels::Copy(const float* src, float* dst, int64_t n) {
  if (src != dst) std::memcpy(dst, src, n * sizeof(float));
}

void CpuKernels::Axpy(int64_t n, float alpha, const float* x, float* y) {
  AxpyLoop(n, alpha, x, y);
}

void CpuKernels::Scale(int64_t n, float alpha, float* x) {
  ScaleLoop(n, alpha, x);
}

void CpuKernels::BroadcastRows(const float* bias, int rows, int cols,
                               float* y) {
  for (int r = 0; r < rows; ++r) {
    std::memcpy(y + static_cast<int64_t>(r) * cols, bias, cols * sizeof(float));
  }
}

void CpuKernels::SumRows(const float* dy, int rows, int cols, float* db) {
  std::fill(db, db + cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    AddRowLoop(cols, dy + static_cast<int64_t>(r) * cols, db);
  }
}

void CpuKernels::ReluForward(const float* x, float* y, int64_t n) {
  ReluLoop(x, y, n);
}

void CpuKernels::ReluBackward(const float* y, const float* dy, float* dx,
                              int64_t n) {
  ReluBackwardLoop(y, dy, dx, n);
}

void CpuKernels::DropoutForward(const float* x, float* y, float* mask,
                                int64_t n, float p, uint64_t seed,
                                int64_t index_offset) {
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    mask[i] = HashUniform(seed, index_offset + i) < p ? 0.0f : keep_scale;
    y[i] = x[i] * mask[i];
  }
}

void CpuKernels::Multiply(const float* a, const float* b, float* out,
                          int64_t n) {
  MultiplyLoop(a, b, out, n);
}

void Im2Col(const Conv2dGeometry& g, const float* x, float* col) {
  const int oh = g.out_h(), ow = g.out_w(), k = g.kernel, s = g.stride;
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  for (int c = 0; c < g.in_channels; ++c) {
    const float* xc = x + static_cast<int64_t>(c) * g.in_h * g.in_w;
    for (int ki = 0; ki < k; ++ki) {
      for (int kj = 0; kj < k; ++kj) {
        float* row =
            col + ((static_cast<int64_t>(c) * k + ki) * k + kj) * plane;
        // Output columns whose input column iw = o*s - p + kj is in range.
        int ow_lo = 0, ow_hi = ow;
        while (ow_lo < ow && ow_lo * s - g.padding + kj < 0) ++ow_lo;
        while (ow_hi > ow_lo && (ow_hi - 1) * s - g.padding + kj >= g.in_w)
          --ow_hi;
        for (int y = 0; y < oh; ++y) {
          float* out = row + static_cast<int64_t>(y) * ow;
          const int ih = y * s - g.padding + ki;
          if (ih < 0 || ih >= g.in_h) {
            std::fill(out, out + ow, 0.0f);
            continue;
          }
          const float* in = xc + static_cast<int64_t>(ih) * g.in_w;
          std::fill(out, out + ow_lo, 0.0f);
          if (s == 1) {
            CopyRow(in + ow_lo - g.padding + kj, out + ow_lo, ow_hi - ow_lo);
          } else {
            for (int o = ow_lo; o < ow_hi; ++o)
              out[o] = in[o * s - g.padding + kj];
          }
          std::fill(out + ow_hi, out + ow, 0.0f);
        }
      }
    }
  }
}

void Col2Im(const Conv2dGeometry& g, const float* col, float* x) {
  const int oh = g.out_h(), ow = g.out_w(), k = g.kernel, s = g.stride;
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  for (int c = 0; c < g.in_channels; ++c) {
    float* xc = x + static_cast<int64_t>(c) * g.in_h * g.in_w;
    for (int ki = 0; ki < k; ++ki) {
      for (int kj = 0; kj < k; ++kj) {
        const float* row =
            col + ((static_cast<int64_t>(c) * k + ki) * k + kj) * plane;
        for (int y = 0; y < oh; ++y) {
          const int ih = y * s - g.padding + ki;
          if (ih < 0 || ih >= g.in_h) continue;
          float* out = xc + static_cast<int64_t>(ih) * g.in_w;
          const float* in = row + static_cast<int64_t>(y) * ow;
          for (int o = 0; o < ow; ++o) {
            const int iw = o * s - g.padding + kj;
            if (iw >= 0 && iw < g.in_w) out[iw] += in[o];
          }
        }
      }
    }
  }
}

void CpuKernels::Conv2dForward(const Conv2dGeometry& g, const float* x,
                               const float* w, const float* b, float* y) {
  const int ckk = g.in_channels * g.kernel * g.kernel;
  const int p = g.out_h() * g.out_w();
  const int64_t in_size = static_cast<int64_t>(g.in_channels) * g.in_h * g.in_w;
  const int64_t out_size = static_cast<int64_t>(g.out_channels) * p;
  float* col = Scratch(static_cast<size_t>(ckk) * p);
  for (int n = 0; n < g.batch; ++n) {
    float* yn = y + n * out_size;
    if (b != nullptr) {
      for (int c = 0; c < g.out_channels; ++c) {
        std::fill(yn + static_cast<int64_t>(c) * p,
                  yn + static_cast<int64_t>(c + 1) * p, b[c]);
      }
    }
    Im2Col(g, x + n * in_size, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.out_channels, p,
                ckk, 1.0f, w, ckk, col, p, b != nullptr ? 1.0f : 0.0f, yn, p);
  }
}

void CpuKernels::Conv2dBackward(const Conv2dGeometry& g, const float* x,
                                const float* w, const float* dy, float* dw,
                                float* db, float* dx) {
  const int ckk = g.in_channels * g.kernel * g.kernel;
  const int p = g.out_h() * g.out_w();
  const int64_t in_size = static_cast<int64_t>(g.in_channels) * g.in_h * g.in_w;
  const int64_t out_size = static_cast<int64_t>(g.out_channels) * p;
  float* col = Scratch(static_cast<size_t>(ckk) * p * 2);
  float* dcol = col + static_cast<size_t>(ckk) * p;
  if (db != nullptr) std::fill(db, db + g.out_channels, 0.0f);
  if (dx != nullptr) std::fill(dx, dx + g.batch * in_size, 0.0f);
  for (int n = 0; n < g.batch; ++n) {
    const float* dyn = dy + n * out_size;
    Im2Col(g, x + n * in_size, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.out_channels, ckk, p,
                1.0f, dyn, p, col, p, n == 0 ? 0.0f : 1.0f, dw, ckk);
    if (db != nullptr) {
      for (int c = 0; c < g.out_channels; ++c) {
        db[c] += SumLoop(dyn + static_cast<int64_t>(c) * p, p);
      }
    }
    if (dx != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, p,
                  g.out_channels, 1.0f, w, ckk, dyn, p, 0.0f, dcol, p);
      Col2Im(g, dcol, dx + n * in_size);
    }
  }
  if (g.batch == 0)
    std::fill(dw, dw + static_cast<int64_t>(g.out_channels) * ckk, 0.0f);
}

void CpuKernels::MaxPool2dForward(const Pool2dGeometry& g, const float* x,
                                  float* y, int32_t* argmax) {
  const int oh = g.out_h(), ow = g.out_w();
  const int64_t planes = static_cast<int64_t>(g.batch) * g.channels;
  const int64_t in_plane = static_cast<int64_t>(g.in_h) * g.in_w;
  const int64_t out_plane = static_cast<int64_t>(oh) * ow;
  const bool fast = g.kernel == 2 && g.stride == 2 && g.padding == 0;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = x + pl * in_plane;
    float* yp = y + pl * out_plane;
    int32_t* ap = argmax + pl * out_plane;
    if (fast) {
      MaxPool2x2(xp, g.in_w, oh, ow, yp, ap);
      continue;
    }
    for (int i = 0; i < oh; ++i) {
      const int h0 = i * g.stride - g.padding;
      const int hs = std::max(h0, 0), he = std::min(h0 + g.kernel, g.in_h);
      for (int j = 0; j < ow; ++j) {
        const int w0 = j * g.stride - g.padding;
        const int ws = std::max(w0, 0), we = std::min(w0 + g.kernel, g.in_w);
        float best = -std::numeric_limits<float>::infinity();
        int32_t best_idx = hs * g.in_w + ws;
        for (int h = hs; h < he; ++h) {
          for (int w = ws; w < we; ++w) {
            const float v = xp[h * g.in_w + w];
            // A NaN wins and stays, as in PyTorch.
            if (v > best || (v != v && best == best)) {
              best = v;
              best_idx = h * g.in_w + w;
            }
          }
        }
        yp[i * ow + j] = best;
        ap[i * ow + j] = best_idx;
      }
    }
  }
}

void CpuKernels::MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                                   const int32_t* argmax, float* dx) {
  const int64_t planes = static_cast<int64_t>(g.batch) * g.channels;
  const int64_t in_plane = static_cast<int64_t>(g.in_h) * g.in_w;
  const int64_t out_plane = static_cast<int64_t>(g.out_h()) * g.out_w();
  std::fill(dx, dx + planes * in_plane, 0.0f);
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dxp = dx + pl * in_plane;
    const float* dyp = dy + pl * out_plane;
    const int32_t* ap = argmax + pl * out_plane;
    for (int64_t i = 0; i < out_plane; ++i) dxp[ap[i]] += dyp[i];
  }
}

namespace {

// Returns false when a label is out of range.
template <bool kWithGrad>
bool SoftmaxXent(const float* logits, const int32_t* labels, int batch,
                 int classes, float grad_scale, float* dlogits, float* stats) {
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int r = 0; r < batch; ++r) {
    const float* row = logits + static_cast<int64_t>(r) * classes;
    const int label = labels[r];
    if (label < 0 || label >= classes) return false;
    int arg = 0;
    float mx = row[0];
    for (int c = 1; c < classes; ++c) {
      if (row[c] > mx) {
        mx = row[c];
        arg = c;
      }
    }
    double sum = 0.0;
    for (int c = 0; c < classes; ++c) sum += std::exp(row[c] - mx);
    const double lse = mx + std::log(sum);
    loss_sum += lse - row[label];
    correct += (arg == label);
    if constexpr (kWithGrad) {
      float* drow = dlogits + static_cast<int64_t>(r) * classes;
      const float inv = static_cast<float>(1.0 / sum);
      for (int c = 0; c < classes; ++c) {
        drow[c] = grad_scale * std::exp(row[c] - mx) * inv;
      }
      drow[label] -= grad_scale;
    }
  }
  stats[0] = static_cast<float>(loss_sum);
  stats[1] = static_cast<float>(correct);
  return true;
}

}  // namespace

void CpuKernels::SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                                     int batch, int classes, float grad_scale,
                                     float* dlogits, float* stats) {
  if (!SoftmaxXent<true>(logits, labels, batch, classes, grad_scale, dlogits,
                         stats)) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("a label is outside [0, ", classes, ")")));
  }
}

void CpuKernels::SoftmaxCrossEntropyStats(const float* logits,
                                          const int32_t* labels, int batch,
                                          int classes, float* stats) {
  if (!SoftmaxXent<false>(logits, labels, batch, classes, 0.0f, nullptr,
                          stats)) {
    Fail(absl::InvalidArgumentError(
        absl::StrCat("a label is outside [0, ", classes, ")")));
  }
}

}  // namespace tally::internal
