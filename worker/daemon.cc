#include "worker/daemon.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "proto/attendance.h"
#include "proto/errors.h"
#include "proto/tally.grpc.pb.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"
#include "worker/job_runner.h"

namespace tally {

namespace {

// The lease as the daemon knows it.
struct Lease {
  std::string worker_id;
  int64_t incarnation = 0;
};

}  // namespace

class WorkerDaemon::Impl {
 public:
  explicit Impl(const DaemonOptions& o) : options_(o) {
    channel_ = Dial(o.server, o.transport);
    workers_ = v1::WorkerService::NewStub(channel_);
    attendance_ = std::make_unique<Attendance>(
        [this](grpc::ClientContext* ctx, const std::string& id,
               int64_t incarnation) {
          v1::AttendRequest req;
          req.set_worker_id(id);
          req.set_incarnation(incarnation);
          return workers_->Attend(ctx, req);
        },
        o.min_backoff, o.max_backoff);
  }

  ~Impl() {
    Stop();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    attendance_->Stop();
  }

  absl::Status Run() {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    while (!Stopped()) {
      if (std::optional<v1::InitialWeightsWanted> want = InitialWeightsAsked();
          want.has_value()) {
        OfferInitialWeights(*want);
        continue;
      }
      int64_t incarnation = 0;  // the registration the assignment came with
      std::optional<v1::Assignment> a =
          WaitForAssignment(absl::Milliseconds(500), &incarnation);
      if (!a.has_value()) continue;
      std::vector<int> ranks;
      for (const v1::Assignment::HeldRank& h : a->ranks())
        ranks.push_back(h.rank());
      Log(absl::StrCat("assigned ", a->job_id(), " as rank",
                       ranks.size() > 1 ? "s " : " ",
                       ranks.empty() ? absl::StrCat(a->rank())
                                     : absl::StrJoin(ranks, ", "),
                       " of ", a->world(), " (", a->shard_map().shards_size(),
                       " parameter shard",
                       a->shard_map().shards_size() == 1 ? "" : "s", ")"));
      absl::Status s = RunJob(*a);
      if (!s.ok()) Log(absl::StrCat(a->job_id(), ": ", s.ToString()));
      // Do not pick the same assignment up again until the coordinator
      // has moved on: re-issued it after a re-registration (the lease may
      // already be a newer one than this job ran under), or placed the job
      // on other shards (a new shard map, which the job goes on with).
      absl::MutexLock lock(&mu_);
      finished_job_ = a->job_id();
      finished_incarnation_ = incarnation;
      finished_map_ = a->shard_map().version();
    }
    absl::MutexLock lock(&mu_);
    return fatal_;
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
    req.set_python(options_.python_runtime);
    // What this build understands (proto/tally.proto, WorkerProtocol): the
    // coordinator gives jobs only to workers that can follow them.
    req.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    v1::RegisterWorkerResponse resp;
    auto ctx = Context(options_.register_timeout);
    TALLY_RETURN_IF_ERROR(
        FromGrpc(workers_->RegisterWorker(ctx.get(), req, &resp)));
    absl::MutexLock lock(&mu_);
    lease_.worker_id = resp.worker_id();
    lease_.incarnation = resp.incarnation();
    // Held open while this registration lives: a killed worker's lease
    // ends with its connection.
    attendance_->Registered(lease_.worker_id, lease_.incarnation);
    lease_ms_ = std::max<int64_t>(resp.lease_ms(), 200);
    assignment_.reset();
    return absl::OkStatus();
  }

  // A registration refused for good stops the daemon, saying why (Run()
  // returns it); every other failure is retried.
  bool RefusedForGood(const absl::Status& s) {
    absl::Status fatal;
    if (absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s)) {
      // A wrong or missing token does not fix itself.
      fatal = absl::PermissionDeniedError(absl::StrCat(
          options_.server, " refuses this worker: ", s.message(),
          " (give --token_file a token with the worker role)"));
    } else if (ReasonOf(s) == v1::PROTOCOL_TOO_OLD) {
      // Nor does a coordinator that needs a newer worker than this one.
      fatal = WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              options_.server, " refuses this worker (protocol ",
              static_cast<int>(v1::WORKER_PROTOCOL_CURRENT), "): ",
              s.message())),
          v1::PROTOCOL_TOO_OLD);
    } else {
      return false;
    }
    absl::MutexLock lock(&mu_);
    fatal_ = std::move(fatal);
    stop_ = true;
    return true;
  }

  void HeartbeatLoop() {
    absl::Duration backoff = options_.min_backoff;
    bool registered = false;
    while (!Stopped()) {
      if (!registered) {
        absl::Status s = Register();
        if (s.ok()) {
          registered = true;
          backoff = options_.min_backoff;
          absl::MutexLock lock(&mu_);
          Log(absl::StrCat("registered with ", options_.server, " as ",
                           lease_.worker_id, " (incarnation ",
                           lease_.incarnation, ")"));
        } else if (RefusedForGood(s)) {
          return;
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
        if (assignment_.has_value()) {
          req.set_job_id(assignment_->job_id());
          req.set_held(assignment_->key());
          if (progress_.job_id == assignment_->job_id()) {
            req.set_compute_seconds(progress_.compute_seconds);
            req.set_wait_seconds(progress_.wait_seconds);
            req.set_loader_seconds(progress_.loader_seconds);
            req.set_push_seconds(progress_.push_seconds);
          }
        }
        lease_ms = lease_ms_;
      }
      v1::HeartbeatResponse resp;
      auto ctx =
          Context(absl::Milliseconds(std::max<int64_t>(lease_ms / 2, 200)));
      absl::Status s = FromGrpc(workers_->Heartbeat(ctx.get(), req, &resp));
      if (s.ok()) {
        Apply(resp);
      } else if (ReasonOf(s) == v1::REGISTER_AGAIN || absl::IsNotFound(s)) {
        Log(absl::StrCat("lease lost (", s.message(), "); registering again"));
        registered = false;
        continue;
      } else {
        Log(absl::StrCat("heartbeat failed: ", s.message()));
      }
      // A quarter lease, and at least once a second: an assignment or a
      // new shard map reaches the worker within a second.
      SleepUnlessStopped(
          absl::Milliseconds(std::clamp<int64_t>(lease_ms / 4, 50, 1000)));
    }
  }

  // What a heartbeat's answer says to do: the assignment (none: idle), and
  // whether to build a job's initial weights.
  void Apply(const v1::HeartbeatResponse& resp) {
    absl::MutexLock lock(&mu_);
    if (resp.unchanged()) {
      // The assignment it holds stands.
    } else if (resp.has_assignment()) {
      assignment_ = resp.assignment();
    } else {
      assignment_.reset();
    }
    if (resp.has_initial_weights()) {
      initial_weights_ = resp.initial_weights();
    } else {
      initial_weights_.reset();
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
                         lease_.incarnation == finished_incarnation_ &&
                         assignment_->shard_map().version() == finished_map_));
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) || stop_) {
      return std::nullopt;
    }
    *incarnation = lease_.incarnation;
    return assignment_;
  }

  // The coordinator's latest ask for a job's initial weights, unless this
  // registration offered them already.
  std::optional<v1::InitialWeightsWanted> InitialWeightsAsked() {
    absl::MutexLock lock(&mu_);
    if (!initial_weights_.has_value() ||
        (initial_weights_->job_id() == offered_job_ &&
         lease_.incarnation == offered_incarnation_)) {
      return std::nullopt;
    }
    return initial_weights_;
  }

  // A Python model's initial weights: the module built with the job's seed
  // on this worker's devices, its parameters sent to the coordinator. A
  // model that cannot be built fails the job, with why; so does an offer
  // that the coordinator could not take kMaxOffers times.
  void OfferInitialWeights(const v1::InitialWeightsWanted& want) {
    static constexpr int kMaxOffers = 3;
    const Lease lease = CurrentLease();
    if (want.job_id() != offers_job_) offers_ = 0;  // a new ask
    offers_job_ = want.job_id();
    absl::StatusOr<bool> taken = BuildAndOffer(want, lease);
    const v1::ErrorReason reason = ReasonOf(taken.status());
    // No longer this worker's to give (another was asked, the job or the
    // lease went, the weights came already): nothing to say; the
    // coordinator asks whom it needs.
    if (!taken.ok() &&
        (reason == v1::NOT_A_MEMBER || reason == v1::REGISTER_AGAIN ||
         reason == v1::JOB_ENDED || reason == v1::WEIGHTS_GIVEN ||
         absl::IsNotFound(taken.status()))) {
      offers_ = 0;
      MarkOffered(want.job_id(), lease);
      return;
    }
    // The coordinator is reading other offers: again after a backoff, not
    // counted (the job's initial_weights_timeout bounds the waiting).
    if (reason == v1::OFFER_BUSY) {
      Log(absl::StrCat(want.job_id(), ": offering initial weights: ",
                       taken.status().message(), "; trying again"));
      SleepUnlessStopped(options_.max_backoff);
      return;
    }
    const bool transient = !taken.ok() &&
                           (absl::IsUnavailable(taken.status()) ||
                            absl::IsDeadlineExceeded(taken.status()));
    if (transient && ++offers_ < kMaxOffers) {
      Log(absl::StrCat(want.job_id(), ": offering initial weights: ",
                       taken.status().message(), "; trying again"));
      SleepUnlessStopped(options_.max_backoff);
      return;
    }
    offers_ = 0;
    if (taken.ok()) {
      Log(absl::StrCat(want.job_id(), ": initial weights built and ",
                       *taken ? "installed" : "not needed (given already)"));
      MarkOffered(want.job_id(), lease);
      return;
    }
    Log(absl::StrCat(want.job_id(), ": cannot give the initial weights: ",
                     taken.status().message()));
    v1::ReportResultRequest req;
    req.set_worker_id(lease.worker_id);
    req.set_incarnation(lease.incarnation);
    req.set_job_id(want.job_id());
    req.set_ok(false);
    req.set_message(std::string(taken.status().message()));
    req.set_reason(ReasonOf(taken.status()));
    v1::ReportResultResponse resp;
    auto ctx = Context(options_.report_timeout);
    // Not said: the coordinator asks again, and the worker tries again.
    if (workers_->ReportResult(ctx.get(), req, &resp).ok())
      MarkOffered(want.job_id(), lease);
  }

  void MarkOffered(const std::string& job_id, const Lease& lease) {
    absl::MutexLock lock(&mu_);
    offered_job_ = job_id;
    offered_incarnation_ = lease.incarnation;
  }

  absl::StatusOr<bool> BuildAndOffer(const v1::InitialWeightsWanted& want,
                                     const Lease& lease) {
    TALLY_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(want.spec()));
    if (options_.python_engine == nullptr) {
      return absl::FailedPreconditionError(
          "this worker trains models of layers only");
    }
    EngineOptions eo;
    eo.devices = options_.devices;
    TALLY_ASSIGN_OR_RETURN(std::unique_ptr<ModelEngine> engine,
                           options_.python_engine(spec, eo));
    const int64_t n = engine->num_params();
    if (n != spec.layout.num_params) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has ", n, " parameters, the job ",
                       spec.layout.num_params));
    }
    v1::OfferInitialWeightsResponse resp;
    // The call's deadline grows with the model: 1 s more per 10 MB.
    auto ctx = Context(options_.rpc_timeout + absl::Seconds(n / 2500000));
    auto writer = workers_->OfferInitialWeights(ctx.get(), &resp);
    v1::InitialWeightsChunk msg;
    msg.set_job_id(want.job_id());
    msg.set_worker_id(lease.worker_id);
    msg.set_incarnation(lease.incarnation);
    for (int64_t off = 0; off < n; off += options_.chunk_elements) {
      const int64_t c = std::min(options_.chunk_elements, n - off);
      EncodeChunk(engine->params() + off, off, c, v1::FLOAT32,
                  msg.mutable_chunk());
      if (!writer->Write(msg)) break;  // the answer says why
      msg.clear_job_id();
      msg.clear_worker_id();
      msg.clear_incarnation();
    }
    writer->WritesDone();
    TALLY_RETURN_IF_ERROR(FromGrpc(writer->Finish()));
    return resp.taken();
  }

  // False once the job was taken from us (cancelled, lease lost), was
  // placed on other shards (a new map), or we stop.
  bool StillAssigned(const std::string& job_id, int64_t incarnation,
                     int64_t map_version) {
    absl::MutexLock lock(&mu_);
    return StillAssignedLocked(job_id, incarnation, map_version);
  }
  bool StillAssignedLocked(const std::string& job_id, int64_t incarnation,
                           int64_t map_version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !stop_ && assignment_.has_value() &&
           assignment_->job_id() == job_id &&
           lease_.incarnation == incarnation &&
           assignment_->shard_map().version() == map_version;
  }

  Lease CurrentLease() {
    absl::MutexLock lock(&mu_);
    return lease_;
  }

  // ---- a job ----

  // A file's identity as it is now (another file, or the same rewritten,
  // is read again); empty when it is not there.
  static std::string Stamp(const std::string& path) {
    if (path.find_first_of("*?[") != std::string::npos) {  // a glob's files
      absl::StatusOr<std::vector<std::string>> files = ExpandGlob(path);
      if (!files.ok()) return "";
      std::string all;
      for (const std::string& f : *files) absl::StrAppend(&all, f, "@", Stamp(f), ";");
      return all;
    }
    struct stat st;
    if (path.empty() || ::stat(path.c_str(), &st) != 0) return "";
    return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":",
                        st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
  }

  static std::string ClicksKey(const ClicksOptions& c) {
    return absl::StrCat(c.train_size, "|", c.test_size, "|", c.integer_features,
                        "|", c.categorical_features, "|", c.cardinality, "|",
                        absl::StrFormat("%.17g", c.zipf), "|", c.seed);
  }

  static std::string CriteoKey(const CriteoSpec& c) {
    return absl::StrCat(absl::StrFormat("%.17g", c.test_fraction), "|",
                        c.integer_features, "|", c.categorical_features, "|",
                        c.train_size);
  }

  // What a dataset read from a spec depends on: a spec with the same key
  // (and files not changed since) reads the same samples.
  static std::string DataKey(const JobSpec& spec) {
    const ArraysSpec& arr = spec.dataset.arrays;
    const CsvSpec& csv = spec.dataset.csv;
    const ImageFolderSpec& img = spec.dataset.images;
    std::string files;
    for (const std::string* p :
         {&arr.train.file, &arr.train.inputs, &arr.train.labels, &arr.test.file,
          &arr.test.inputs, &arr.test.labels, &csv.train, &csv.test, &img.train,
          &img.test}) {
      absl::StrAppend(&files, "|", *p, "@", Stamp(*p));
    }
    const TextSpec& text = spec.dataset.text;
    const CriteoSpec& criteo = spec.dataset.criteo;
    for (const std::vector<std::string>* list :
         {&text.train, &text.test, &criteo.train, &criteo.test}) {
      for (const std::string& p : *list) {
        absl::StrAppend(&files, "|", p, "@", Stamp(p));
      }
      absl::StrAppend(&files, "|");
    }
    absl::StrAppend(&files, text.vocab, "@", Stamp(text.vocab), "|",
                    text.seq_len, "|",
                    absl::StrFormat("%.17g", text.test_fraction), "|",
                    text.vocab_size, "|", text.train_size);
    absl::StrAppend(&files, "|", absl::StrJoin(img.shape, "x"), "|",
                    static_cast<int>(img.fit), "|", absl::StrJoin(img.mean, ","),
                    "|", absl::StrJoin(img.std, ","), "|", img.crop_padding,
                    "|", img.hflip, "|", img.skip_bad, "|", img.num_classes,
                    "|", img.train_size);
    return absl::StrCat(files, "|",
        spec.dataset.name, "|", spec.dataset.root, "|", spec.dataset.normalize,
        "|", spec.dataset.synthetic.train_size, "|",
        spec.dataset.synthetic.test_size, "|", spec.dataset.synthetic.features,
        "|", spec.dataset.synthetic.num_classes, "|",
        spec.dataset.synthetic.seed, "|", arr.train_size, "|", arr.num_classes,
        "|", absl::StrJoin(arr.shape, "x"), "|", csv.label, "|",
        absl::StrJoin(csv.features, ","), "|", csv.num_features, "|",
        csv.train_size, "|", csv.num_classes, "|", ClicksKey(spec.dataset.clicks), "|",
        CriteoKey(criteo));
  }

  // OpenDataset within the data roots. What a submitter's spec names must
  // fail the job, never the worker: an exception from a library (memory, a
  // filesystem error) becomes the job's failure too.
  absl::StatusOr<TrainTest> OpenDatasetGuarded(const DatasetSpec& dataset) {
    try {
      return OpenDataset(dataset, options_.data_roots);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          "the dataset does not fit in this worker's memory");
    } catch (const std::exception& e) {
      return absl::FailedPreconditionError(
          absl::StrCat("the dataset cannot be opened: ", e.what()));
    }
  }

  absl::StatusOr<const TrainTest*> Data(const JobSpec& spec) {
    absl::MutexLock lock(&data_mu_);  // a runner a rank (training.ranks)
    const bool first = std::exchange(first_data_of_job_, false);
    // Before DataKey, whose stamps stat the spec's paths and globs.
    TALLY_RETURN_IF_ERROR(CheckDataPaths(spec.dataset, options_.data_roots));
    const std::string key = DataKey(spec);
    if (data_key_ != key || data_ == nullptr) {
      // The last job's files, let go before the next's; but a rank's
      // runner started mid-job may find the files changed while the
      // job's other runners still read the old ones: those are kept until
      // the next job (RunJob).
      if (data_ != nullptr && !first) kept_.push_back(std::move(data_));
      data_.reset();
      TALLY_ASSIGN_OR_RETURN(TrainTest d, OpenDatasetGuarded(spec.dataset));
      data_ = std::make_unique<TrainTest>(std::move(d));
      data_key_ = key;
    }
    return data_.get();
  }

  absl::Status RunJob(const v1::Assignment& a) {
    {
      absl::MutexLock lock(&data_mu_);
      kept_.clear();  // the last job's runners have all ended
      first_data_of_job_ = true;
    }
    if (a.ranks().empty())
      return RunRank(a, CurrentLease(), nullptr);
    return RunRanks(a);
  }

  // Runs assignment `a` (one rank's) to its end. `held`: with
  // training.ranks, the rank it runs, as a member of its own, for as long
  // as the worker holds it; null: the worker's one rank, as itself.
  absl::Status RunRank(const v1::Assignment& a, const Lease& lease,
                       const v1::Assignment::HeldRank* held) {
    JobContext context;
    context.worker_id = lease.worker_id;
    context.incarnation = lease.incarnation;
    context.coordinator = options_.server;
    context.workers = workers_.get();
    context.data = [this](const JobSpec& spec) { return Data(spec); };
    std::optional<v1::Assignment::HeldRank> rank;
    if (held != nullptr) rank = *held;
    context.still_assigned = [this, job = a.job_id(), lease,
                              map = a.shard_map().version(), rank] {
      absl::MutexLock lock(&mu_);
      return StillAssignedLocked(job, lease.incarnation, map) &&
             (!rank.has_value() || RankView(*assignment_, *rank).has_value());
    };
    context.assignment = [this, job = a.job_id(), lease,
                          map = a.shard_map().version(), rank]()
        -> std::optional<v1::Assignment> {
      absl::MutexLock lock(&mu_);
      if (!StillAssignedLocked(job, lease.incarnation, map)) return std::nullopt;
      if (!rank.has_value()) return assignment_;
      return RankView(*assignment_, *rank);
    };
    context.sleep = [this](absl::Duration d) { SleepUnlessStopped(d); };
    context.log = [this](const std::string& line) { Log(line); };
    if (rank.has_value()) {
      context.member_id = rank->member();
      // The lowest rank held at the end reports (ranks move meanwhile); with
      // no assignment left, every runner does (a report on an ended job is
      // acknowledged and ignored).
      context.reports = [this, r = rank->rank()] {
        absl::MutexLock lock(&mu_);
        return !assignment_.has_value() || assignment_->ranks().empty() ||
               assignment_->ranks(0).rank() == r;
      };
      context.log = [this, r = rank->rank()](const std::string& line) {
        Log(absl::StrCat("rank ", r, ": ", line));
      };
    }
    if (!rank.has_value() || rank->rank() == a.rank()) {
      context.progress = [this](const JobProgress& p) {
        absl::MutexLock lock(&mu_);
        progress_ = p;
      };
    }
    JobRunner runner(a, options_, std::move(context));
    return runner.Run();
  }

  // A held rank's runner, once started: its member and join step (a rank
  // that comes back to this worker is a member of its own).
  static std::string RunnerKey(const v1::Assignment::HeldRank& h) {
    return absl::StrCat(h.member(), "@", h.rank(), "@", h.join_step());
  }

  // `a` as the runner of one held rank sees it (that rank and its join
  // step), while the worker holds it from that step; none otherwise.
  static std::optional<v1::Assignment> RankView(
      const v1::Assignment& a, const v1::Assignment::HeldRank& h) {
    for (const v1::Assignment::HeldRank& x : a.ranks()) {
      if (x.member() != h.member() || x.rank() != h.rank() ||
          x.join_step() != h.join_step())
        continue;
      v1::Assignment view = a;
      view.clear_ranks();
      view.set_rank(h.rank());
      view.set_join_step(h.join_step());
      return view;
    }
    return std::nullopt;
  }

  // training.ranks: a runner a held rank, each a member of its own (the
  // lowest reports the result). A rank given later (a lost worker's) gets
  // its runner then; one taken away (to a new worker) ends its own.
  // Returns once every runner has ended and no new rank came; the first
  // failure, if none finished the job.
  absl::Status RunRanks(const v1::Assignment& first) {
    const Lease lease = CurrentLease();
    struct Runner {
      std::thread thread;
      absl::Notification done;
      absl::Status result;
    };
    std::map<std::string, std::unique_ptr<Runner>> runners;  // RunnerKey
    while (true) {
      std::vector<std::pair<v1::Assignment, v1::Assignment::HeldRank>> start;
      {
        absl::MutexLock lock(&mu_);
        if (StillAssignedLocked(first.job_id(), lease.incarnation,
                                first.shard_map().version())) {
          for (const v1::Assignment::HeldRank& h : assignment_->ranks()) {
            if (runners.count(RunnerKey(h))) continue;
            start.emplace_back(*RankView(*assignment_, h), h);
          }
        }
      }
      for (auto& [a, h] : start) {
        auto r = std::make_unique<Runner>();
        Runner* raw = r.get();
        runners[RunnerKey(h)] = std::move(r);
        Log(absl::StrCat(first.job_id(), ": rank ", a.rank(), " of ",
                         a.world(), " from step ", a.join_step()));
        raw->thread = std::thread([this, raw, a = std::move(a), h, lease] {
          raw->result = RunRank(a, lease, &h);
          raw->done.Notify();
        });
      }
      bool all_done = start.empty();
      for (auto& [key, r] : runners)
        all_done = all_done && r->done.HasBeenNotified();
      if (all_done) break;
      SleepUnlessStopped(absl::Milliseconds(50));
      if (Stopped()) {  // the runners end within about a step
        for (auto& [key, r] : runners) r->done.WaitForNotification();
        break;
      }
    }
    for (auto& [key, r] : runners) r->thread.join();
    absl::Status result;
    for (auto& [key, r] : runners) {
      if (r->result.ok()) return absl::OkStatus();  // the job is done
      if (result.ok()) result = r->result;
    }
    return result;
  }

  DaemonOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::thread heartbeat_;
  std::unique_ptr<Attendance> attendance_;  // the registration's Attend call
  absl::Mutex data_mu_;
  // The last dataset, reused across jobs; those a job's later runners
  // replaced while its first ones still read them; whether the next Data()
  // is the job's first (it may let the last job's go).
  std::unique_ptr<TrainTest> data_ ABSL_GUARDED_BY(data_mu_);
  std::vector<std::unique_ptr<TrainTest>> kept_ ABSL_GUARDED_BY(data_mu_);
  bool first_data_of_job_ ABSL_GUARDED_BY(data_mu_) = true;
  std::string data_key_ ABSL_GUARDED_BY(data_mu_);

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);  // why the daemon stopped itself
  Lease lease_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ms_ ABSL_GUARDED_BY(mu_) = 3000;
  std::optional<v1::Assignment> assignment_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::InitialWeightsWanted> initial_weights_
      ABSL_GUARDED_BY(mu_);
  // The job whose initial weights this registration offered (once).
  std::string offered_job_ ABSL_GUARDED_BY(mu_);
  int64_t offered_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  // Failed offers in a row for offers_job_ (the Run thread's).
  int offers_ = 0;
  std::string offers_job_;
  JobProgress progress_ ABSL_GUARDED_BY(mu_);
  std::string finished_job_ ABSL_GUARDED_BY(mu_);
  int64_t finished_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_map_ ABSL_GUARDED_BY(mu_) = 0;
};

WorkerDaemon::WorkerDaemon(const DaemonOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
WorkerDaemon::~WorkerDaemon() = default;
absl::Status WorkerDaemon::Run() { return impl_->Run(); }
void WorkerDaemon::Stop() { impl_->Stop(); }

}  // namespace tally
