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

// The engine for the spec, with the spec's initial weights.
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(
    const JobSpec& spec, const StandaloneOptions& options) {
  EngineOptions engine_options;
  engine_options.devices = options.devices;
  engine_options.allow_tf32 = spec.training.tf32;
  TALLY_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(spec.layers, spec.input_shape, engine_options));
  const std::vector<float> init =
      InitParams(spec.layers, spec.layout, spec.training.seed);
  std::copy(init.begin(), init.end(), engine->params());
  return engine;
}

// One optimizer per reduction slice: each device thread updates its slice
// right after reducing it. The update rules are element-wise, so this is
// the same as one optimizer over the whole vector.
absl::StatusOr<std::vector<std::unique_ptr<Optimizer>>> SliceOptimizers(
    const JobSpec& spec, const Engine& engine) {
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  for (int r = 0; r < engine.num_replicas(); ++r) {
    const auto [begin, end] =
        Engine::Slice(engine.num_params(), r, engine.num_replicas());
    TALLY_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt,
                           Optimizer::Create(spec.optimizer, end - begin));
    optimizers.push_back(std::move(opt));
  }
  return optimizers;
}

// The training figures since the last report, and the reports.
class Progress {
 public:
  Progress(const JobSpec& spec, const StandaloneOptions& options,
           int64_t total_steps)
      : spec_(spec), options_(options), total_steps_(total_steps) {}

  void Add(const StepStats& st) {
    ++steps_;
    samples_ += st.samples;
    window_loss_ += st.loss_sum;
    window_correct_ += st.correct;
    window_samples_ += st.samples;
  }
  // A report every report_every_sec (looked at every 16 steps).
  void MaybeReport(int64_t epoch) {
    if ((steps_ & 15) == 0 &&
        Seconds(last_report_, Clock::now()) >= options_.report_every_sec) {
      Report(epoch);
    }
  }
  void Report(int64_t epoch) {
    const Clock::time_point now = Clock::now();
    if (window_samples_ > 0) last_loss_ = window_loss_ / window_samples_;
    if (options_.on_progress) {
      ProgressReport r;
      r.epoch = epoch;
      r.epochs = spec_.training.epochs;
      r.step = steps_;
      r.total_steps = total_steps_;
      r.loss = last_loss_;
      r.accuracy = window_samples_ > 0
                       ? static_cast<double>(window_correct_) / window_samples_
                       : 0.0;
      const double dt = Seconds(last_report_, now);
      r.samples_per_sec = dt > 0 ? (samples_ - samples_at_report_) / dt : 0.0;
      options_.on_progress(r);
    }
    window_loss_ = 0.0;
    window_correct_ = 0;
    window_samples_ = 0;
    last_report_ = now;
    samples_at_report_ = samples_;
  }
  // The summary's training figures.
  void Summarize(TrainSummary& summary) const {
    summary.steps = steps_;
    summary.samples = samples_;
    summary.train_seconds = Seconds(start_, Clock::now());
    summary.samples_per_sec =
        summary.train_seconds > 0 ? samples_ / summary.train_seconds : 0.0;
    summary.final_loss = last_loss_;
  }

 private:
  const JobSpec& spec_;
  const StandaloneOptions& options_;
  const int64_t total_steps_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_report_ = start_;
  int64_t steps_ = 0, samples_ = 0, samples_at_report_ = 0;
  double window_loss_ = 0.0, last_loss_ = 0.0;
  int64_t window_correct_ = 0, window_samples_ = 0;
};

}  // namespace

absl::StatusOr<TrainSummary> TrainStandalone(const JobSpec& spec,
                                             const StandaloneOptions& options) {
  // The spec is the operator's own: any path it names is read.
  TALLY_ASSIGN_OR_RETURN(TrainTest data,
                         OpenDataset(spec.dataset, DataRoots::Any()));
  if (data.train.sample_shape != spec.input_shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset samples are ", ShapeString(data.train.sample_shape),
        " but the spec was validated for ", ShapeString(spec.input_shape)));
  }
  TALLY_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                         MakeEngine(spec, options));
  TALLY_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Optimizer>> optimizers,
                         SliceOptimizers(spec, *engine));
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
  lo.threads = spec.dataset.threads;
  BatchLoader loader(&data.train, lo);
  int64_t total_steps = loader.batches_per_epoch() * spec.training.epochs;
  if (spec.training.max_steps > 0) {
    total_steps = std::min(total_steps, spec.training.max_steps);
  }
  for (auto& opt : optimizers) opt->set_total_steps(total_steps);
  Progress progress(spec, options, total_steps);
  int64_t step = 0, epoch = 0;
  while (true) {
    auto next = loader.Next(options.batch_wait);
    if (absl::IsOutOfRange(next.status())) break;
    if (!next.ok()) return next.status();
    std::unique_ptr<HostBatch> batch = *std::move(next);
    if (batch->epoch != epoch) {
      progress.Report(epoch);  // end of the previous epoch
      epoch = batch->epoch;
    }
    BatchView view{batch->x.data(), batch->y.data(), batch->size,
                 batch->ids.empty() ? nullptr : batch->ids.data()};
    TALLY_ASSIGN_OR_RETURN(
        StepStats st, engine->Step(view, spec.training.seed + step, apply));
    loader.Recycle(std::move(batch));
    ++step;
    progress.Add(st);
    progress.MaybeReport(epoch);
  }
  progress.Report(epoch);
  TrainSummary summary;
  progress.Summarize(summary);
  summary.reduction = engine->reduction();
  if (data.test.size() > 0) {
    TALLY_ASSIGN_OR_RETURN(StepStats ts, engine->Evaluate(data.test));
    summary.test_accuracy = static_cast<double>(ts.correct) / data.test.size();
    summary.test_loss = ts.loss_sum / data.test.size();
  }
  summary.params.assign(params, params + engine->num_params());
  return summary;
}

}  // namespace tally
