// Optimizers over flat float32 vectors, with PyTorch's exact update rules
// (torch.optim.SGD, Adam, AdamW; single-tensor code path).
//
// An Optimizer owns its state (momentum, moments) for a vector, or for the
// slice of the flat vector a parameter-server shard owns. Not thread-safe:
// the owner serialises Step calls.
#ifndef TALLY_COMMON_OPTIM_OPTIMIZER_H_
#define TALLY_COMMON_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

enum class OptimizerType { kSgd, kAdam, kAdamW };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kSgd;
  double lr = 0.01;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adam, AdamW
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // SGD and Adam add weight_decay * param to the gradient; AdamW decays the
  // parameter directly (decoupled).
  double weight_decay = 0.0;
};

absl::string_view OptimizerTypeName(OptimizerType type);  // "sgd", ...
absl::StatusOr<OptimizerType> ParseOptimizerType(absl::string_view name);

// Checks the hyper-parameters as PyTorch does; the message names the field.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

// Saved optimizer state, for checkpoints: the step count and one vector per
// state slot (SGD: momentum buffer, if any; Adam: exp_avg, exp_avg_sq).
struct OptimizerState {
  // The most slots any optimizer keeps (Adam's and AdamW's two); an
  // optimizer with more raises it (OptimizerTest checks every one).
  static constexpr int kMaxSlots = 2;
  int64_t step = 0;
  std::vector<std::vector<float>> slots;
};

class Optimizer {
 public:
  // State for `size` elements; kInvalidArgument for a bad config.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerConfig& config, int64_t size);

  virtual ~Optimizer() = default;

  // params -= update(grads); both have size() elements.
  virtual void Step(float* params, const float* grads) = 0;

  virtual int64_t size() const = 0;
  virtual OptimizerState SaveState() const = 0;
  // kInvalidArgument when the state does not match this optimizer.
  virtual absl::Status LoadState(const OptimizerState& state) = 0;
};

}  // namespace tally

#endif  // TALLY_COMMON_OPTIM_OPTIMIZER_H_
