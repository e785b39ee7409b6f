// Update rules for embedding rows (a sparse gradient: the rows a step
// touched), PyTorch's, each stepping one row of `dim` values with the
// row's mean gradient `g`. With optimizer.h's dense rules they are every
// update rule Tally has:
//
//   dense (Optimizer)  sgd      torch.optim.SGD: momentum, dampening,
//                               nesterov, weight decay
//                      adam     torch.optim.Adam, single-tensor path
//                      adamw    torch.optim.AdamW
//   rows (below)       sgd      p -= lr * (g + weight_decay * p): the dense
//                               SGD's element rule (momentum 0), the same
//                               code, so a row rounds as a dense value does
//                      adagrad  s += g*g; p -= lr * g / (sqrt(s) + eps), the
//                               last step fused (torch.optim.Adagrad, lr_decay
//                               0, on the touched rows, as its sparse-gradient
//                               path does: bit for bit)
//                      adam     lazy Adam, torch.optim.SparseAdam op for op:
//                               the moments of the rows a step touched, bias
//                               correction by the job's step
//
// Plain functions of their arguments: thread-safe.
#ifndef TALLY_COMMON_OPTIM_ROW_OPTIMIZER_H_
#define TALLY_COMMON_OPTIM_ROW_OPTIMIZER_H_

#include <cstdint>

namespace tally {

// sgd on one row.
void SgdRow(float lr, float weight_decay, int64_t dim, const float* g,
            float* p);
// adagrad on one row; `sums` are its squared-gradient sums (dim floats).
void AdagradRow(float lr, float weight_decay, float eps, int64_t dim,
                const float* g, float* p, float* sums);
// adam (lazy) on one row at the job's step `step` (counted from 1);
// `moments` are its m, then its v (2 * dim floats).
void SparseAdamRow(double lr, double beta1, double beta2, double eps,
                   int64_t step, int64_t dim, const float* g, float* p,
                   float* moments);

}  // namespace tally

#endif  // TALLY_COMMON_OPTIM_ROW_OPTIMIZER_H_
