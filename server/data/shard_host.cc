#include "server/data/shard_host.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/nn/layer_config.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "server/data/range_forwarder.h"
#include "server/data/sparse_table.h"

namespace tally {

namespace {

// Whether an install takes the place of the job's copy here: one of a
// newer placement, or a backup seeded again (the same placement) from a
// state no older than the copy's. A backup copy ahead of the state (an
// earlier seed that landed, though its caller heard no answer, and has
// taken the primary's steps since) holds the primary's own later
// versions: it stays, and takes the steps it has made already as such.
bool Replaces(const v1::InstallRangeRequest& req, const Range& here) {
  return here.map_version < req.map_version() ||
         (req.backup() && here.backup &&
          here.map_version == req.map_version() &&
          (here.shard == nullptr ||
           here.shard->version() <= req.state().version()));
}

absl::Status NoRange(const std::string& job_id) {
  return absl::NotFoundError(
      absl::StrCat("no range of job ", Quoted(job_id), " on this shard"));
}

}  // namespace

ShardHost::Options::Options() = default;

ShardHost::ShardHost(const Clock* clock, const SpecLimits& limits,
                     Options options)
    : waits_(options.waits),
      clock_(clock != nullptr ? clock : &real_clock_),
      options_(std::move(options)),
      table_budget_(
          options_.max_table_bytes > 0
              ? std::make_shared<std::atomic<int64_t>>(options_.max_table_bytes)
              : nullptr),
      shared_memory_max_bytes_(std::clamp<int64_t>(
          options_.shared_memory_max_bytes, 0, kMaxSharedBytes / 2)),
      limits_(limits) {}

absl::StatusOr<std::shared_ptr<ParameterShard>> ShardHost::MakeShard(
    const v1::InstallRangeRequest& req, const JobSpec& spec,
    ParameterShard::Options options) {
  const int64_t n = spec.layout.num_params;
  const int64_t count = req.count();
  TALLY_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt,
                         Optimizer::Create(spec.optimizer, count));
  opt->set_total_steps(req.schedule().total_steps());
  if (!req.has_state() && spec.is_python) {
    return absl::InvalidArgumentError(
        "a Python model's range is installed with its initial weights (a "
        "worker builds them; servers never run the model)");
  }
  if (!req.has_state()) {
    std::vector<float> init =
        InitParams(spec.layers, spec.layout, spec.training.seed);
    if (count != n) {  // a part of the model: keep only that
      init = std::vector<float>(init.begin() + req.offset(),
                                init.begin() + req.offset() + count);
    }
    TALLY_ASSIGN_OR_RETURN(options.tables, MakeTables(req, spec));
    return std::make_shared<ParameterShard>(std::move(init), std::move(opt),
                                            clock_, std::move(options));
  }
  TALLY_ASSIGN_OR_RETURN(ShardState st, DecodeRangeState(req.state(), count));
  if (st.buffers != nullptr &&
      (!spec.is_python || req.offset() != 0 ||
       static_cast<int64_t>(st.buffers->size()) != spec.python.buffer_bytes)) {
    return absl::InvalidArgumentError(
        "the range's buffers do not fit the job's model");
  }
  st.metrics.total_steps = req.schedule().total_steps();
  st.metrics.steps_per_epoch = req.schedule().steps_per_epoch();
  TALLY_ASSIGN_OR_RETURN(options.tables, MakeTables(req, spec));
  TALLY_ASSIGN_OR_RETURN(
      std::unique_ptr<ParameterShard> restored,
      ParameterShard::Restore(st, std::move(opt), clock_, std::move(options)));
  return std::shared_ptr<ParameterShard>(std::move(restored));
}

absl::StatusOr<std::shared_ptr<SparseTables>> ShardHost::MakeTables(
    const v1::InstallRangeRequest& req, const JobSpec& spec) {
  if (spec.embeddings.empty()) return nullptr;
  if (req.slots() < 1 || req.slot() < 0 || req.slot() >= req.slots()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a job with tables is installed with its range's slot: got ",
        req.slot(), " of ", req.slots()));
  }
  // Rows start from their initial values, or from the checkpoint's table
  // files (tally-server --table_dir on the shards, docs/cluster.md).
  auto tables = std::make_shared<SparseTables>(
      spec.embeddings, spec.training.seed, req.slot(), req.slots(),
      table_budget_);
  // The host outlives its ranges.
  tables->set_reclaim(
      [this](int64_t missing) { return ReclaimEndedTables(missing); });
  // A job placed again: the rows this slot owns, from every range's chain
  // of the checkpoint it resumes from.
  for (const std::string& path : req.state().table_files()) {
    TALLY_ASSIGN_OR_RETURN(TableRowsFile file,
                           ReadTableFile(path, req.job_id()));
    TALLY_RETURN_IF_ERROR(tables->Load(file));
  }
  if (!options_.table_dir.empty()) tables->set_checkpointed();
  return tables;
}

ParameterShard::Options ShardHost::RangeOptions(
    const v1::InstallRangeRequest& req, const JobSpec& spec) const {
  ParameterShard::Options o;
  o.consistency = spec.training.consistency;
  o.max_samples = spec.training.batch_size;
  // The buffer region rides with the range that starts the vector.
  if (spec.is_python && req.offset() == 0)
    o.buffer_bytes = spec.python.buffer_bytes;
  o.streamed_sums = StreamsSums(spec, req.count());
  o.plan = req.schedule().plan();
  o.publish_observer = options_.publish_observer;
  o.backup = req.backup();
  return o;
}

absl::Status ShardHost::Install(const v1::InstallRangeRequest& req) {
  {
    absl::MutexLock lock(&mu_);
    auto it = ranges_.find(req.job_id());
    if (it != ranges_.end() && !Replaces(req, it->second))
      return absl::OkStatus();  // installed already (a retried call)
  }
  TALLY_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(req.spec(), limits_));
  const int64_t n = spec.layout.num_params;
  if (req.offset() < 0 || req.count() <= 0 || req.count() > n ||
      req.offset() > n - req.count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("range [", req.offset(), ", +", req.count(),
                     ") is outside the job's ", n, " parameters"));
  }
  const int64_t count = req.count();
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<ParameterShard> shard,
                         MakeShard(req, spec, RangeOptions(req, spec)));
  std::shared_ptr<RangeForwarder> forwarder;
  if (!req.backup() && !req.backup_address().empty()) {
    TALLY_ASSIGN_OR_RETURN(forwarder, MakeForwarder(req, req.backup_address(),
                                                    shard, shard->version()));
  }
  TALLY_RETURN_IF_ERROR(shard->SetSchedule(req.schedule().total_steps(),
                                           req.schedule().steps_per_epoch(), "",
                                           req.schedule().plan()));
  std::vector<MemberSpec> members;
  for (const v1::MemberSpec& m : req.members()) members.push_back(FromProto(m));
  TALLY_RETURN_IF_ERROR(shard->SetMembers(members));
  std::shared_ptr<ParameterShard> replaced;
  std::shared_ptr<RangeForwarder> replaced_forwarder;  // stopped unlocked
  {
    absl::MutexLock lock(&mu_);
    Range& r = ranges_[req.job_id()];
    if (r.shard != nullptr && !Replaces(req, r))
      return absl::OkStatus();  // a concurrent install won
    replaced = std::move(r.shard);
    replaced_forwarder = std::move(r.forwarder);
    r.job_id = req.job_id();
    r.map_version = req.map_version();
    r.offset = req.offset();
    r.count = count;
    r.shard = std::move(shard);
    r.backup = req.backup();
    r.peer_address = req.backup_address();
    r.forwarder = std::move(forwarder);
  }
  if (replaced_forwarder != nullptr) replaced_forwarder->Stop();
  if (replaced != nullptr) {
    replaced->Close(
        absl::UnavailableError("the job was placed again: pull again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<RangeForwarder>> ShardHost::MakeForwarder(
    const v1::InstallRangeRequest& req, const std::string& address,
    const std::shared_ptr<ParameterShard>& shard, int64_t from_version) {
  std::shared_ptr<RangeForwarder> forwarder =
      NewForwarder(req.job_id(), req.map_version(), address, shard);
  // From the version the backup holds: refused if the range moved on.
  TALLY_RETURN_IF_ERROR(shard->StartForwarding(
      from_version, RangeForwarder::SendTo(forwarder), forwarder->id()));
  return forwarder;
}

std::shared_ptr<RangeForwarder> ShardHost::NewForwarder(
    const std::string& job_id, int64_t map_version, const std::string& address,
    const std::shared_ptr<ParameterShard>& shard) const {
  RangeForwarder::Options fo;
  fo.job_id = job_id;
  fo.map_version = map_version;
  // ":port" is the coordinator's own shard, on the coordinator's host.
  fo.backup_address =
      address.front() == ':'
          ? absl::StrCat(options_.coordinator_host.empty()
                             ? "127.0.0.1"
                             : options_.coordinator_host,
                         address)
          : address;
  fo.transport = options_.transport;
  return std::make_shared<RangeForwarder>(std::move(fo), shard);
}

absl::StatusOr<int64_t> ShardHost::Promote(const std::string& job_id,
                                           int64_t map_version) {
  std::shared_ptr<ParameterShard> shard;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranges_.find(job_id);
    if (it == ranges_.end() ||
        (map_version != 0 && it->second.map_version != map_version))
      return NoRange(job_id);
    if (!it->second.backup) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the copy of ", Quoted(job_id), " here is its primary already"));
    }
    it->second.backup = false;
    it->second.peer_address.clear();
    shard = it->second.shard;
  }
  shard->Promote();
  return shard->version();
}

absl::Status ShardHost::SetBackup(const std::string& job_id,
                                  int64_t map_version,
                                  const std::string& backup_address,
                                  int64_t from_version) {
  TALLY_ASSIGN_OR_RETURN(Range r, Find(job_id, map_version));
  if (r.backup) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the copy of ", Quoted(job_id), " here is a backup"));
  }
  std::shared_ptr<RangeForwarder> forwarder;  // none: the sender stops
  if (backup_address.empty()) {
    r.shard->StopForwarding();
  } else {
    v1::InstallRangeRequest req;
    req.set_job_id(job_id);
    req.set_map_version(r.map_version);
    TALLY_ASSIGN_OR_RETURN(
        forwarder, MakeForwarder(req, backup_address, r.shard, from_version));
  }
  return UseForwarder(job_id, r.shard, std::move(forwarder), backup_address);
}

absl::Status ShardHost::UseForwarder(
    const std::string& job_id, const std::shared_ptr<ParameterShard>& shard,
    std::shared_ptr<RangeForwarder> forwarder, const std::string& address) {
  std::shared_ptr<RangeForwarder> old;  // stopped unlocked
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranges_.find(job_id);
    found = it != ranges_.end() && it->second.shard == shard;
    if (found) {
      old = std::exchange(it->second.forwarder, std::move(forwarder));
      it->second.peer_address = address;
    }
  }
  if (!found) {
    // The range was dropped meanwhile: nobody sends to it.
    if (forwarder != nullptr) forwarder->Stop();
    return NoRange(job_id);
  }
  // Now, though a pull's copy of the range may still hold it.
  if (old != nullptr) old->Stop();
  return absl::OkStatus();
}

absl::StatusOr<ShardState> ShardHost::SeedBackup(
    const std::string& job_id, int64_t map_version,
    const std::string& backup_address) {
  TALLY_ASSIGN_OR_RETURN(Range r, Find(job_id, map_version));
  if (r.backup) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the copy of ", Quoted(job_id), " here is a backup"));
  }
  if (backup_address.empty())
    return absl::InvalidArgumentError("a new backup needs its address");
  std::shared_ptr<RangeForwarder> forwarder =
      NewForwarder(job_id, r.map_version, backup_address, r.shard);
  absl::StatusOr<ShardState> state = r.shard->SaveForBackup(
      RangeForwarder::SendTo(forwarder), forwarder->id());
  if (!state.ok()) return state.status();
  TALLY_RETURN_IF_ERROR(
      UseForwarder(job_id, r.shard, std::move(forwarder), backup_address));
  return state;
}

absl::StatusOr<int64_t> ShardHost::ApplyClosed(const std::string& job_id,
                                               int64_t map_version,
                                               const ClosedStep& step) {
  TALLY_ASSIGN_OR_RETURN(Range r, Find(job_id, map_version));
  TALLY_RETURN_IF_ERROR(r.shard->ApplyClosed(step));
  return r.shard->version();
}

bool ShardHost::StreamsSums(const JobSpec& spec, int64_t count) const {
  // Staged, a step holds a range-sized buffer for each member and the close
  // sums them all after the last push: stream once those buffers together
  // reach the threshold (a large range, or hundreds of workers on a small
  // one: bench/README.md). A job that may grow counts its most workers,
  // from its first step.
  const int64_t most = std::max<int64_t>(
      1, std::max({spec.training.workers, spec.training.max_workers,
                   spec.training.ranks}));
  return options_.streamed_sums &&
         count * most >= options_.streamed_sums_min_elements;
}

absl::StatusOr<Range> ShardHost::Find(const std::string& job_id,
                                      int64_t map_version) const {
  absl::MutexLock lock(&mu_);
  auto it = ranges_.find(job_id);
  if (it != ranges_.end() && map_version != 0 &&
      it->second.map_version != map_version) {
    return absl::NotFoundError(absl::StrCat(
        "the range of ", Quoted(job_id), " here is placed at map version ",
        it->second.map_version, ", not ", map_version));
  }
  if (it == ranges_.end()) {
    if (ended_.count(job_id)) {
      return WithReason(absl::FailedPreconditionError(
                            absl::StrCat(Quoted(job_id), " has ended")),
                        v1::JOB_ENDED);
    }
    return NoRange(job_id);
  }
  return it->second;
}

absl::StatusOr<HoldReport> ShardHost::Hold(const std::string& job_id,
                                           int64_t map_version, int64_t hold_id,
                                           absl::Duration hold) {
  TALLY_ASSIGN_OR_RETURN(Range r, Find(job_id, map_version));
  return r.shard->Hold(hold_id, clock_->Now() + hold);
}

absl::Status ShardHost::SetMembers(const std::string& job_id,
                                   int64_t map_version,
                                   const std::vector<MemberSpec>& members,
                                   int64_t hold_id, const PlanChange& plan) {
  TALLY_ASSIGN_OR_RETURN(Range r, Find(job_id, map_version));
  return r.shard->SetMembers(members, hold_id, plan);
}

absl::Status ShardHost::Retire(const std::string& job_id, int64_t map_version) {
  TALLY_ASSIGN_OR_RETURN(Range r, Find(job_id, map_version));
  std::shared_ptr<const SparseTables> tables = r.shard->Retire();
  if (tables == nullptr) return absl::OkStatus();
  std::shared_ptr<const SparseTables> older;  // freed without the lock
  absl::MutexLock lock(&ended_tables_mu_);
  for (const EndedTables& e : ended_tables_) {
    if (e.job_id == job_id) return absl::OkStatus();  // a retried call
  }
  ended_tables_.push_back({job_id, r.map_version, std::move(tables)});
  if (ended_tables_.size() > kKeptEndedTables) {
    older = std::move(ended_tables_.front().tables);
    ended_tables_.pop_front();
  }
  return absl::OkStatus();
}

bool ShardHost::ReclaimEndedTables(int64_t missing) {
  std::vector<std::shared_ptr<const SparseTables>> freed;
  {
    absl::MutexLock lock(&ended_tables_mu_);
    int64_t bytes = 0;
    while (!ended_tables_.empty() && bytes < missing) {
      // A fetch still reading a job's tables keeps their bytes until it
      // is done: they do not count as freed.
      if (ended_tables_.front().tables.use_count() == 1)
        bytes += ended_tables_.front().tables->bytes();
      freed.push_back(std::move(ended_tables_.front().tables));
      ended_tables_.pop_front();
    }
  }
  if (freed.empty()) return false;
  std::fprintf(stderr,
               "tally-server: dropped %zu ended job%s tables to make room "
               "(--max_table_bytes)\n",
               freed.size(), freed.size() == 1 ? "'s" : "s'");
  return true;  // its bytes are back once a fetch reading it is done
}

absl::Status ShardHost::ReadTable(const std::string& job_id,
                                  int64_t map_version, int table,
                                  int64_t start, int64_t max_rows,
                                  std::vector<int64_t>* rows,
                                  std::string* values, int64_t* total) const {
  std::shared_ptr<const SparseTables> tables;
  {
    absl::MutexLock lock(&ended_tables_mu_);
    for (const EndedTables& e : ended_tables_) {
      if (e.job_id == job_id &&
          (map_version == 0 || e.map_version == map_version))
        tables = e.tables;
    }
  }
  if (tables == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "this shard holds no tables of job ", Quoted(job_id),
        " (it restarted since the job ended, or their room went to other "
        "jobs' tables: --max_table_bytes, or ", kKeptEndedTables,
        " later jobs')"));
  }
  if (table < 0 || table >= tables->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table, ": the job has ", tables->size(), " tables"));
  }
  if (max_rows < 0 || max_rows > SparseTables::kMaxValuesPerMessage /
                                      tables->spec(table).dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "at most ", SparseTables::kMaxValuesPerMessage,
        " values a read; asked for ", max_rows, " rows of ",
        tables->spec(table).dim));
  }
  tables->ReadSorted(table, start, max_rows, rows, values);
  *total = tables->Metrics()[table].rows;
  return absl::OkStatus();
}

void ShardHost::DropAll() {
  std::vector<std::string> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : ranges_) jobs.push_back(id);
  }
  for (const std::string& id : jobs) Drop(id, /*ended=*/false);
}

void ShardHost::Drop(const std::string& job_id, bool ended,
                     int64_t map_version) {
  std::shared_ptr<ParameterShard> dropped;
  std::shared_ptr<RangeForwarder> forwarder;
  {
    absl::MutexLock lock(&mu_);
    auto found = ranges_.find(job_id);
    if (found != ranges_.end() && found->second.map_version > map_version)
      return;  // placed again since: keep the new range
    if (ended && ended_.insert(job_id).second) {
      ended_order_.push_back(job_id);
      if (ended_order_.size() > 1024) {
        ended_.erase(ended_order_.front());
        ended_order_.pop_front();
      }
    }
    auto it = ranges_.find(job_id);
    if (it == ranges_.end()) return;
    dropped = std::move(it->second.shard);
    forwarder = std::move(it->second.forwarder);
    ranges_.erase(it);
  }
  if (forwarder != nullptr) forwarder->Stop();
  if (ended && !options_.table_dir.empty()) {
    absl::MutexLock lock(&chains_mu_);
    chains_.erase(job_id);
    std::error_code ec;
    std::filesystem::remove_all(
        std::filesystem::path(options_.table_dir) / job_id, ec);
  }
  dropped->Close(
      ended ? WithReason(absl::FailedPreconditionError("the job ended"),
                         v1::JOB_ENDED)
            : absl::UnavailableError("the job's range moved: pull again"));
}

void ShardHost::SaveAt(const std::string& job_id, int64_t map_version,
                       int64_t v, absl::Time deadline,
                       std::function<void(absl::StatusOr<ShardState>)> done,
                       bool weights_only) {
  absl::StatusOr<Range> r = Find(job_id, map_version);
  if (!r.ok()) {
    done(r.status());
    return;
  }
  // The callback keeps the shard alive until it has run.
  std::shared_ptr<ParameterShard> shard = r->shard;
  std::shared_ptr<ParameterShard::TableCapture> capture;
  // (Save fills it only if the job has tables.)
  if (!weights_only && !options_.table_dir.empty()) {
    capture = std::make_shared<ParameterShard::TableCapture>();
    capture->base = NextSaveIsBase(job_id, r->map_version);
  }
  const int64_t placed = r->map_version;
  shard->SaveAt(
      v, deadline,
      [this, shard, capture, job_id, placed,
       done = std::move(done)](absl::StatusOr<ShardState> s) {
        if (s.ok() && capture != nullptr && capture->taken) {
          capture->file.job_id = job_id;
          absl::StatusOr<std::vector<std::string>> files =
              WriteTables(job_id, placed, capture->file);
          if (!files.ok()) {
            done(files.status());
            return;
          }
          s->table_files = *std::move(files);
        }
        done(std::move(s));
      },
      capture);
}

bool ShardHost::NextSaveIsBase(const std::string& job_id,
                               int64_t map_version) {
  absl::MutexLock lock(&chains_mu_);
  auto it = chains_.find(job_id);
  if (it == chains_.end() || it->second.map_version != map_version)
    return true;
  const TableChain& c = it->second;
  // A new base once the deltas outgrow it: the files stay under twice
  // the rows.
  return c.needs_base || c.files.empty() || c.delta_bytes > c.base_bytes;
}

absl::StatusOr<std::vector<std::string>> ShardHost::WriteTables(
    const std::string& job_id, int64_t map_version, const TableRowsFile& file) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(options_.table_dir) / job_id;
  const std::string path =
      (dir / absl::StrCat("m", map_version, "-s", file.slot, "-v",
                          file.version, "-n", table_files_written_++,
                          file.base ? "-base" : "", ".tbl"))
          .string();
  // Under chains_mu_, as Drop removes an ended job's directory: a save
  // that finishes after the end writes nothing.
  absl::MutexLock lock(&chains_mu_);
  {
    absl::MutexLock host(&mu_);
    if (ended_.count(job_id))
      return absl::FailedPreconditionError("the job ended");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  absl::Status written =
      ec ? absl::FailedPreconditionError(absl::StrCat(
               "--table_dir: ", dir.string(), ": ", ec.message()))
         : WriteTableFile(path, file);
  TableChain& c = chains_[job_id];
  if (c.map_version != map_version) c = TableChain{map_version};
  if (!written.ok()) {
    c.needs_base = true;  // this delta's rows are in no file
    return written;
  }
  if (file.base) {
    // The chain before stays until the job ends: the coordinator's last
    // checkpoint that was written may still name it.
    c.files = {path};
    c.base_bytes = file.bytes();
    c.delta_bytes = 0;
    c.needs_base = false;
  } else {
    c.files.push_back(path);
    c.delta_bytes += file.bytes();
  }
  return c.files;
}

namespace {

void AddClosedSpans(const std::vector<ClosedSpan>& spans, v1::RangeStatus* s) {
  for (const ClosedSpan& c : spans) {
    v1::ClosedSpan* out = s->add_closed();
    out->set_first_step(c.first_step);
    out->set_end_step(c.end_step);
    out->set_members(c.members);
    out->set_members_hash(c.members_hash);
    out->set_samples(c.samples);
  }
}

}  // namespace

std::vector<v1::RangeStatus> ShardHost::Status() const {
  std::vector<Range> ranges;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : ranges_) ranges.push_back(r);
  }
  std::vector<v1::RangeStatus> out;
  for (const Range& r : ranges) {
    const ShardMetrics m = r.shard->Metrics();
    v1::RangeStatus s;
    s.set_job_id(r.job_id);
    s.set_map_version(r.map_version);
    s.set_offset(r.offset);
    s.set_count(r.count);
    s.set_version(m.version);
    s.set_loss(m.loss);
    s.set_accuracy(m.accuracy);
    s.set_samples_per_sec(m.samples_per_sec);
    s.set_samples(m.samples);
    s.set_rejected_pushes(m.rejected_pushes);
    s.set_stale_pushes(m.stale_pushes);
    s.set_late_pushes(m.late_pushes);
    s.set_sum_resets(m.sum_resets);
    for (const TableMetrics& t : m.tables) {
      v1::TableStats* ts = s.add_tables();
      ts->set_name(t.name);
      ts->set_rows(t.rows);
      ts->set_bytes(t.bytes);
      ts->set_rows_pulled(t.rows_pulled);
      ts->set_rows_created(t.rows_created);
      ts->set_rows_pushed(t.rows_pushed);
      ts->set_rows_applied(t.rows_applied);
      ts->set_pulled_bytes(t.pulled_bytes);
      ts->set_pushed_bytes(t.pushed_bytes);
      ts->set_pull_wire_bytes(t.pull_wire_bytes);
      ts->set_push_wire_bytes(t.push_wire_bytes);
      ts->set_rows_evicted(t.rows_evicted);
      ts->set_rows_filtered(t.rows_filtered);
    }
    const ParameterShard::Report report = r.shard->Describe();
    for (const MemberProgress& p : report.progress) {
      v1::MemberProgress* mp = s.add_member_progress();
      mp->set_worker_id(p.worker_id);
      mp->set_incarnation(p.incarnation);
      mp->set_pushed_step(p.pushed_step);
      mp->set_committed_step(p.committed_step);
      mp->set_clock(p.clock);
      mp->set_waiting(p.waiting);
    }
    s.set_members(m.members);
    AddClosedSpans(report.closed, &s);
    s.set_train_seconds(m.train_seconds);
    s.set_backup(r.backup);
    s.set_peer_address(r.peer_address);
    s.set_backup_in_step(r.shard->copies().backup_in_step);
    out.push_back(std::move(s));
  }
  return out;
}

void ShardHost::Tick() {
  std::vector<std::shared_ptr<ParameterShard>> shards;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : ranges_) shards.push_back(r.shard);
  }
  for (auto& s : shards) s->ExpireWaiters();
}

bool ShardHost::ReserveSharedRegion(const std::string& owner, int64_t count) {
  if (count <= 0 || count > shared_memory_max_bytes_ / 4) return false;
  absl::MutexLock lock(&mu_);
  int& mine = shared_owners_[owner];
  if (shared_regions_ >= kMaxSharedRegions ||
      shared_bytes_ + 8 * count > kMaxSharedBytes ||
      mine >= kMaxSharedRegionsPerWorker) {
    if (mine == 0) shared_owners_.erase(owner);
    return false;
  }
  ++mine;
  ++shared_regions_;
  shared_bytes_ += 8 * count;
  return true;
}

int ShardHost::shared_regions() const {
  absl::MutexLock lock(&mu_);
  return shared_regions_;
}

void ShardHost::ReleaseSharedRegion(const std::string& owner, int64_t count) {
  absl::MutexLock lock(&mu_);
  if (auto it = shared_owners_.find(owner);
      it != shared_owners_.end() && --it->second <= 0) {
    shared_owners_.erase(it);
  }
  --shared_regions_;
  shared_bytes_ -= 8 * count;
}

absl::Status ShardHost::ReserveWaitingRows(const std::string& owner,
                                           int64_t bytes) {
  absl::MutexLock lock(&waiting_rows_mu_);
  int64_t& mine = waiting_rows_owners_[owner];
  const int64_t per_worker = options_.waiting_rows_per_worker;
  const int64_t in_all = options_.waiting_rows_in_all;
  const bool over_mine = mine + bytes > per_worker;
  if (over_mine || waiting_rows_bytes_ + bytes > in_all) {
    const std::string held =
        over_mine ? absl::StrCat("this worker's pulls of rows waiting here "
                                 "hold ", mine, " bytes")
                  : absl::StrCat("pulls of rows waiting here hold ",
                                 waiting_rows_bytes_, " bytes in all");
    const int64_t bound = over_mine ? per_worker : in_all;
    if (mine == 0) waiting_rows_owners_.erase(owner);
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            held, "; this one's ", bytes, " more would pass their bound of ",
            bound, " (pull again once some are answered)")),
        v1::PULLS_WAITING);
  }
  mine += bytes;
  waiting_rows_bytes_ += bytes;
  return absl::OkStatus();
}

void ShardHost::ReleaseWaitingRows(const std::string& owner, int64_t bytes) {
  absl::MutexLock lock(&waiting_rows_mu_);
  if (auto it = waiting_rows_owners_.find(owner);
      it != waiting_rows_owners_.end() && (it->second -= bytes) <= 0) {
    waiting_rows_owners_.erase(it);
  }
  waiting_rows_bytes_ -= bytes;
}

int64_t ShardHost::waiting_row_bytes() const {
  absl::MutexLock lock(&waiting_rows_mu_);
  return waiting_rows_bytes_;
}

}  // namespace tally
