// What a job runner trains with: a model replicated over a worker's
// devices, stepped on one batch at a time. Two implementations: Engine
// (worker/engine.h), the native engine for models of layers, and the Python
// worker's engine (python/tally/_native.cc) for a submitter's own
// torch.nn.Module. Both keep the host master weights and the reduced
// gradient as flat float32 vectors of num_params(), in the job's layout, so
// the parameter client pulls into and pushes from them directly.
//
// Threading: Step and Evaluate are called from one driver thread. params()
// and grads() may be touched by the driver only between steps.
#ifndef TALLY_WORKER_MODEL_ENGINE_H_
#define TALLY_WORKER_MODEL_ENGINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"

namespace tally {

// A batch in host memory: `size` samples back to back, their inputs in x
// (floats) or ids (int64 token ids, which only a Python model takes), and
// their labels (one a sample, or one a token: JobSpec::label_shape).
struct BatchView {
  const float* x = nullptr;
  const int32_t* y = nullptr;
  int size = 0;
  const int64_t* ids = nullptr;
};

struct StepStats {
  double loss_sum = 0.0;  // summed over the batch's samples
  int64_t correct = 0;
  int64_t samples = 0;
  // Evaluate with binary_cross_entropy: the ROC AUC over all the samples;
  // -1: none.
  double auc = -1.0;
};

// Lets the caller overlap its own work with a step: the job runner pushes
// each layer's gradient while the layers before it are still in their
// backward pass. Both hooks are optional.
struct StepHooks {
  // Before the step reads params()[begin, end): may block until they are
  // there (weights still arriving from a pull, the first layers first). A
  // non-OK status fails the step. One replica (in host memory or on a GPU)
  // asks layer by layer, before each layer's forward pass (a GPU's copy of
  // that layer goes in after it); several once for the whole vector, before
  // the replicas copy it.
  std::function<absl::Status(int64_t begin, int64_t end)> params_ready;
  // Once per successful forward pass, with the whole batch's loss and
  // counts, before any grads_ready. A non-OK status fails the step.
  std::function<absl::Status(const StepStats&)> loss_known;
  // grads()[begin, end) holds this step's final gradient and does not
  // change before the next Step. The ranges of one step cover
  // [0, num_params()) exactly once, in any order (one replica: layer by
  // layer, the last layer first, as backward produces them in host memory
  // or, on a GPU, as each layer's copy lands while the layers before it
  // still compute; several: one range per reduced slice, possibly from
  // several threads at once). A step that fails may have reported some
  // ranges, never all of them (one replica reports the range holding
  // element 0 only once its backward pass has succeeded): what was done
  // with them is to be undone.
  std::function<void(int64_t begin, int64_t end)> grads_ready;
  // A Python model's buffer region as the step's pull brought it (the
  // lowest live rank's, PullResponse.buffers): loaded into the replicas
  // before the forward pass, once params_ready allowed it. Null or empty:
  // the replicas keep their own.
  const std::string* buffers = nullptr;
};

// A job's sparse embedding tables (model.embeddings), as an engine's step
// reaches them: rows pulled as the step's forward pass needs them, and the
// step's row gradients pushed before its dense gradient is (worker/
// row_client.h implements it over the job's shards). The job runner says
// which step and version come next (BeginStep); Pull and Push block.
class TableRows {
 public:
  virtual ~TableRows() = default;
  // A step's (or, with step -1, the evaluation's) rows are those of
  // version >= min_version.
  virtual void BeginStep(int64_t step, int64_t min_version) = 0;
  // The values of `n` rows of `table` (its dim floats each, into out).
  virtual absl::Status Pull(int table, const int64_t* rows, int64_t n,
                            float* out) = 0;
  // Rows of several tables at once: one message per shard (in pieces of
  // at most the shards' bound).
  struct Rows {
    int table = 0;
    const int64_t* rows = nullptr;
    int64_t n = 0;
    float* out = nullptr;  // n * dim
  };
  virtual absl::Status PullTables(const std::vector<Rows>& pulls) = 0;
  // One table's row gradients of the step: each row once.
  struct Grads {
    int table = 0;
    const int64_t* rows = nullptr;
    int64_t n = 0;
    const float* grads = nullptr;  // n * dim
  };
  // The step's row gradients, of a batch of `samples`, to every shard
  // that owns some (answered before this returns).
  virtual absl::Status Push(int64_t samples,
                            const std::vector<Grads>& grads) = 0;
};

class ModelEngine {
 public:
  // Runs on slice number `slice`, [begin, end) of the flat vector, once
  // grads() holds it; slices are Slice(num_params(), slice, num_replicas()).
  using SliceFn = std::function<void(int slice, int64_t begin, int64_t end)>;

  virtual ~ModelEngine() = default;

  virtual int num_replicas() const = 0;
  virtual int64_t num_params() const = 0;
  // How gradients of several replicas meet: "host", "nccl" or "peer".
  virtual const char* reduction() const = 0;
  // Why GPUs reduce by peer copies and not NCCL; empty otherwise.
  virtual const std::string& reduction_note() const = 0;

  // Host master weights and the reduced gradient, num_params() floats each.
  virtual float* params() = 0;
  virtual const float* grads() const = 0;

  // One step on `batch` from params(): the gradient of the batch's mean
  // loss into grads(). `seed` seeds the step's randomness (dropout).
  virtual absl::StatusOr<StepStats> Step(const BatchView& batch, uint64_t seed,
                                         const SliceFn& apply = {},
                                         const StepHooks* hooks = nullptr) = 0;

  // Loss and accuracy of params() on `data`.
  virtual absl::StatusOr<StepStats> Evaluate(const Dataset& data) = 0;

  // The model's persistent buffers as Evaluate used them, their bytes in
  // the job's order (a Python model's model.python.buffers); empty when
  // the model has none.
  virtual absl::StatusOr<std::string> Buffers() { return std::string(); }
  // Replaces every replica's persistent buffers with `bytes` (as Buffers
  // gives them); an error says why they do not fit. A model without
  // buffers has nothing to replace.
  virtual absl::Status LoadBuffers(const std::string& /*bytes*/) {
    return absl::OkStatus();
  }

  // The job's tables, for a model that has some (borrowed until set again;
  // null: none). Models without tables ignore it.
  virtual void SetTableRows(TableRows* /*rows*/) {}
};

}  // namespace tally

#endif  // TALLY_WORKER_MODEL_ENGINE_H_
