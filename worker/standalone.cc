#include "worker/standalone.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"
#include "common/nn/loss.h"
#include "common/nn/sequential.h"
#include "common/optim/optimizer.h"
#include "common/status_macros.h"

namespace tally {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Evaluates `model` on all of `data` in eval mode.
absl::StatusOr<LossStats> Evaluate(Sequential& model, CrossEntropyLoss& loss,
                                   const Dataset& data) {
  constexpr int kEvalBatch = 1000;
  Device* device = model.device();
  const int64_t n = data.size();
  const int64_t feat = data.sample_numel();
  TALLY_ASSIGN_OR_RETURN(auto x, DeviceBuffer<float>::Create(device, kEvalBatch * feat));
  TALLY_ASSIGN_OR_RETURN(auto y, DeviceBuffer<int32_t>::Create(device, kEvalBatch));
  LossStats total;
  for (int64_t start = 0; start < n; start += kEvalBatch) {
    const int b = static_cast<int>(std::min<int64_t>(kEvalBatch, n - start));
    TALLY_RETURN_IF_ERROR(device->CopyFromHost(
        x.data(), data.features.data() + start * feat, b * feat * sizeof(float)));
    TALLY_RETURN_IF_ERROR(device->CopyFromHost(
        y.data(), data.labels.data() + start, b * sizeof(int32_t)));
    TALLY_ASSIGN_OR_RETURN(Tensor logits, model.Forward(x.data(), b, false));
    TALLY_ASSIGN_OR_RETURN(LossStats s, loss.Evaluate(logits, y.data()));
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
  }
  return total;
}

}  // namespace

absl::StatusOr<TrainSummary> TrainStandalone(const JobSpec& spec,
                                             const StandaloneOptions& options) {
  if (options.devices.size() != 1) {
    return absl::UnimplementedError(
        "standalone training drives one device in this version");
  }
  TALLY_ASSIGN_OR_RETURN(TrainTest data, OpenDataset(spec.dataset));
  if (data.train.sample_shape != spec.input_shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset samples are ", ShapeString(data.train.sample_shape),
        " but the spec was validated for ", ShapeString(spec.input_shape)));
  }
  TALLY_ASSIGN_OR_RETURN(std::unique_ptr<Device> device,
                         OpenDevice(options.devices[0]));
  TALLY_ASSIGN_OR_RETURN(
      std::unique_ptr<Sequential> model,
      Sequential::Create(spec.layers, spec.input_shape, device.get()));
  CrossEntropyLoss loss(device.get());
  const int64_t num_params = model->num_params();
  TALLY_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                         Optimizer::Create(spec.optimizer, num_params));

  // The master copy of the weights lives on the host; on a CPU device it is
  // the replica's own buffer, so a step copies nothing.
  std::vector<float> master = InitParams(spec.layers, spec.layout, spec.training.seed);
  std::vector<float> host_grads;
  const bool zero_copy = device->host_accessible();
  TALLY_RETURN_IF_ERROR(device->CopyFromHost(model->params(), master.data(),
                                             num_params * sizeof(float)));
  if (!zero_copy) host_grads.resize(num_params);

  const int64_t batch = spec.training.batch_size;
  const int64_t feat = data.train.sample_numel();
  const int64_t n = data.train.size();
  const int64_t steps_per_epoch = (n + batch - 1) / batch;
  int64_t total_steps = steps_per_epoch * spec.training.epochs;
  if (spec.training.max_steps > 0) {
    total_steps = std::min(total_steps, spec.training.max_steps);
  }

  std::vector<float> host_x(batch * feat);
  std::vector<int32_t> host_y(batch);
  TALLY_ASSIGN_OR_RETURN(auto dev_x, DeviceBuffer<float>::Create(device.get(), batch * feat));
  TALLY_ASSIGN_OR_RETURN(auto dev_y, DeviceBuffer<int32_t>::Create(device.get(), batch));

  TrainSummary summary;
  double window_loss = 0.0;
  int64_t window_correct = 0, window_samples = 0;
  double last_loss = 0.0;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_report = start;
  int64_t samples_at_report = 0;
  int64_t step = 0;

  auto report = [&](int64_t epoch) {
    const Clock::time_point now = Clock::now();
    if (window_samples > 0) last_loss = window_loss / window_samples;
    if (options.on_progress) {
      ProgressReport r;
      r.epoch = epoch;
      r.epochs = spec.training.epochs;
      r.step = step;
      r.total_steps = total_steps;
      r.loss = last_loss;
      r.accuracy = window_samples > 0
                       ? static_cast<double>(window_correct) / window_samples
                       : 0.0;
      const double dt = Seconds(last_report, now);
      r.samples_per_sec = dt > 0 ? (summary.samples - samples_at_report) / dt : 0.0;
      options.on_progress(r);
    }
    window_loss = 0.0;
    window_correct = 0;
    window_samples = 0;
    last_report = now;
    samples_at_report = summary.samples;
  };

  for (int64_t epoch = 0; epoch < spec.training.epochs && step < total_steps;
       ++epoch) {
    const std::vector<int64_t> order =
        EpochOrder(n, spec.training.seed, epoch);
    for (int64_t begin = 0; begin < n && step < total_steps; begin += batch) {
      const int b = static_cast<int>(std::min(batch, n - begin));
      std::span<const int64_t> idx(order.data() + begin, b);
      float* x = zero_copy ? dev_x.data() : host_x.data();
      int32_t* y = zero_copy ? dev_y.data() : host_y.data();
      data.train.Gather(idx, x, y);
      if (!zero_copy) {
        TALLY_RETURN_IF_ERROR(device->CopyFromHost(dev_x.data(), x, b * feat * sizeof(float)));
        TALLY_RETURN_IF_ERROR(device->CopyFromHost(dev_y.data(), y, b * sizeof(int32_t)));
      }
      TALLY_ASSIGN_OR_RETURN(
          Tensor logits,
          model->Forward(dev_x.data(), b, true, spec.training.seed + step));
      TALLY_ASSIGN_OR_RETURN(LossStats ls,
                             loss.Compute(logits, dev_y.data(), 1.0f / b));
      TALLY_RETURN_IF_ERROR(model->Backward(loss.dlogits()));
      if (zero_copy) {
        optimizer->Step(model->params(), model->grads());
      } else {
        TALLY_RETURN_IF_ERROR(device->CopyToHost(
            host_grads.data(), model->grads(), num_params * sizeof(float)));
        optimizer->Step(master.data(), host_grads.data());
        TALLY_RETURN_IF_ERROR(device->CopyFromHost(
            model->params(), master.data(), num_params * sizeof(float)));
      }
      ++step;
      summary.samples += b;
      window_loss += ls.loss_sum;
      window_correct += ls.correct;
      window_samples += b;
      if ((step & 15) == 0 &&
          Seconds(last_report, Clock::now()) >= options.report_every_sec) {
        report(epoch);
      }
    }
    report(epoch);
  }
  const Clock::time_point end = Clock::now();
  summary.steps = step;
  summary.train_seconds = Seconds(start, end);
  summary.samples_per_sec =
      summary.train_seconds > 0 ? summary.samples / summary.train_seconds : 0.0;
  summary.final_loss = last_loss;

  if (data.test.size() > 0) {
    TALLY_ASSIGN_OR_RETURN(LossStats ts, Evaluate(*model, loss, data.test));
    summary.test_accuracy = static_cast<double>(ts.correct) / data.test.size();
    summary.test_loss = ts.loss_sum / data.test.size();
  }
  summary.params.resize(num_params);
  TALLY_RETURN_IF_ERROR(device->CopyToHost(summary.params.data(), model->params(),
                                           num_params * sizeof(float)));
  return summary;
}

}  // namespace tally
