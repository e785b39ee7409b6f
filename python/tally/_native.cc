// tally._native: the Python worker's native core. The worker daemon, the job
// runner and the parameter client are Tally's C++ ones (worker/); Python
// brings the model alone. A job whose model is Python code gets a PyEngine:
// a ModelEngine whose steps call the Python engine object the factory made
// (python/tally/engine.py), on the flat float32 vectors that object owns,
// so pulls write into and pushes read from the module's own memory.
//
// The contract with Python is python/tally/engine_contract.py: the factory
// gets a Job (a dataclass, made here by JobOf) and returns an Engine (a
// typing.Protocol: the attributes and methods PyEngine uses).
//
//   w = _native.Worker(server=..., devices="cpu:2", factory=make_engine, ...)
//   w.start(); w.wait(0.2) ...; w.stop(); w.result()
//
// The GIL: the daemon's threads take it only inside the engine's calls into
// Python; start/wait/stop release it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/data/clicks.h"
#include "common/device.h"
#include "common/malloc_tuning.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/transport.h"
#include "proto/transport_flags.h"
#include "worker/daemon.h"
#include "worker/engine.h"

namespace py = pybind11;

namespace tally {
namespace {

// A Python error as a status: the exception and the end of its traceback,
// at most kMaxTraceback bytes, so a job's message stays readable.
constexpr size_t kMaxTraceback = 2000;

absl::Status FromPython(const std::exception& e, absl::string_view what) {
  std::string text = e.what();
  if (text.size() > kMaxTraceback) {
    text = absl::StrCat("...", text.substr(text.size() - kMaxTraceback));
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", text));
}

// A module that is not the job's (tally.errors.LayoutError): this worker
// cannot train the job, others may (SCHEDULE_MISMATCH bars it alone).
absl::Status FromBuild(py::error_already_set& e) {
  if (e.matches(py::module_::import("tally.errors").attr("LayoutError"))) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "the module built here is not the job's: ",
                          std::string(py::str(e.value())).substr(0, 1000))),
                      v1::SCHEDULE_MISMATCH);
  }
  return FromPython(e, "building the model");
}

// A view of `count` samples of `sample` shape at `data`: no copy. The
// capsule keeps nothing alive; the caller's memory outlives the call.
template <typename T>
py::array_t<T> View(const T* data, int64_t count, const Shape& sample) {
  std::vector<py::ssize_t> shape = {static_cast<py::ssize_t>(count)};
  for (int64_t d : sample) shape.push_back(static_cast<py::ssize_t>(d));
  py::capsule none(data, [](void*) {});
  return py::array_t<T>(shape, data, none);
}

// The job's tables as the Python engine reaches them (engine.py's
// ShardedEmbedding): pull(table, rows) -> float32 [n, dim], and
// push(samples, [(table, rows, grads)]), each blocking without the GIL.
// Detached (null) once the job runner is done with them.
class Rows {
 public:
  Rows(TableRows* rows, std::vector<int64_t> dims)
      : rows_(rows), dims_(std::move(dims)) {}
  void Detach() {
    absl::MutexLock lock(&mu_);
    rows_ = nullptr;
  }
  // The status of the last call that failed since the last Take, code and
  // reason kept (a Python exception carries only its text): the engine
  // returns it for the step, so that a shard away is retried as a pull
  // is, not taken for the model's error.
  absl::Status TakeError() {
    absl::MutexLock lock(&error_mu_);
    return std::exchange(error_, absl::OkStatus());
  }

  py::array_t<float> Pull(int table, py::array_t<int64_t, py::array::c_style |
                                                          py::array::forcecast>
                                         rows) {
    if (table < 0 || table >= static_cast<int>(dims_.size()))
      throw std::invalid_argument(absl::StrCat("no table ", table));
    const int64_t n = rows.size();
    py::array_t<float> out({static_cast<py::ssize_t>(n),
                            static_cast<py::ssize_t>(dims_[table])});
    const int64_t* r = rows.data();
    float* o = out.mutable_data();
    absl::Status s;
    {
      py::gil_scoped_release release;
      absl::ReaderMutexLock lock(&mu_);
      s = rows_ == nullptr ? absl::FailedPreconditionError("the job is over")
                           : rows_->Pull(table, r, n, o);
    }
    if (!s.ok()) Fail(s);
    return out;
  }

  // Rows of several tables in one message per shard: [(table, rows)] ->
  // [float32 [n, dim]].
  py::list PullTables(py::list asks) {
    using Ids = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
    std::vector<Ids> ids;
    std::vector<py::array_t<float>> outs;
    std::vector<TableRows::Rows> pulls;
    for (py::handle a : asks) {
      py::tuple t = py::reinterpret_borrow<py::tuple>(a);
      const int table = t[0].cast<int>();
      if (table < 0 || table >= static_cast<int>(dims_.size()))
        throw std::invalid_argument(absl::StrCat("no table ", table));
      ids.push_back(t[1].cast<Ids>());
      outs.emplace_back(std::vector<py::ssize_t>{
          static_cast<py::ssize_t>(ids.back().size()),
          static_cast<py::ssize_t>(dims_[table])});
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      pulls.push_back({py::reinterpret_borrow<py::tuple>(asks[i])[0].cast<int>(),
                       ids[i].data(), ids[i].size(), outs[i].mutable_data()});
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      absl::ReaderMutexLock lock(&mu_);
      s = rows_ == nullptr ? absl::FailedPreconditionError("the job is over")
                           : rows_->PullTables(pulls);
    }
    if (!s.ok()) Fail(s);
    py::list out;
    for (auto& o : outs) out.append(o);
    return out;
  }

  void Push(int64_t samples, py::list blocks) {
    using Ids = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
    using Values = py::array_t<float, py::array::c_style | py::array::forcecast>;
    std::vector<Ids> ids;
    std::vector<Values> values;
    std::vector<TableRows::Grads> grads;
    for (py::handle b : blocks) {
      py::tuple t = py::reinterpret_borrow<py::tuple>(b);
      const int table = t[0].cast<int>();
      if (table < 0 || table >= static_cast<int>(dims_.size()))
        throw std::invalid_argument(absl::StrCat("no table ", table));
      ids.push_back(t[1].cast<Ids>());
      values.push_back(t[2].cast<Values>());
      if (values.back().size() != ids.back().size() * dims_[table]) {
        throw std::invalid_argument(absl::StrCat(
            "table ", table, ": ", values.back().size(), " gradient values for ",
            ids.back().size(), " rows of ", dims_[table]));
      }
      grads.push_back({table, ids.back().data(), ids.back().size(),
                       values.back().data()});
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      absl::ReaderMutexLock lock(&mu_);
      s = rows_ == nullptr ? absl::FailedPreconditionError("the job is over")
                           : rows_->Push(samples, grads);
    }
    if (!s.ok()) Fail(s);
  }

 private:
  [[noreturn]] void Fail(const absl::Status& s) {
    {
      absl::MutexLock lock(&error_mu_);
      if (error_.ok()) error_ = s;
    }
    throw std::runtime_error(s.ToString());
  }
  absl::Mutex error_mu_;
  absl::Status error_ ABSL_GUARDED_BY(error_mu_);
  // Held across a call (shared: replicas pull at once), so Detach waits.
  absl::Mutex mu_;
  TableRows* rows_ ABSL_GUARDED_BY(mu_);
  const std::vector<int64_t> dims_;
};

// The memory of the engine's vector `name` (params or grads): float32
// [n], one writable piece. It stays where it is while the engine lives
// (tally.engine_contract.Engine), and PyEngine holds the engine.
float* HostVector(const py::object& engine, const char* name, int64_t n) {
  py::buffer_info b =
      engine.attr(name).cast<py::buffer>().request(/*writable=*/true);
  const bool f32 = b.itemsize == static_cast<py::ssize_t>(sizeof(float)) &&
                   (b.format == "f" || b.format == "<f" || b.format == "=f");
  if (!f32 || b.ndim != 1 || b.shape[0] != n ||
      b.strides[0] != static_cast<py::ssize_t>(sizeof(float))) {
    throw std::invalid_argument(absl::StrCat(
        "the engine's ", name, " is not one piece of float32[", n, "]"));
  }
  return static_cast<float*>(b.ptr);
}

class PyEngine : public ModelEngine {
 public:
  // `impl` is the Python engine (tally.engine_contract.Engine): num_params,
  // replicas, params, grads, step(x, y, seed), evaluate(x, y), buffers(),
  // load_buffers(bytes) and attach_rows(rows). Throws for an engine whose
  // vectors are not what the contract says.
  PyEngine(py::object impl, const JobSpec& spec)
      : impl_(std::move(impl)),
        input_shape_(spec.input_shape),
        label_shape_(spec.label_shape) {
    num_params_ = impl_.attr("num_params").cast<int64_t>();
    replicas_ = impl_.attr("replicas").cast<int>();
    params_ = HostVector(impl_, "params", num_params_);
    grads_ = HostVector(impl_, "grads", num_params_);
    for (const EmbeddingTableSpec& t : spec.embeddings) dims_.push_back(t.dim);
  }
  ~PyEngine() override {
    SetTableRows(nullptr);
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  void SetTableRows(TableRows* rows) override {
    if (dims_.empty()) return;
    py::gil_scoped_acquire gil;
    if (rows_ != nullptr) rows_->Detach();
    rows_ = rows == nullptr ? nullptr : std::make_shared<Rows>(rows, dims_);
    try {
      impl_.attr("attach_rows")(rows_ == nullptr ? py::none() : py::cast(rows_));
    } catch (const std::exception&) {
      // An engine without tables' support cannot have been built for them.
    }
  }

  int num_replicas() const override { return replicas_; }
  int64_t num_params() const override { return num_params_; }
  // Replicas' gradients are added in rank order by the Python engine.
  const char* reduction() const override { return "rank-order adds"; }
  const std::string& reduction_note() const override { return note_; }
  float* params() override { return params_; }
  const float* grads() const override { return grads_; }

  absl::StatusOr<StepStats> Step(const BatchView& batch, uint64_t seed,
                                 const SliceFn& apply,
                                 const StepHooks* hooks) override {
    if (hooks != nullptr && hooks->params_ready) {
      if (absl::Status s = hooks->params_ready(0, num_params_); !s.ok())
        return s;
    }
    if (hooks != nullptr && hooks->buffers != nullptr &&
        !hooks->buffers->empty()) {
      if (absl::Status s = LoadBuffers(*hooks->buffers); !s.ok()) return s;
    }
    StepStats stats;
    stats.samples = batch.size;
    {
      py::gil_scoped_acquire gil;
      try {
        if (rows_ != nullptr) rows_->TakeError().IgnoreError();
        py::tuple r = impl_.attr("step")(
            Inputs(batch.x, batch.ids, batch.size),
            View(batch.y, batch.size, label_shape_), seed);
        stats.loss_sum = r[0].cast<double>();
        stats.correct = r[1].cast<int64_t>();
      } catch (py::error_already_set& e) {
        // A row call that failed: its own status (a shard away is retried).
        if (rows_ != nullptr) {
          if (absl::Status rows = rows_->TakeError(); !rows.ok()) return rows;
        }
        // A ModelError names what is wrong (a bad id, a bad loss): its
        // message alone; anything else with its traceback.
        if (e.matches(py::module_::import("tally.errors").attr("ModelError"))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the model's step: ",
              std::string(py::str(e.value())).substr(0, kMaxTraceback)));
        }
        return FromPython(e, "the model's step");
      } catch (const std::exception& e) {  // a bad result
        return FromPython(e, "the model's step");
      }
    }
    if (hooks != nullptr && hooks->loss_known) {
      if (absl::Status s = hooks->loss_known(stats); !s.ok()) return s;
    }
    if (hooks != nullptr && hooks->grads_ready)
      hooks->grads_ready(0, num_params_);
    if (apply) apply(0, 0, num_params_);
    return stats;
  }

  absl::StatusOr<StepStats> Evaluate(const Dataset& data) override {
    StepStats stats;
    stats.samples = data.size();
    if (data.size() == 0) return stats;
    if (data.source != nullptr) return EvaluateGathered(data);
    py::gil_scoped_acquire gil;
    try {
      const int64_t* ids = data.ids.empty() ? nullptr : data.ids.data();
      py::tuple r = impl_.attr("evaluate")(
          Inputs(data.features.data(), ids, data.size()),
          View(data.labels.data(), data.size(), label_shape_));
      stats.loss_sum = r[0].cast<double>();
      stats.correct = r[1].cast<int64_t>();
      if (r.size() > 2) stats.auc = r[2].cast<double>();
    } catch (const std::exception& e) {
      return FromPython(e, "the model's evaluation");
    }
    return stats;
  }

  absl::StatusOr<std::string> Buffers() override {
    py::gil_scoped_acquire gil;
    try {
      return impl_.attr("buffers")().cast<std::string>();
    } catch (const std::exception& e) {
      return FromPython(e, "the model's buffers");
    }
  }

  absl::Status LoadBuffers(const std::string& bytes) override {
    py::gil_scoped_acquire gil;
    try {
      impl_.attr("load_buffers")(py::bytes(bytes));
    } catch (const std::exception& e) {
      return FromPython(e, "loading the model's buffers");
    }
    return absl::OkStatus();
  }

 private:
  // The inputs' view: int64 ids where the batch has them, else floats.
  py::array Inputs(const float* x, const int64_t* ids, int64_t count) const {
    if (ids != nullptr) return View(ids, count, input_shape_);
    return View(x, count, input_shape_);
  }

  // A test split that stays in its files (text, criteo): gathered and
  // evaluated kEvalPiece samples at a time, so its memory is one piece's
  // (and, for binary cross-entropy, every sample's score and label: the
  // AUC is the whole split's at once).
  absl::StatusOr<StepStats> EvaluateGathered(const Dataset& data) {
    // At most 1024 samples and 2^20 values a piece.
    const int64_t kEvalPiece = std::clamp<int64_t>(
        (int64_t{1} << 20) / (data.sample_numel() + data.label_numel()), 1, 1024);
    const bool ids = data.input_type == InputType::kInt64;
    std::vector<int64_t> index, id_rows;
    std::vector<float> x;
    std::vector<int32_t> y;
    std::vector<double> scores;
    std::vector<int> labels;
    StepStats stats;
    stats.samples = data.size();
    for (int64_t at = 0; at < data.size(); at += kEvalPiece) {
      const int64_t n = std::min(kEvalPiece, data.size() - at);
      index.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) index[i] = at + i;
      y.resize(static_cast<size_t>(n * data.label_numel()));
      const size_t values = static_cast<size_t>(n * data.sample_numel());
      if (ids) {
        id_rows.resize(values);
        TALLY_RETURN_IF_ERROR(data.GatherIds(index, id_rows.data(), y.data()));
      } else {
        x.resize(values);
        TALLY_RETURN_IF_ERROR(data.Gather(index, x.data(), y.data()));
      }
      py::gil_scoped_acquire gil;
      try {
        py::tuple r = impl_.attr("evaluate")(
            Inputs(x.data(), ids ? id_rows.data() : nullptr, n),
            View(y.data(), n, label_shape_), py::arg("scores_out") = true);
        stats.loss_sum += r[0].cast<double>();
        stats.correct += r[1].cast<int64_t>();
        if (r.size() > 2) {
          auto s = r[2].cast<py::array_t<double, py::array::c_style |
                                                     py::array::forcecast>>();
          if (s.size() != n) {
            return absl::InternalError(absl::StrCat(
                "the model's evaluation gave ", s.size(), " scores for ", n,
                " samples"));
          }
          scores.insert(scores.end(), s.data(), s.data() + n);
          labels.insert(labels.end(), y.begin(), y.begin() + n);
        }
      } catch (const std::exception& e) {
        return FromPython(e, "the model's evaluation");
      }
    }
    if (!scores.empty()) stats.auc = tally::Auc(scores, labels);
    return stats;
  }

  py::object impl_;
  Shape input_shape_;
  Shape label_shape_;  // per sample: empty, or text's [seq_len]
  int64_t num_params_ = 0;
  int replicas_ = 1;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::string note_;
  std::vector<int64_t> dims_;   // each table's dim
  std::shared_ptr<Rows> rows_;  // while the runner lends its tables
};

const char* TableIdsName(TableIds ids) {
  switch (ids) {
    case TableIds::kHashed:
      return "hashed";
    case TableIds::kDirect:
      return "direct";
    case TableIds::kDynamic:
      return "dynamic";
  }
  return "hashed";
}

// model.embeddings as tally.engine_contract.Table objects.
py::list TablesOf(const JobSpec& spec, const py::module_& contract) {
  py::list tables;
  for (const EmbeddingTableSpec& t : spec.embeddings) {
    tables.append(contract.attr("Table")(
        py::arg("name") = t.name, py::arg("dim") = t.dim,
        py::arg("num_embeddings") = t.num_embeddings,
        py::arg("ids") = TableIdsName(t.ids), py::arg("combiner") = t.combiner,
        py::arg("salt") = t.salt, py::arg("features") = t.features));
  }
  return tables;
}

// What the Python factory gets: a tally.engine_contract.Job, the one place
// where the parsed spec becomes Python values.
py::object JobOf(const JobSpec& spec, const EngineOptions& options) {
  py::module_ contract = py::module_::import("tally.engine_contract");
  py::list params;
  for (const ParamInfo& p : spec.layout.params) {
    params.append(py::make_tuple(
        p.name, std::vector<int64_t>(p.shape.begin(), p.shape.end())));
  }
  py::list buffers;
  for (const BufferInfo& b : spec.python.buffers) {
    buffers.append(py::make_tuple(
        b.name, b.dtype, std::vector<int64_t>(b.shape.begin(), b.shape.end())));
  }
  py::list devices;
  for (const DeviceId& d : options.devices) {
    devices.append(d.type == DeviceType::kCpu ? std::string("cpu")
                                              : absl::StrCat("cuda:", d.index));
  }
  return contract.attr("Job")(
      py::arg("name") = spec.name, py::arg("file") = spec.python.file,
      py::arg("build") = spec.python.build, py::arg("code") = spec.python.code,
      py::arg("files") = spec.python.files,
      py::arg("loss") = LossName(spec.loss),
      py::arg("seed") = spec.training.seed,
      py::arg("clip_grad_norm") = spec.optimizer.clip_grad_norm,
      py::arg("batch_size") = spec.training.batch_size,
      py::arg("input_shape") = std::vector<int64_t>(spec.input_shape.begin(),
                                                    spec.input_shape.end()),
      py::arg("num_classes") = spec.num_classes, py::arg("params") = params,
      py::arg("buffers") = buffers,
      py::arg("embeddings") = TablesOf(spec, contract),
      py::arg("devices") = devices);
}

// The daemon on its own thread, for Python to start, wait for and stop.
class Worker {
 public:
  Worker(const std::string& server, const std::string& devices,
         const std::string& name, const std::string& python_runtime,
         py::object factory, const std::string& tls_ca,
         const std::string& tls_cert, const std::string& tls_key,
         const std::string& token_file, bool verbose,
         const std::vector<std::string>& data_root)
      : factory_(std::move(factory)) {
    // As tally-worker's main does, and above the largest gradient PyTorch
    // allocates per step for the models Tally trains (common/malloc_tuning.h).
    TuneMallocForBulkTransfers(256 << 20);
    options_.server = server;
    options_.name = name;
    options_.verbose = verbose;
    options_.python_runtime = python_runtime;
    if (!data_root.empty()) {
      auto roots = DataRoots::Make(data_root);
      if (!roots.ok()) throw std::invalid_argument(roots.status().ToString());
      options_.data_roots = *std::move(roots);
    }
    auto parsed = ParseDevices(devices);
    if (!parsed.ok()) throw std::invalid_argument(parsed.status().ToString());
    options_.devices = *parsed;
    options_.devices_text = devices;
    auto transport = TransportFromFiles(tls_ca, tls_cert, tls_key, token_file);
    if (!transport.ok())
      throw std::invalid_argument(std::string(transport.status().message()));
    options_.transport = *std::move(transport);
    options_.python_engine = [this](const JobSpec& spec,
                                    const EngineOptions& eo)
        -> absl::StatusOr<std::unique_ptr<ModelEngine>> {
      py::gil_scoped_acquire gil;
      try {
        py::object impl = factory_(JobOf(spec, eo));
        return std::unique_ptr<ModelEngine>(
            new PyEngine(std::move(impl), spec));
      } catch (py::error_already_set& e) {
        return FromBuild(e);
      } catch (const std::exception& e) {  // an engine not as the contract says
        return FromPython(e, "building the model");
      }
    };
  }
  ~Worker() {
    py::gil_scoped_release release;
    Stop();
    if (thread_.joinable()) thread_.join();
  }

  void Start() {
    if (daemon_ != nullptr) throw std::logic_error("the worker is started already");
    daemon_ = std::make_unique<WorkerDaemon>(options_);
    thread_ = std::thread([this] {
      absl::Status s = daemon_->Run();
      absl::MutexLock lock(&mu_);
      result_ = s;
      done_ = true;
    });
  }
  // Whether the daemon ended within `seconds`.
  bool Wait(double seconds) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    return mu_.AwaitWithTimeout(absl::Condition(&done),
                                absl::Seconds(seconds));
  }
  void Stop() {
    if (daemon_ != nullptr) daemon_->Stop();
  }
  // The daemon's end: "" when it stopped as asked, else why.
  std::string Result() {
    absl::MutexLock lock(&mu_);
    return result_.ok() ? "" : result_.ToString();
  }

 private:
  DaemonOptions options_;
  py::object factory_;
  std::unique_ptr<WorkerDaemon> daemon_;
  std::thread thread_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace
}  // namespace tally

namespace {

tally::EmbeddingTableSpec TableOf(const std::string& name, int64_t dim,
                                  int64_t num_embeddings,
                                  const std::string& init, double scale) {
  tally::EmbeddingTableSpec t;
  t.name = name;
  t.dim = dim;
  t.num_embeddings = num_embeddings;
  t.salt = tally::TableSalt(name);
  if (init == "normal") {
    t.init = tally::TableInit::kNormal;
  } else if (init == "uniform") {
    t.init = tally::TableInit::kUniform;
  } else if (init == "zeros") {
    t.init = tally::TableInit::kZeros;
  } else {
    throw std::invalid_argument("init must be normal, uniform or zeros");
  }
  t.init_scale = scale;
  return t;
}

// tally._native.make_clicks: the samples dataset.name: clicks makes.
py::tuple MakeClicksArrays(int64_t train_size, int64_t test_size,
                           int64_t integer_features,
                           int64_t categorical_features, int64_t cardinality,
                           double zipf, uint64_t seed) {
  tally::ClicksOptions o;
  o.train_size = train_size;
  o.test_size = test_size;
  o.integer_features = integer_features;
  o.categorical_features = categorical_features;
  o.cardinality = cardinality;
  o.zipf = zipf;
  o.seed = seed;
  std::vector<double> teacher;
  absl::StatusOr<tally::TrainTest> d = tally::MakeClicks(o, &teacher);
  if (!d.ok()) throw std::invalid_argument(std::string(d.status().message()));
  const int64_t w = integer_features + categorical_features;
  auto ids = [w](const tally::Dataset& s) {
    py::array_t<int64_t> x({static_cast<py::ssize_t>(s.size()),
                            static_cast<py::ssize_t>(w)});
    std::copy(s.ids.begin(), s.ids.end(), x.mutable_data());
    py::array_t<int32_t> y(static_cast<py::ssize_t>(s.size()));
    std::copy(s.labels.begin(), s.labels.end(), y.mutable_data());
    return py::make_tuple(x, y);
  };
  py::array_t<double> p(static_cast<py::ssize_t>(teacher.size()));
  std::copy(teacher.begin(), teacher.end(), p.mutable_data());
  return py::make_tuple(ids(d->train), ids(d->test), p);
}

// tally._native.init_table: a whole table's initial rows.
py::array_t<float> InitTable(const std::string& name, int64_t num_embeddings,
                             int64_t dim, uint64_t seed,
                             const std::string& init, double scale) {
  tally::EmbeddingTableSpec t =
      TableOf(name, dim, num_embeddings, init, scale);
  py::array_t<float> out({static_cast<py::ssize_t>(num_embeddings),
                          static_cast<py::ssize_t>(dim)});
  float* o = out.mutable_data();
  for (int64_t r = 0; r < num_embeddings; ++r)
    tally::InitRow(t, seed, r, o + r * dim);
  return out;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Tally's native worker core (worker daemon, parameter client)";
  tally::UseTransportExperiments();  // before the module makes a channel
  py::class_<tally::Rows, std::shared_ptr<tally::Rows>>(m, "Rows")
      .def("pull", &tally::Rows::Pull, py::arg("table"), py::arg("rows"))
      .def("pull_tables", &tally::Rows::PullTables, py::arg("asks"))
      .def("push", &tally::Rows::Push, py::arg("samples"), py::arg("blocks"));
  m.def(
      "hash_rows",
      [](py::array_t<int64_t, py::array::c_style | py::array::forcecast> ids,
         uint64_t salt, int64_t n) {
        if (n <= 0) throw std::invalid_argument("a table has rows");
        py::array_t<int64_t> out(ids.request().shape);
        const int64_t* in = ids.data();
        int64_t* o = out.mutable_data();
        for (py::ssize_t i = 0; i < ids.size(); ++i)
          o[i] = tally::HashedRow(in[i], salt, n);
        return out;
      },
      py::arg("ids"), py::arg("salt"), py::arg("num_embeddings"),
      "The rows of a hashed table (ids: hashed) that `ids` map to.");
  m.def(
      "make_clicks", &MakeClicksArrays,
      py::arg("train_size"), py::arg("test_size"), py::arg("integer_features") = 13,
      py::arg("categorical_features") = 26, py::arg("cardinality") = 10000,
      py::arg("zipf") = 1.05, py::arg("seed") = 1,
      "dataset.name: clicks as the workers make it: ((train_x, train_y), "
      "(test_x, test_y), the teacher's click probability of each test "
      "sample).");
  m.def("auc", [](std::vector<double> scores, std::vector<int> labels) {
        return tally::Auc(scores, labels);
      }, py::arg("scores"), py::arg("labels"),
      "The ROC AUC of scores for 0/1 labels, over all of them at once.");
  m.def("table_salt", [](const std::string& name) { return tally::TableSalt(name); },
        py::arg("name"));
  m.def(
      "init_table", &InitTable,
      py::arg("name"), py::arg("num_embeddings"), py::arg("dim"),
      py::arg("seed"), py::arg("init") = "normal", py::arg("scale") = 1.0,
      "A whole table's initial rows, as the shards make them: the dense "
      "equivalent of a sparse table.");
  py::class_<tally::Worker>(m, "Worker")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, py::object, const std::string&,
                    const std::string&, const std::string&,
                    const std::string&, bool,
                    const std::vector<std::string>&>(),
           py::arg("server"), py::arg("devices"), py::arg("name"),
           py::arg("python_runtime"), py::arg("factory"),
           py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("token_file") = "",
           py::arg("verbose") = true,
           py::arg("data_root") = std::vector<std::string>{})
      .def("start", &tally::Worker::Start,
           py::call_guard<py::gil_scoped_release>())
      .def("wait", &tally::Worker::Wait, py::arg("seconds"),
           py::call_guard<py::gil_scoped_release>())
      .def("stop", &tally::Worker::Stop,
           py::call_guard<py::gil_scoped_release>())
      .def("result", &tally::Worker::Result);
}
