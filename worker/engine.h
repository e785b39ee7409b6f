// The data-parallel engine of one worker: torch.nn.parallel's replicate,
// scatter, parallel_apply and reduce over the worker's local devices.
//
// Replicas are built once per job, one per device, each driven by its own
// persistent thread (ThreadGroup). A step:
//   1. broadcast: every replica copies the host master weights (params());
//      a CPU replica 0 *is* the master, so it copies nothing; a GPU streams
//      each layer's weights in on its copy stream just before that layer's
//      forward pass, so the upload of later layers overlaps compute;
//   2. scatter: the batch is cut along dimension 0 into contiguous
//      micro-batches whose sizes differ by at most one (a batch smaller than
//      the device count uses fewer replicas, never an empty micro-batch);
//   3. parallel_apply: each replica runs forward, the loss (scaled by
//      1/batch, so gradients are already weighted by micro-batch size) and
//      backward on its own device;
//   4. reduce: thread r sums slice r of the flat gradient over the used
//      replicas into grads(), then calls the caller's `apply` for that slice
//      (the standalone trainer runs the optimizer there, in parallel). A
//      GPU's gradients reach host memory layer by layer during backward, on
//      the copy stream (with one GPU, StepHooks hears of each layer as its
//      copy lands). Several GPUs instead all-reduce on the devices (NCCL,
//      or peer copies and a kernel sum where NCCL is missing or refuses the
//      devices) and replica 0 copies the sum into grads().
// The result equals one device running the whole batch, up to float
// summation order.
//
// Threading: Step and Evaluate are called from one driver thread. params()
// and grads() may be touched by the driver only between steps. A failing
// replica (bad label, allocation failure, device error) makes the step return
// its Status after the other replicas finish; the next step runs normally.
#ifndef TALLY_WORKER_ENGINE_H_
#define TALLY_WORKER_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/data/dataset.h"
#include "common/device.h"
#include "common/nn/layer_config.h"
#include "worker/model_engine.h"

namespace tally {

class ThreadGroup;
namespace internal {
struct Replica;
struct HostBuffer;
}  // namespace internal

struct EngineOptions {
  std::vector<DeviceId> devices = {DeviceId{DeviceType::kCpu, 0}};
  // Bound on one round of the device threads.
  absl::Duration step_timeout = absl::Minutes(10);
  // GPUs: let cuBLAS use TF32 tensor cores (job spec training.tf32).
  bool allow_tf32 = false;
  // Test seam: runs on replica `r`'s thread between its forward and backward
  // passes; a non-OK status fails that replica's part of the step.
  std::function<absl::Status(int replica)> fault_hook;
  // Test seam: opens the devices instead of OpenDevice (a test swaps in a
  // device that behaves like a GPU without being one).
  std::function<absl::StatusOr<std::unique_ptr<Device>>(DeviceId)> open_device;
  // Reduce several replicas with the peer-copy collective even where NCCL or
  // the host reduction would be chosen (tests; the fallback path on GPUs).
  bool force_peer_reduction = false;
};

class Engine : public ModelEngine {
 public:

  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const std::vector<LayerConfig>& layers, const Shape& input_shape,
      const EngineOptions& options);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine() override;

  int num_replicas() const override {
    return static_cast<int>(replicas_.size());
  }
  int64_t num_params() const override { return num_params_; }
  const char* reduction() const override {
    return collective_ != nullptr ? collective_->name() : "host";
  }
  const std::string& reduction_note() const override {
    return reduction_note_;
  }
  const ModelLayout& layout() const { return layout_; }

  float* params() override { return params_; }
  const float* grads() const override { return grads_; }

  absl::StatusOr<StepStats> Step(const BatchView& batch, uint64_t seed,
                                 const SliceFn& apply = {},
                                 const StepHooks* hooks = nullptr) override;

  absl::StatusOr<StepStats> Evaluate(const Dataset& data) override;

  // Micro-batch sizes for `batch` samples over `replicas` devices: at most
  // `replicas` entries, all positive, differing by at most one.
  static std::vector<int> Split(int batch, int replicas);

  // Slice r of n elements over k parts: [r*n/k, (r+1)*n/k).
  static std::pair<int64_t, int64_t> Slice(int64_t n, int r, int k);

 private:
  Engine() = default;
  // Step's parts: the plan every replica shares, each replica's part
  // (phase 1: compute, and all-reduce with a collective), its hooks in host
  // memory or off the host, and each thread's slice of the sum (phase 2).
  struct StepPlan;
  struct ReplicaHooks;
  absl::Status RunReplica(int r, const StepPlan& plan);
  absl::Status ComputeReplica(internal::Replica& rep, int r,
                              const StepPlan& plan);
  absl::Status HostHooks(internal::Replica& rep, const StepPlan& plan,
                         ReplicaHooks& hooks);
  void OffHostHooks(internal::Replica& rep, const StepPlan& plan,
                    ReplicaHooks& hooks);
  absl::Status ReduceSlice(int r, const StepPlan& plan, const SliceFn& apply);

  EngineOptions options_;
  ModelLayout layout_;
  Shape input_shape_;
  int64_t num_params_ = 0;
  std::vector<std::unique_ptr<internal::Replica>> replicas_;
  std::unique_ptr<Collective> collective_;  // among devices, if any
  std::string reduction_note_;
  std::unique_ptr<ThreadGroup> threads_;
  // Pinned host master copies when replica 0 is not host memory.
  std::unique_ptr<internal::HostBuffer> host_params_, host_grads_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
};

}  // namespace tally

#endif  // TALLY_WORKER_ENGINE_H_
