#include "worker/daemon.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "proto/tally.grpc.pb.h"
#include "proto/tensor_chunk.h"
#include "worker/batch_loader.h"
#include "worker/engine.h"

namespace tally {

namespace {

// The lease as the daemon knows it.
struct Lease {
  std::string worker_id;
  int64_t incarnation = 0;
};

// A job's data schedule: every rank runs the same number of steps per epoch
// (that of the largest shard); a rank with a smaller shard pushes an empty
// contribution for the steps it has no batch for.
struct Schedule {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
};

Schedule MakeSchedule(const JobSpec& spec, int64_t train_size, int world) {
  const int64_t largest_shard = (train_size + world - 1) / world;
  Schedule s;
  s.steps_per_epoch =
      std::max<int64_t>(1, (largest_shard + spec.training.batch_size - 1) /
                               spec.training.batch_size);
  s.total_steps = s.steps_per_epoch * spec.training.epochs;
  if (spec.training.max_steps > 0)
    s.total_steps = std::min(s.total_steps, spec.training.max_steps);
  return s;
}

// Runs one posted task at a time on a persistent thread, so that the pull of
// step t + 1 can be in flight while step t's gradient is pushed.
class Background {
 public:
  Background() : thread_([this] { Loop(); }) {}
  ~Background() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Post(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    task_ = std::move(task);
    busy_ = true;
  }
  // Waits (bounded) for the posted task; false on timeout.
  bool Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
    return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || task_ != nullptr;
        };
        while (
            !mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1))) {
        }
        if (stop_) return;
        task = std::move(task_);
        task_ = nullptr;
      }
      task();
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
  }

  absl::Mutex mu_;
  std::function<void()> task_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

class WorkerDaemon::Impl {
 public:
  explicit Impl(const DaemonOptions& o) : options_(o) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(8 * 1024 * 1024);
    // Reconnect quickly once the server is back.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    // Bulk tensor traffic: big frames, big window (see server/service.cc).
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 * 1024 * 1024);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 * 1024 * 1024);
    args.SetInt(GRPC_ARG_TCP_READ_CHUNK_SIZE, 1024 * 1024);
    args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1024 * 1024);
    args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 4 * 1024 * 1024);
    channel_ = grpc::CreateCustomChannel(
        o.server, grpc::InsecureChannelCredentials(), args);
    workers_ = v1::WorkerService::NewStub(channel_);
    params_ = v1::ParameterService::NewStub(channel_);
  }

  ~Impl() {
    Stop();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }

  absl::Status Run() {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    while (!Stopped()) {
      int64_t incarnation = 0;  // the registration the assignment came with
      std::optional<v1::Assignment> a =
          WaitForAssignment(absl::Milliseconds(500), &incarnation);
      if (!a.has_value()) continue;
      Log(absl::StrCat("assigned ", a->job_id(), " as rank ", a->rank(), " of ",
                       a->world()));
      absl::Status s = RunJob(*a);
      if (!s.ok()) Log(absl::StrCat(a->job_id(), ": ", s.ToString()));
      // Do not pick the same assignment up again until the coordinator
      // has moved on (or re-issued it after a re-registration: the lease
      // may already be a newer one than this job ran under).
      absl::MutexLock lock(&mu_);
      finished_job_ = a->job_id();
      finished_incarnation_ = incarnation;
    }
    return absl::OkStatus();
  }

 private:
  bool Stopped() {
    absl::MutexLock lock(&mu_);
    return stop_;
  }

  void Log(const std::string& line) {
    if (!options_.verbose) return;
    std::fprintf(stderr, "tally-worker[%s]: %s\n",
                 options_.name.empty() ? "" : options_.name.c_str(),
                 line.c_str());
  }

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return ctx;
  }

  // ---- lease ----

  absl::Status Register() {
    v1::RegisterWorkerRequest req;
    req.set_name(options_.name);
    req.set_devices(options_.devices_text);
    req.set_address(options_.address);
    v1::RegisterWorkerResponse resp;
    auto ctx = Context(absl::Seconds(5));
    TALLY_RETURN_IF_ERROR(
        FromGrpc(workers_->RegisterWorker(ctx.get(), req, &resp)));
    absl::MutexLock lock(&mu_);
    lease_.worker_id = resp.worker_id();
    lease_.incarnation = resp.incarnation();
    lease_ms_ = std::max<int64_t>(resp.lease_ms(), 200);
    assignment_.reset();
    return absl::OkStatus();
  }

  void HeartbeatLoop() {
    absl::Duration backoff = absl::Milliseconds(100);
    bool registered = false;
    while (!Stopped()) {
      if (!registered) {
        absl::Status s = Register();
        if (s.ok()) {
          registered = true;
          backoff = absl::Milliseconds(100);
          absl::MutexLock lock(&mu_);
          Log(absl::StrCat("registered with ", options_.server, " as ",
                           lease_.worker_id, " (incarnation ",
                           lease_.incarnation, ")"));
        } else {
          Log(absl::StrCat("cannot register with ", options_.server, ": ",
                           s.message(), "; retrying in ",
                           absl::FormatDuration(backoff)));
          SleepUnlessStopped(backoff);
          backoff = std::min(backoff * 2, options_.max_backoff);
          continue;
        }
      }
      v1::HeartbeatRequest req;
      int64_t lease_ms;
      {
        absl::MutexLock lock(&mu_);
        req.set_worker_id(lease_.worker_id);
        req.set_incarnation(lease_.incarnation);
        if (assignment_.has_value()) req.set_job_id(assignment_->job_id());
        lease_ms = lease_ms_;
      }
      v1::HeartbeatResponse resp;
      auto ctx =
          Context(absl::Milliseconds(std::max<int64_t>(lease_ms / 2, 200)));
      absl::Status s = FromGrpc(workers_->Heartbeat(ctx.get(), req, &resp));
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        if (resp.has_assignment()) {
          assignment_ = resp.assignment();
        } else {
          assignment_.reset();
        }
      } else if (absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) {
        Log(absl::StrCat("lease lost (", s.message(), "); registering again"));
        registered = false;
        continue;
      } else {
        Log(absl::StrCat("heartbeat failed: ", s.message()));
      }
      SleepUnlessStopped(
          absl::Milliseconds(std::max<int64_t>(lease_ms / 4, 50)));
    }
  }

  void SleepUnlessStopped(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    auto stopped = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopped), d);
  }

  std::optional<v1::Assignment> WaitForAssignment(absl::Duration timeout,
                                                  int64_t* incarnation) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (assignment_.has_value() &&
                       !(assignment_->job_id() == finished_job_ &&
                         lease_.incarnation == finished_incarnation_));
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) || stop_) {
      return std::nullopt;
    }
    *incarnation = lease_.incarnation;
    return assignment_;
  }

  // False once the job was taken from us (cancelled, lease lost) or we stop.
  bool StillAssigned(const std::string& job_id, int64_t incarnation) {
    absl::MutexLock lock(&mu_);
    return !stop_ && assignment_.has_value() &&
           assignment_->job_id() == job_id && lease_.incarnation == incarnation;
  }

  Lease CurrentLease() {
    absl::MutexLock lock(&mu_);
    return lease_;
  }

  // ---- parameters ----

  // Pulls version >= min_version into `params`; returns its version.
  absl::StatusOr<int64_t> Pull(grpc::ClientContext* ctx,
                               const std::string& job_id, const Lease& lease,
                               int64_t min_version, const Schedule& sched,
                               v1::DType dtype, float* params,
                               int64_t num_params) {
    v1::PullRequest req;
    req.set_job_id(job_id);
    req.set_worker_id(lease.worker_id);
    req.set_incarnation(lease.incarnation);
    req.set_min_version(min_version);
    req.set_max_wait_ms(5000);
    req.set_total_steps(sched.total_steps);
    req.set_steps_per_epoch(sched.steps_per_epoch);
    req.set_dtype(dtype);
    auto reader = params_->PullWeights(ctx, req);
    v1::PullResponse resp;
    int64_t version = -1, received = 0;
    while (reader->Read(&resp)) {
      const v1::TensorChunk& c = resp.chunk();
      if (absl::Status bad = CheckChunk(c, num_params); !bad.ok()) {
        ctx->TryCancel();
        reader->Finish();
        return absl::DataLossError(absl::StrCat(
            "malformed weights chunk from the server: ", bad.message()));
      }
      DecodeChunk(c, params);
      received += c.count();
      version = resp.version();
    }
    TALLY_RETURN_IF_ERROR(FromGrpc(reader->Finish()));
    if (received != num_params) {
      return absl::DataLossError(
          absl::StrCat("pulled ", received, " of ", num_params, " weights"));
    }
    return version;
  }

  absl::Status Push(const std::string& job_id, const Lease& lease, int64_t step,
                    const StepStats& st, v1::DType dtype, const float* grads,
                    int64_t num_params) {
    auto ctx = Context(options_.rpc_timeout);
    v1::PushResponse resp;
    auto writer = params_->PushGradients(ctx.get(), &resp);
    v1::PushRequest msg;
    v1::PushHeader* h = msg.mutable_header();
    h->set_job_id(job_id);
    h->set_worker_id(lease.worker_id);
    h->set_incarnation(lease.incarnation);
    h->set_step(step);
    h->set_base_version(step);
    h->set_samples(st.samples);
    h->set_loss_sum(st.loss_sum);
    h->set_correct(st.correct);
    bool ok = true;
    if (st.samples == 0) {
      ok = writer->Write(msg);
    } else {
      for (int64_t off = 0; off < num_params && ok;
           off += options_.chunk_elements) {
        const int64_t n = std::min(options_.chunk_elements, num_params - off);
        EncodeChunk(grads + off, off, n, dtype, msg.mutable_chunk());
        ok = writer->Write(msg);
        msg.clear_header();
      }
    }
    if (ok) writer->WritesDone();
    return FromGrpc(writer->Finish());
  }

  absl::Status ReportResult(const std::string& job_id, const Lease& lease,
                            bool ok, const std::string& message,
                            const StepStats& test, int64_t steps) {
    v1::ReportResultRequest req;
    req.set_worker_id(lease.worker_id);
    req.set_incarnation(lease.incarnation);
    req.set_job_id(job_id);
    req.set_ok(ok);
    req.set_message(message);
    if (test.samples > 0) {
      req.set_test_accuracy(static_cast<double>(test.correct) / test.samples);
      req.set_test_loss(test.loss_sum / test.samples);
    }
    req.set_steps(steps);
    v1::ReportResultResponse resp;
    auto ctx = Context(absl::Seconds(10));
    return FromGrpc(workers_->ReportResult(ctx.get(), req, &resp));
  }

  // ---- a job ----

  absl::StatusOr<const TrainTest*> Data(const JobSpec& spec) {
    const std::string key = absl::StrCat(
        spec.dataset.name, "|", spec.dataset.root, "|", spec.dataset.normalize,
        "|", spec.dataset.synthetic.train_size, "|",
        spec.dataset.synthetic.test_size, "|", spec.dataset.synthetic.features,
        "|", spec.dataset.synthetic.num_classes, "|",
        spec.dataset.synthetic.seed);
    if (data_key_ != key || data_ == nullptr) {
      TALLY_ASSIGN_OR_RETURN(TrainTest d, OpenDataset(spec.dataset));
      data_ = std::make_unique<TrainTest>(std::move(d));
      data_key_ = key;
    }
    return data_.get();
  }

  absl::Status RunJob(const v1::Assignment& a) {
    const Lease lease = CurrentLease();
    auto fail = [&](const absl::Status& s) {
      // Report what keeps this worker from running the job, then give up.
      ReportResult(a.job_id(), lease, false, std::string(s.message()), {}, 0)
          .IgnoreError();
      return s;
    };
    auto spec = ParseJobSpec(a.spec());
    if (!spec.ok()) return fail(spec.status());
    auto data = Data(*spec);
    if (!data.ok()) return fail(data.status());
    const TrainTest& tt = **data;
    EngineOptions eo;
    eo.devices = options_.devices;
    eo.allow_tf32 = spec->training.tf32;
    auto engine = Engine::Create(spec->layers, spec->input_shape, eo);
    if (!engine.ok()) return fail(engine.status());
    Engine& e = **engine;
    if (e.num_replicas() > 1) {
      Log(absl::StrCat(
          a.job_id(), ": ", e.num_replicas(),
          " replicas, gradients reduced by ", e.reduction(),
          e.reduction_note().empty() ? "" : " (NCCL: ", e.reduction_note(),
          e.reduction_note().empty() ? "" : ")"));
    }
    const int world = std::max(1, a.world());
    const Schedule sched = MakeSchedule(*spec, tt.train.size(), world);
    const int64_t n = e.num_params();
    const v1::DType wire = spec->training.wire_dtype == WireDtype::kBfloat16
                               ? v1::BFLOAT16
                               : v1::FLOAT32;
    const int64_t train_size = tt.train.size();
    const int64_t rank_samples =
        train_size / world + (a.rank() < train_size % world ? 1 : 0);
    const int64_t rank_batches =
        (rank_samples + spec->training.batch_size - 1) /
        spec->training.batch_size;

    std::unique_ptr<BatchLoader> loader;
    int64_t loader_next = -1;  // global step the loader's next batch is for
    int64_t next = 0;
    absl::Duration backoff = absl::Milliseconds(100);
    absl::Time last_log = absl::Now();
    int64_t version = 0;
    // The pull of the next version is posted before the push of the current
    // step, so it is already waiting on the server when the step closes.
    // Declared before the thread that uses them, so that on any return the
    // thread is joined (after the cleanup below cancels its pull) first.
    std::unique_ptr<grpc::ClientContext> pull_ctx;
    absl::StatusOr<int64_t> prefetched = absl::UnknownError("none");
    bool have_prefetch = false;
    Background puller;
    auto post_pull = [&](int64_t min_version) {
      pull_ctx = Context(absl::Seconds(5) + options_.rpc_timeout);
      grpc::ClientContext* ctx = pull_ctx.get();
      puller.Post([this, ctx, &a, &lease, min_version, &sched, wire, &e, n,
                   &prefetched] {
        prefetched = Pull(ctx, a.job_id(), lease, min_version, sched, wire,
                          e.params(), n);
      });
      have_prefetch = true;
    };
    auto finish_pull = [&]() -> absl::StatusOr<int64_t> {
      have_prefetch = false;
      if (!puller.Wait(options_.rpc_timeout + absl::Seconds(10))) {
        pull_ctx->TryCancel();
        puller.Wait(absl::Minutes(1));
        return absl::DeadlineExceededError("pull did not finish");
      }
      return prefetched;
    };
    auto cancel_pull = [&] {
      if (!have_prefetch) return;
      pull_ctx->TryCancel();
      puller.Wait(absl::Minutes(1));
      have_prefetch = false;
    };
    absl::Cleanup no_pull_left = [&] { cancel_pull(); };
    while (true) {
      if (!StillAssigned(a.job_id(), lease.incarnation)) {
        cancel_pull();
        return absl::AbortedError("no longer assigned to this job");
      }
      if (!have_prefetch) post_pull(next);
      absl::StatusOr<int64_t> pulled = finish_pull();
      if (pulled.ok() && *pulled < next) {
        post_pull(next);  // a prefetch for an earlier version: ask again
        pulled = finish_pull();
      }
      if (!pulled.ok()) {
        const absl::Status& s = pulled.status();
        if (absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) {
          SleepUnlessStopped(backoff);
          backoff = std::min(backoff * 2, options_.max_backoff);
          continue;  // others are slow, or the server is away: try again
        }
        if (absl::IsCancelled(s)) return absl::AbortedError("the job ended");
        return s;  // not a member any more, unknown job, ...: back to idle
      }
      backoff = absl::Milliseconds(100);
      version = *pulled;
      if (version >= sched.total_steps) break;
      const int64_t step = version;
      const int64_t epoch = step / sched.steps_per_epoch;
      const int64_t index = step % sched.steps_per_epoch;
      StepStats st;
      if (index < rank_batches) {
        if (loader == nullptr || loader_next != step) {
          // First step, or a jump (rejoining, a skipped step): restart the
          // loader at this step's batch.
          LoaderOptions lo;
          lo.batch_size = spec->training.batch_size;
          lo.seed = spec->training.seed;
          lo.rank = a.rank();
          lo.world = world;
          lo.first_epoch = epoch;
          lo.first_batch = index;
          lo.epochs = spec->training.epochs - epoch;
          loader.reset();
          loader = std::make_unique<BatchLoader>(&tt.train, lo);
        }
        auto b = loader->Next(absl::Minutes(1));
        if (!b.ok()) return b.status();
        std::unique_ptr<HostBatch> batch = *std::move(b);
        BatchView view{batch->x.data(), batch->y.data(), batch->size};
        auto r = e.Step(view, spec->training.seed + step);
        loader->Recycle(std::move(batch));
        if (!r.ok()) return fail(r.status());
        st = *r;
        loader_next = index + 1 < rank_batches
                          ? step + 1
                          : (epoch + 1) * sched.steps_per_epoch;
      }
      // The weights were consumed by the step: the next pull may land.
      post_pull(step + 1);
      absl::Status s = Push(a.job_id(), lease, step, st, wire, e.grads(), n);
      if (s.ok() || absl::IsAborted(s) || absl::IsInvalidArgument(s) ||
          (absl::IsFailedPrecondition(s) &&
           absl::StrContains(s.message(), "joins at"))) {
        if (!s.ok()) Log(absl::StrCat("step ", step, ": ", s.message()));
        next = step + 1;
      } else if (absl::IsOutOfRange(s)) {
        cancel_pull();
        next = sched.total_steps;
      } else if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
        Log(absl::StrCat("step ", step, ": push failed (", s.message(),
                         "); retrying"));
        cancel_pull();
        SleepUnlessStopped(backoff);
        next = step;  // pull again; a closed step will move us on
      } else {
        cancel_pull();
        return s;
      }
      if (absl::Now() - last_log > absl::Seconds(5)) {
        last_log = absl::Now();
        Log(absl::StrFormat("%s step %d/%d loss %.4f", a.job_id(), step + 1,
                            sched.total_steps,
                            st.samples > 0 ? st.loss_sum / st.samples : 0.0));
      }
    }
    auto test = e.Evaluate(tt.test);
    if (!test.ok()) return fail(test.status());
    Log(absl::StrFormat(
        "%s finished at step %d: test accuracy %.4f", a.job_id(), version,
        test->samples > 0 ? static_cast<double>(test->correct) / test->samples
                          : 0.0));
    return ReportResult(a.job_id(), lease, true, "", *test, version);
  }

  DaemonOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::ParameterService::Stub> params_;
  std::thread heartbeat_;
  std::unique_ptr<TrainTest> data_;  // the last dataset, reused across jobs
  std::string data_key_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Lease lease_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ms_ ABSL_GUARDED_BY(mu_) = 3000;
  std::optional<v1::Assignment> assignment_ ABSL_GUARDED_BY(mu_);
  std::string finished_job_ ABSL_GUARDED_BY(mu_);
  int64_t finished_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
};

WorkerDaemon::WorkerDaemon(const DaemonOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
WorkerDaemon::~WorkerDaemon() = default;
absl::Status WorkerDaemon::Run() { return impl_->Run(); }
void WorkerDaemon::Stop() { impl_->Stop(); }

}  // namespace tally
