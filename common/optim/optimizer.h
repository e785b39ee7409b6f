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
  // The learning rate over the job's steps (ScheduledLr), stepped once per
  // optimizer step as PyTorch's schedulers are stepped after each
  // optimizer.step(): a linear warm-up from lr / warmup_steps to lr over the
  // first warmup_steps, then constant, step (times gamma every step_size
  // steps, StepLR) or cosine (from lr to min_lr over the remaining steps,
  // CosineAnnealingLR's closed form).
  enum class Schedule { kConstant, kStep, kCosine };
  Schedule schedule = Schedule::kConstant;
  int64_t warmup_steps = 0;
  int64_t step_size = 1;
  double gamma = 0.1;
  double min_lr = 0.0;
  // Gradient clipping by norm (0: off), applied by each worker before its
  // push, not by the shards: its batch's mean gradient over the whole model
  // is scaled to an L2 norm of at most this, as
  // torch.nn.utils.clip_grad_norm_ does (docs/job-spec.md says why).
  double clip_grad_norm = 0.0;
};

// The learning rate of optimizer step `step` (0-based) of `total_steps`
// (0: unknown, and a cosine schedule keeps lr after its warm-up).
double ScheduledLr(const OptimizerConfig& config, int64_t step,
                   int64_t total_steps);

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

  // params -= update(grads); both have size() elements. The learning rate
  // is the schedule's for this optimizer's step count.
  virtual void Step(float* params, const float* grads) = 0;

  // The job's length in steps, for a schedule that ends (cosine).
  void set_total_steps(int64_t n) { total_steps_ = n; }

  virtual int64_t size() const = 0;
  virtual OptimizerState SaveState() const = 0;
  // kInvalidArgument when the state does not match this optimizer.
  virtual absl::Status LoadState(const OptimizerState& state) = 0;

 protected:
  explicit Optimizer(const OptimizerConfig& config) : config_(config) {}
  // The learning rate of step `step` (0-based), in double as PyTorch's
  // Python floats are; each optimizer rounds it where PyTorch does.
  double LrFor(int64_t step) const {
    return ScheduledLr(config_, step, total_steps_);
  }

 private:
  OptimizerConfig config_;
  int64_t total_steps_ = 0;
};

}  // namespace tally

#endif  // TALLY_COMMON_OPTIM_OPTIMIZER_H_
