#include "common/optim/row_optimizer.h"

#include <cmath>

#include "common/optim/internal/kernels.h"

namespace tally {

void SgdRow(float lr, float weight_decay, int64_t dim, const float* g,
            float* p) {
  optim_internal::SgdPlain(dim, lr, weight_decay, p, g);
}

void AdagradRow(float lr, float weight_decay, float eps, int64_t dim,
                const float* g, float* p, float* sums) {
  for (int64_t j = 0; j < dim; ++j) {
    const float d = weight_decay != 0.0f ? g[j] + weight_decay * p[j] : g[j];
    sums[j] = sums[j] + d * d;                       // state_sum.addcmul_(g, g)
    const float std_dev = std::sqrt(sums[j]) + eps;  // .sqrt().add_(eps)
    // param.add_(g / std, alpha=-clr): a sparse add, fused (axpy).
    p[j] = std::fma(-lr, d / std_dev, p[j]);
  }
}

// Its functional sparse_adam, in float32.
void SparseAdamRow(double lr, double beta1, double beta2, double eps,
                   int64_t step, int64_t dim, const float* g, float* p,
                   float* moments) {
  float* m = moments;
  float* v = moments + dim;
  const float one_b1 = static_cast<float>(1.0 - beta1);
  const float one_b2 = static_cast<float>(1.0 - beta2);
  const float eps_f = static_cast<float>(eps);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const float neg_step = static_cast<float>(-(lr * std::sqrt(bc2) / bc1));
  for (int64_t j = 0; j < dim; ++j) {
    const float old_m = m[j], old_v = v[j];
    const float dm = (g[j] - old_m) * one_b1;
    const float dv = (g[j] * g[j] - old_v) * one_b2;
    m[j] = old_m + dm;
    v[j] = old_v + dv;
    const float numer = dm + old_m;
    const float denom = std::sqrt(dv + old_v) + eps_f;
    p[j] = p[j] + neg_step * (numer / denom);
  }
}

}  // namespace tally
