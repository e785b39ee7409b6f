#include "worker/engine.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/kernels.h"
#include "common/nn/loss.h"
#include "common/nn/sequential.h"
#include "common/status_macros.h"
#include "common/vectorize.h"
#include "worker/thread_group.h"

namespace tally {

namespace internal {

// Host memory from a device's AllocateHost (page-locked for GPUs).
struct HostBuffer {
  Device* device = nullptr;  // borrowed
  void* ptr = nullptr;
  ~HostBuffer() {
    if (ptr != nullptr) device->FreeHost(ptr);
  }
  float* data() const { return static_cast<float*>(ptr); }

  static absl::StatusOr<std::unique_ptr<HostBuffer>> Create(Device* device,
                                                            int64_t floats) {
    auto b = std::make_unique<HostBuffer>();
    b->device = device;
    TALLY_ASSIGN_OR_RETURN(b->ptr,
                           device->AllocateHost(floats * sizeof(float)));
    std::fill(b->data(), b->data() + floats, 0.0f);
    return b;
  }
};

// One device's copy of the model and its per-step buffers.
struct Replica {
  std::unique_ptr<Device> device;
  std::unique_ptr<Sequential> model;
  std::unique_ptr<CrossEntropyLoss> loss;
  DeviceBuffer<float> x;  // device inputs (unused on host devices)
  DeviceBuffer<int32_t> y;
  // Where a non-host device's gradient lands in host memory: the engine's
  // grads() for replica 0, its own pinned buffer for the others.
  std::unique_ptr<HostBuffer> own_host_grads;
  float* host_grads = nullptr;
  StepStats stats;    // this replica's part of the step
  bool used = false;  // got a micro-batch this step
};

}  // namespace internal

namespace {

// acc[i] += x[i]
TALLY_VECTORIZE void AddInto(float* __restrict acc, const float* __restrict x,
                             int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

absl::Status EnsureCapacity(internal::Replica& r, int64_t floats,
                            int64_t labels) {
  if (r.x.size() < static_cast<size_t>(floats)) {
    r.x.Reset();
    TALLY_ASSIGN_OR_RETURN(r.x,
                           DeviceBuffer<float>::Create(r.device.get(), floats));
  }
  if (r.y.size() < static_cast<size_t>(labels)) {
    r.y.Reset();
    TALLY_ASSIGN_OR_RETURN(
        r.y, DeviceBuffer<int32_t>::Create(r.device.get(), labels));
  }
  return absl::OkStatus();
}

// Points (x, y) at rows [offset, offset + count) of host data, on the device.
absl::Status Stage(internal::Replica& r, const float* x, const int32_t* y,
                   int64_t feat, int64_t offset, int count, const float** dx,
                   const int32_t** dy) {
  if (r.device->host_accessible()) {
    *dx = x + offset * feat;
    *dy = y + offset;
    return absl::OkStatus();
  }
  TALLY_RETURN_IF_ERROR(EnsureCapacity(r, count * feat, count));
  // The host batch stays put until the step or evaluation synchronises.
  TALLY_RETURN_IF_ERROR(r.device->CopyFromHostAsync(
      r.x.data(), x + offset * feat, count * feat * sizeof(float)));
  TALLY_RETURN_IF_ERROR(r.device->CopyFromHostAsync(r.y.data(), y + offset,
                                                    count * sizeof(int32_t)));
  *dx = r.x.data();
  *dy = r.y.data();
  return absl::OkStatus();
}

}  // namespace

std::vector<int> Engine::Split(int batch, int replicas) {
  std::vector<int> sizes;
  const int used = std::min(batch, replicas);
  sizes.reserve(std::max(used, 0));
  for (int r = 0; r < used; ++r) {
    sizes.push_back(batch / used + (r < batch % used ? 1 : 0));
  }
  return sizes;
}

std::pair<int64_t, int64_t> Engine::Slice(int64_t n, int r, int k) {
  return {n * r / k, n * (r + 1) / k};
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const std::vector<LayerConfig>& layers, const Shape& input_shape,
    const EngineOptions& options) {
  if (options.devices.empty()) {
    return absl::InvalidArgumentError("the engine needs at least one device");
  }
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  e->input_shape_ = input_shape;
  TALLY_ASSIGN_OR_RETURN(e->layout_, ComputeLayout(layers, input_shape));
  e->num_params_ = e->layout_.num_params;
  for (const DeviceId& id : options.devices) {
    auto r = std::make_unique<internal::Replica>();
    TALLY_ASSIGN_OR_RETURN(r->device, options.open_device
                                          ? options.open_device(id)
                                          : OpenDevice(id));
    r->device->SetAllowTf32(options.allow_tf32);
    TALLY_ASSIGN_OR_RETURN(
        r->model, Sequential::Create(layers, input_shape, r->device.get()));
    r->loss = std::make_unique<CrossEntropyLoss>(r->device.get());
    e->replicas_.push_back(std::move(r));
  }
  internal::Replica& first = *e->replicas_[0];
  if (first.device->host_accessible()) {
    // Replica 0's own buffers are the master copies: no broadcast to it and
    // no copy of its gradient.
    e->params_ = first.model->params();
    e->grads_ = first.model->grads();
  } else {
    TALLY_ASSIGN_OR_RETURN(
        e->host_params_,
        internal::HostBuffer::Create(first.device.get(), e->num_params_));
    TALLY_ASSIGN_OR_RETURN(
        e->host_grads_,
        internal::HostBuffer::Create(first.device.get(), e->num_params_));
    e->params_ = e->host_params_->data();
    e->grads_ = e->host_grads_->data();
  }
  // GPUs reduce among themselves when they can; otherwise gradients meet in
  // host memory, each landing in a pinned buffer.
  std::vector<Device*> devices;
  for (auto& r : e->replicas_) devices.push_back(r->device.get());
  if (options.force_peer_reduction && devices.size() > 1) {
    e->collective_ = CreatePeerCollective(devices, options.step_timeout);
  } else {
    auto collective =
        CreateCollective(devices, options.step_timeout, &e->reduction_note_);
    if (collective.ok()) e->collective_ = *std::move(collective);
  }
  for (size_t i = 0; i < e->replicas_.size() && e->collective_ == nullptr;
       ++i) {
    internal::Replica& r = *e->replicas_[i];
    if (r.device->host_accessible()) continue;
    if (i == 0) {
      r.host_grads = e->grads_;
      continue;
    }
    TALLY_ASSIGN_OR_RETURN(
        r.own_host_grads,
        internal::HostBuffer::Create(r.device.get(), e->num_params_));
    r.host_grads = r.own_host_grads->data();
  }
  e->threads_ = std::make_unique<ThreadGroup>(e->num_replicas());
  return e;
}

Engine::~Engine() {
  threads_.reset();  // join before the replicas go
}

// What every replica's part of one step shares.
struct Engine::StepPlan {
  const BatchView& batch;
  uint64_t seed;
  const StepHooks& hooks;
  std::vector<int> sizes;        // micro-batch per used replica
  std::vector<int64_t> offsets;  // where each starts in the batch
  int used = 0;
  int64_t features = 0;
  float grad_scale = 1.0f;
  // One replica's gradients are final layer by layer, as backward produces
  // them (in host memory: straight into grads(); on a GPU: once each
  // layer's copy to grads() has landed), and the loss is the batch's once
  // its forward pass is done.
  bool per_layer = false;
};

// One replica's hooks for a step: what the device needs around each
// layer (weights in, gradients out) and what the caller is told. The
// first layer's range (the last one backward reports) waits until the
// whole backward pass has succeeded: a step that fails then never reports
// every range, so a push fed from them stays incomplete and is cancelled,
// whatever the device reports late.
struct Engine::ReplicaHooks {
  ParamHooks hooks;
  bool report = false;     // hand each layer's gradient on (grads_ready)
  int64_t first_end = -1;  // element 0's range, held back until the end
  // A GPU's layer gradients on their way to grads(): (copy mark, range).
  struct Landing {
    int mark;
    int64_t begin, end;
  };
  std::vector<Landing> landing;

  void HandOn(const StepHooks& sh, int64_t begin, int64_t end) {
    if (begin == 0) {
      first_end = end;
    } else {
      sh.grads_ready(begin, end);
    }
  }
};

absl::StatusOr<StepStats> Engine::Step(const BatchView& batch, uint64_t seed,
                                       const SliceFn& apply,
                                       const StepHooks* step_hooks) {
  if (batch.size <= 0 || batch.x == nullptr || batch.y == nullptr) {
    return absl::InvalidArgumentError("a step needs a non-empty batch");
  }
  const StepHooks no_hooks;
  StepPlan plan{batch, seed, step_hooks != nullptr ? *step_hooks : no_hooks};
  plan.sizes = Split(batch.size, num_replicas());
  plan.offsets.assign(plan.sizes.size(), 0);
  for (size_t r = 1; r < plan.sizes.size(); ++r)
    plan.offsets[r] = plan.offsets[r - 1] + plan.sizes[r - 1];
  plan.used = static_cast<int>(plan.sizes.size());
  plan.features = NumElements(input_shape_);
  plan.grad_scale = 1.0f / batch.size;
  plan.per_layer = num_replicas() == 1 && collective_ == nullptr &&
                   (replicas_[0]->device->host_accessible() ||
                    replicas_[0]->host_grads == grads_);
  const StepHooks& sh = plan.hooks;
  if (!plan.per_layer && sh.params_ready)
    TALLY_RETURN_IF_ERROR(sh.params_ready(0, num_params_));
  // Phase 1: compute; GPUs with a collective also reduce here.
  TALLY_RETURN_IF_ERROR(threads_->Run(
      [&](int r) { return RunReplica(r, plan); }, options_.step_timeout));
  StepStats total;
  for (int r = 0; r < plan.used; ++r) {
    total.loss_sum += replicas_[r]->stats.loss_sum;
    total.correct += replicas_[r]->stats.correct;
    total.samples += replicas_[r]->stats.samples;
  }
  if (!plan.per_layer && sh.loss_known)
    TALLY_RETURN_IF_ERROR(sh.loss_known(total));
  // Phase 2: thread r reduces slice r over the used replicas, then applies.
  TALLY_RETURN_IF_ERROR(
      threads_->Run([&](int r) { return ReduceSlice(r, plan, apply); },
                    options_.step_timeout));
  return total;
}

// Replica r's thread in phase 1. With a collective every replica takes
// part in the all-reduce (an unused or failed one with zero gradients, or
// the others hang).
absl::Status Engine::RunReplica(int r, const StepPlan& plan) {
  internal::Replica& rep = *replicas_[r];
  rep.used = r < plan.used;
  rep.stats = StepStats{};
  if (collective_ == nullptr)
    return rep.used ? ComputeReplica(rep, r, plan) : absl::OkStatus();
  Device* dev = rep.device.get();
  absl::Status s = rep.used ? ComputeReplica(rep, r, plan) : absl::OkStatus();
  if (!rep.used || !s.ok())
    dev->kernels().Fill(rep.model->grads(), num_params_, 0.0f);
  TALLY_RETURN_IF_ERROR(
      collective_->AllReduceSum(r, rep.model->grads(), num_params_));
  TALLY_RETURN_IF_ERROR(s);
  if (r == 0) {
    TALLY_RETURN_IF_ERROR(dev->CopyToHost(grads_, rep.model->grads(),
                                          num_params_ * sizeof(float)));
  }
  return absl::OkStatus();
}

// Broadcast, scatter, forward, loss and backward of replica r's part.
absl::Status Engine::ComputeReplica(internal::Replica& rep, int r,
                                    const StepPlan& plan) {
  const StepHooks& sh = plan.hooks;
  ReplicaHooks h;
  h.report = plan.per_layer && static_cast<bool>(sh.grads_ready);
  if (rep.device->host_accessible()) {
    TALLY_RETURN_IF_ERROR(HostHooks(rep, plan, h));
  } else {
    OffHostHooks(rep, plan, h);
  }
  const float* x;
  const int32_t* y;
  TALLY_RETURN_IF_ERROR(Stage(rep, plan.batch.x, plan.batch.y, plan.features,
                              plan.offsets[r], plan.sizes[r], &x, &y));
  TALLY_ASSIGN_OR_RETURN(Tensor logits,
                         rep.model->Forward(x, plan.sizes[r], true, plan.seed,
                                            plan.offsets[r], &h.hooks));
  TALLY_ASSIGN_OR_RETURN(LossStats ls,
                         rep.loss->Compute(logits, y, plan.grad_scale));
  if (options_.fault_hook) TALLY_RETURN_IF_ERROR(options_.fault_hook(r));
  if (plan.per_layer && sh.loss_known) {
    TALLY_RETURN_IF_ERROR(
        sh.loss_known(StepStats{ls.loss_sum, ls.correct, plan.sizes[r]}));
  }
  TALLY_RETURN_IF_ERROR(
      rep.model->Backward(rep.loss->dlogits(), nullptr, &h.hooks));
  if (h.first_end > 0) sh.grads_ready(0, h.first_end);
  rep.stats = {ls.loss_sum, ls.correct, plan.sizes[r]};
  return absl::OkStatus();
}

// In host memory: the weights are copied in whole; gradients are final as
// backward writes them.
absl::Status Engine::HostHooks(internal::Replica& rep, const StepPlan& plan,
                               ReplicaHooks& h) {
  const StepHooks& sh = plan.hooks;
  TALLY_RETURN_IF_ERROR(rep.device->CopyFromHost(rep.model->params(), params_,
                                                 num_params_ * sizeof(float)));
  if (plan.per_layer && sh.params_ready)
    h.hooks.before_forward = sh.params_ready;
  if (h.report) {
    h.hooks.after_backward = [&sh, &h](int64_t begin, int64_t end) {
      h.HandOn(sh, begin, end);
      return absl::OkStatus();
    };
  }
  return absl::OkStatus();
}

// Off the host: each layer's weights stream in before its forward pass and
// (without a collective) its gradient out after its backward pass, beside
// the compute; Backward's Synchronize waits for both.
void Engine::OffHostHooks(internal::Replica& rep, const StepPlan& plan,
                          ReplicaHooks& h) {
  const StepHooks& sh = plan.hooks;
  Device* dev = rep.device.get();
  const bool per_layer = plan.per_layer;
  h.hooks.before_forward = [this, &sh, &rep, dev, per_layer](
                               int64_t begin, int64_t end) -> absl::Status {
    if (per_layer && sh.params_ready)
      TALLY_RETURN_IF_ERROR(sh.params_ready(begin, end));
    return dev->CopyFromHostAsync(rep.model->params() + begin, params_ + begin,
                                  (end - begin) * sizeof(float));
  };
  if (rep.host_grads != nullptr) {
    h.hooks.after_backward = [&rep, dev, &h](int64_t begin,
                                             int64_t end) -> absl::Status {
      TALLY_RETURN_IF_ERROR(dev->CopyToHostAsync(
          rep.host_grads + begin, rep.model->grads() + begin,
          (end - begin) * sizeof(float)));
      if (!h.report) return absl::OkStatus();
      TALLY_ASSIGN_OR_RETURN(int mark, dev->MarkCopiesToHost());
      h.landing.push_back({mark, begin, end});
      return absl::OkStatus();
    };
  }
  if (!h.report) return;
  // The whole backward pass is enqueued: hand on each layer's gradient as
  // its copy lands, the last layer first, while the device still computes
  // the layers before it.
  h.hooks.backward_enqueued = [&sh, dev, &h]() -> absl::Status {
    for (const ReplicaHooks::Landing& l : h.landing) {
      if (l.begin == 0) {  // lands by Backward's Synchronize
        h.first_end = l.end;
        continue;
      }
      TALLY_RETURN_IF_ERROR(dev->WaitCopiesToHost(l.mark));
      h.HandOn(sh, l.begin, l.end);
    }
    return absl::OkStatus();
  };
}

// Phase 2, thread r: slice r of the gradient summed over the used replicas
// (without a collective), handed on, applied.
absl::Status Engine::ReduceSlice(int r, const StepPlan& plan,
                                 const SliceFn& apply) {
  const auto [begin, end] = Slice(num_params_, r, num_replicas());
  const int64_t n = end - begin;
  for (int s = 0; s < plan.used && collective_ == nullptr; ++s) {
    internal::Replica& rep = *replicas_[s];
    const float* g =
        rep.device->host_accessible() ? rep.model->grads() : rep.host_grads;
    if (g == grads_) continue;  // replica 0 already is the sum's base
    if (s == 0) {
      std::copy(g + begin, g + end, grads_ + begin);
    } else {
      AddInto(grads_ + begin, g + begin, n);
    }
  }
  if (!plan.per_layer && plan.hooks.grads_ready && end > begin)
    plan.hooks.grads_ready(begin, end);
  if (apply) apply(r, begin, end);
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Engine::Evaluate(const Dataset& data) {
  constexpr int kEvalBatch = 1000;
  const int64_t n = data.size();
  const int64_t feat = data.sample_numel();
  if (n == 0) return StepStats{};
  const int k = num_replicas();
  std::vector<StepStats> parts(k);
  TALLY_RETURN_IF_ERROR(threads_->Run(
      [&](int r) -> absl::Status {
        internal::Replica& rep = *replicas_[r];
        const auto [begin, end] = Slice(n, r, k);
        if (begin == end) return absl::OkStatus();
        TALLY_RETURN_IF_ERROR(rep.device->CopyFromHost(
            rep.model->params(), params_, num_params_ * sizeof(float)));
        for (int64_t s = begin; s < end; s += kEvalBatch) {
          const int b =
              static_cast<int>(std::min<int64_t>(kEvalBatch, end - s));
          const float* x;
          const int32_t* y;
          TALLY_RETURN_IF_ERROR(Stage(rep, data.features.data(),
                                      data.labels.data(), feat, s, b, &x, &y));
          TALLY_ASSIGN_OR_RETURN(Tensor logits,
                                 rep.model->Forward(x, b, false));
          TALLY_ASSIGN_OR_RETURN(LossStats ls, rep.loss->Evaluate(logits, y));
          parts[r].loss_sum += ls.loss_sum;
          parts[r].correct += ls.correct;
          parts[r].samples += b;
        }
        return absl::OkStatus();
      },
      options_.step_timeout));
  StepStats total;
  for (const StepStats& p : parts) {
    total.loss_sum += p.loss_sum;
    total.correct += p.correct;
    total.samples += p.samples;
  }
  return total;
}

}  // namespace tally
