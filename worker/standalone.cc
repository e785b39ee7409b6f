#include "worker/standalone.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/data/dataset.h"
#include "common/optim/optimizer.h"
#include "common/status_macros.h"
#include "worker/batch_loader.h"
#include "worker/engine.h"

namespace tally {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

absl::StatusOr<TrainSummary> TrainStandalone(const JobSpec& spec,
                                             const StandaloneOptions& options) {
  TALLY_ASSIGN_OR_RETURN(TrainTest data, OpenDataset(spec.dataset));
  if (data.train.sample_shape != spec.input_shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset samples are ", ShapeString(data.train.sample_shape),
        " but the spec was validated for ", ShapeString(spec.input_shape)));
  }
  EngineOptions engine_options;
  engine_options.devices = options.devices;
  engine_options.allow_tf32 = spec.training.tf32;
  TALLY_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(spec.layers, spec.input_shape, engine_options));
  const int64_t num_params = engine->num_params();
  const std::vector<float> init =
      InitParams(spec.layers, spec.layout, spec.training.seed);
  std::copy(init.begin(), init.end(), engine->params());

  // One optimizer per reduction slice: each device thread updates its slice
  // right after reducing it. The update rules are element-wise, so this is
  // the same as one optimizer over the whole vector.
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  for (int r = 0; r < engine->num_replicas(); ++r) {
    const auto [begin, end] =
        Engine::Slice(num_params, r, engine->num_replicas());
    TALLY_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt,
                           Optimizer::Create(spec.optimizer, end - begin));
    optimizers.push_back(std::move(opt));
  }
  float* params = engine->params();
  const float* grads = engine->grads();
  const Engine::SliceFn apply = [&](int slice, int64_t begin, int64_t) {
    optimizers[slice]->Step(params + begin, grads + begin);
  };

  LoaderOptions lo;
  lo.batch_size = spec.training.batch_size;
  lo.seed = spec.training.seed;
  lo.epochs = spec.training.epochs;
  lo.max_batches = spec.training.max_steps;
  BatchLoader loader(&data.train, lo);
  int64_t total_steps = loader.batches_per_epoch() * spec.training.epochs;
  if (spec.training.max_steps > 0) {
    total_steps = std::min(total_steps, spec.training.max_steps);
  }

  TrainSummary summary;
  double window_loss = 0.0;
  int64_t window_correct = 0, window_samples = 0;
  double last_loss = 0.0;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_report = start;
  int64_t samples_at_report = 0;
  int64_t step = 0;
  int64_t epoch = 0;

  auto report = [&] {
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
      r.samples_per_sec =
          dt > 0 ? (summary.samples - samples_at_report) / dt : 0.0;
      options.on_progress(r);
    }
    window_loss = 0.0;
    window_correct = 0;
    window_samples = 0;
    last_report = now;
    samples_at_report = summary.samples;
  };

  while (true) {
    auto next = loader.Next(absl::Minutes(1));
    if (absl::IsOutOfRange(next.status())) break;
    if (!next.ok()) return next.status();
    std::unique_ptr<HostBatch> batch = *std::move(next);
    if (batch->epoch != epoch) {
      report();  // end of the previous epoch
      epoch = batch->epoch;
    }
    BatchView view{batch->x.data(), batch->y.data(), batch->size};
    TALLY_ASSIGN_OR_RETURN(
        StepStats st, engine->Step(view, spec.training.seed + step, apply));
    loader.Recycle(std::move(batch));
    ++step;
    summary.samples += st.samples;
    window_loss += st.loss_sum;
    window_correct += st.correct;
    window_samples += st.samples;
    if ((step & 15) == 0 &&
        Seconds(last_report, Clock::now()) >= options.report_every_sec) {
      report();
    }
  }
  report();
  const Clock::time_point end = Clock::now();
  summary.steps = step;
  summary.reduction = engine->reduction();
  summary.train_seconds = Seconds(start, end);
  summary.samples_per_sec =
      summary.train_seconds > 0 ? summary.samples / summary.train_seconds : 0.0;
  summary.final_loss = last_loss;

  if (data.test.size() > 0) {
    TALLY_ASSIGN_OR_RETURN(StepStats ts, engine->Evaluate(data.test));
    summary.test_accuracy = static_cast<double>(ts.correct) / data.test.size();
    summary.test_loss = ts.loss_sum / data.test.size();
  }
  summary.params.assign(params, params + num_params);
  return summary;
}

}  // namespace tally
