#include "server/control/job_store.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/io/safetensors.h"
#include "common/spec/job_spec.h"
#include "proto/checkpoint.pb.h"
#include "proto/errors.h"
#include "zlib.h"

namespace tally {

namespace {

constexpr uint32_t kFormat = 1;

absl::string_view FloatBytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()),
                           v.size() * sizeof(float));
}

uint32_t Crc32(uint32_t crc, absl::string_view bytes) {
  // zlib takes at most 4 GiB a call.
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    crc = static_cast<uint32_t>(
        crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()),
              static_cast<uInt>(n)));
    bytes.remove_prefix(n);
  }
  return crc;
}

// A job id as this coordinator makes them ("job-12"): nothing else names a
// file in the state directory.
bool ValidJobId(const std::string& id) {
  absl::string_view rest = id;
  if (!absl::ConsumePrefix(&rest, "job-") || rest.empty() || rest.size() > 18)
    return false;
  for (char c : rest) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool BytesToFloats(const std::string& bytes, int64_t want,
                   std::vector<float>* out) {
  if (static_cast<int64_t>(bytes.size()) != want * 4) return false;
  out->resize(want);
  std::memcpy(out->data(), bytes.data(), bytes.size());
  return true;
}

// The key and length of a bytes field, so that a large field is written
// from its own memory after the serialised message: a message followed by
// more of its fields parses as one message.
std::string BytesFieldPrefix(int field, size_t size) {
  using google::protobuf::internal::WireFormatLite;
  std::string out;
  {
    google::protobuf::io::StringOutputStream raw(&out);
    google::protobuf::io::CodedOutputStream coded(&raw);
    coded.WriteTag(WireFormatLite::MakeTag(
        field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint64(size);
  }
  return out;
}

}  // namespace

ShardState StoredJob::Record() const {
  ShardState record;
  record.metrics.version = version;
  record.metrics.samples = samples;
  record.metrics.rejected_pushes = rejected_pushes;
  record.metrics.loss = loss;
  record.metrics.accuracy = accuracy;
  record.metrics.train_seconds = train_seconds;
  record.optimizer.step = optimizer_step;
  record.table_files = table_files;
  return record;
}

void StoredJob::SetRecord(const ShardState& range) {
  version = range.metrics.version;
  samples = range.metrics.samples;
  rejected_pushes = range.metrics.rejected_pushes;
  loss = range.metrics.loss;
  accuracy = range.metrics.accuracy;
  train_seconds = range.metrics.train_seconds;
  optimizer_step = range.optimizer.step;
}

void StoredJob::EncodeRange(int64_t offset, int64_t count,
                            v1::RangeState* out) const {
  EncodeRangeRecord(Record(), out);
  out->set_weights(weights->data() + offset, 4 * count);
  if (offset == 0) out->set_buffers(buffers);
  out->clear_optimizer_slots();
  for (const std::vector<float>& slot : optimizer_slots)
    out->add_optimizer_slots(slot.data() + offset, 4 * count);
}

JobStore::~JobStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

std::string JobStore::PathOf(const std::string& job_id) const {
  return (std::filesystem::path(dir_) / (job_id + ".ckpt")).string();
}

absl::Status JobStore::Open() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", dir_, ": ", ec.message()));
  }
  // One server per directory: two writing the same files would lose work.
  if (lock_fd_ < 0) {
    const std::string lock_path = (fs::path(dir_) / "LOCK").string();
    const int fd =
        ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--state_dir: cannot open ", lock_path, ": ", std::strerror(errno)));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "--state_dir ", dir_, " is in use by another tally-server"));
    }
    lock_fd_ = fd;
  }
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().filename().string().find(".ckpt.tmp.") !=
        std::string::npos) {
      std::error_code ignored;
      fs::remove(entry.path(), ignored);  // a write cut short by a crash
    }
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", dir_, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredJob> JobStore::LoadFile(const std::string& path) const {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": ", bytes.status().message()));
  }
  return ParseCheckpoint(*bytes, path, limits_);
}

absl::StatusOr<StoredJob> JobStore::ParseCheckpoint(absl::string_view bytes,
                                                    const std::string& path,
                                                    const SpecLimits& limits) {
  auto bad = [&path](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": ", why,
                     " (move the file away to start without that job)"));
  };
  if (bytes.size() >= static_cast<size_t>(INT_MAX)) return bad("over 2 GiB");
  v1::JobCheckpoint ck;
  if (!ck.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return bad("not a job checkpoint");
  if (ck.format() != kFormat) {
    return bad(
        absl::StrCat("format ", ck.format(), ", this server reads ", kFormat));
  }
  if (!ValidJobId(ck.job().id())) {
    return bad(absl::StrCat("the job id ", Quoted(ck.job().id()),
                            " is not one this server makes"));
  }
  if (std::filesystem::path(path).filename().string() !=
      ck.job().id() + ".ckpt") {
    return bad("the file's name is not its job's");
  }
  auto spec = ParseJobSpec(ck.job().spec(), limits);
  if (!spec.ok()) return bad(spec.status().message());
  StoredJob out;
  out.job = ck.job();
  out.history = ck.history();
  out.has_state = ck.has_shard();
  if (!out.has_state) return out;
  if (ck.has_data_crc32()) {
    uint32_t crc = Crc32(0, ck.weights());
    for (const std::string& slot : ck.optimizer_slots()) crc = Crc32(crc, slot);
    if (Crc32(crc, ck.buffers()) != ck.data_crc32()) {
      return bad("its parameters do not match their checksum (damaged)");
    }
  }
  out.version = ck.version();
  out.samples = ck.samples();
  out.rejected_pushes = ck.rejected_pushes();
  out.loss = ck.loss();
  out.accuracy = ck.accuracy();
  out.train_seconds = ck.train_seconds();
  if (absl::string_view why = ReadTensors(ck, *spec, &out); !why.empty())
    return bad(why);
  return out;
}

// The tensors of a checkpoint with state, each against the model's size;
// what does not match, or nothing.
absl::string_view JobStore::ReadTensors(const v1::JobCheckpoint& ck,
                                        const JobSpec& spec, StoredJob* out) {
  const int64_t n = spec.layout.num_params;
  auto weights = std::make_shared<std::vector<float>>();
  if (!BytesToFloats(ck.weights(), n, weights.get()))
    return "the weights do not match the model's size";
  out->weights = std::move(weights);
  if (!ck.buffers().empty() && static_cast<int64_t>(ck.buffers().size()) !=
                                   spec.python.buffer_bytes) {
    return "the buffers do not match the model's";
  }
  out->buffers = ck.buffers();
  out->table_files.assign(ck.table_files().begin(), ck.table_files().end());
  out->table_homes.assign(ck.table_homes().begin(), ck.table_homes().end());
  out->optimizer_step = ck.optimizer_step();
  for (const std::string& slot : ck.optimizer_slots()) {
    out->optimizer_slots.emplace_back();
    if (!BytesToFloats(slot, n, &out->optimizer_slots.back()))
      return "the optimizer state does not match the model's size";
  }
  return "";
}

absl::StatusOr<std::vector<StoredJob>> JobStore::LoadAll() const {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<StoredJob> out;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != ".ckpt") continue;
    absl::StatusOr<StoredJob> job = LoadFile(entry.path().string());
    if (!job.ok()) return job.status();
    out.push_back(*std::move(job));
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", dir_, ": ", ec.message()));
  }
  return out;
}

absl::StatusOr<StoredJob> JobStore::Load(const std::string& job_id) const {
  const std::string path = PathOf(job_id);
  if (!std::filesystem::exists(path)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint of ", job_id));
  }
  return LoadFile(path);
}

absl::Status JobStore::SaveNextJob(int64_t next) const {
  return WriteFileAtomic(dir_ + "/NEXT_JOB", absl::StrCat(next, "\n"));
}

int64_t JobStore::LoadNextJob() const {
  auto text = ReadFile(dir_ + "/NEXT_JOB");
  int64_t n = 0;
  if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &n))
    return 0;
  return n;
}

absl::Status JobStore::Remove(const std::string& job_id) const {
  const std::string path = PathOf(job_id);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(
        absl::StrCat("cannot remove ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Save(const StoredJob& job) const {
  // The small fields are serialised; weights and optimizer slots follow as
  // raw fields, straight from their vectors.
  v1::JobCheckpoint ck;
  ck.set_format(kFormat);
  *ck.mutable_job() = job.job;
  *ck.mutable_history() = job.history;
  std::vector<std::string> prefixes;
  std::vector<absl::string_view> data;
  if (job.has_state) {
    ck.set_has_shard(true);
    ck.set_version(job.version);
    ck.set_samples(job.samples);
    ck.set_rejected_pushes(job.rejected_pushes);
    ck.set_loss(job.loss);
    ck.set_accuracy(job.accuracy);
    ck.set_train_seconds(job.train_seconds);
    ck.set_optimizer_step(job.optimizer_step);
    data.push_back(FloatBytes(*job.weights));
    uint32_t crc = Crc32(0, data.back());
    for (const auto& slot : job.optimizer_slots)
      crc = Crc32(crc, FloatBytes(slot));
    ck.set_data_crc32(Crc32(crc, job.buffers));
    ck.set_buffers(job.buffers);
    ck.mutable_table_files()->Assign(job.table_files.begin(),
                                     job.table_files.end());
    ck.mutable_table_homes()->Assign(job.table_homes.begin(),
                                     job.table_homes.end());
    prefixes.push_back(BytesFieldPrefix(v1::JobCheckpoint::kWeightsFieldNumber,
                                        data.back().size()));
    for (const auto& slot : job.optimizer_slots) {
      data.push_back(FloatBytes(slot));
      prefixes.push_back(BytesFieldPrefix(
          v1::JobCheckpoint::kOptimizerSlotsFieldNumber, data.back().size()));
    }
  }
  const std::string head = ck.SerializeAsString();
  std::vector<absl::string_view> pieces = {head};
  size_t total = head.size();
  for (size_t i = 0; i < data.size(); ++i) {
    pieces.push_back(prefixes[i]);
    pieces.push_back(data[i]);
    total += prefixes[i].size() + data[i].size();
  }
  const std::string path = PathOf(job.job.id());
  // Protocol buffers stop at 2 GiB: weights plus optimizer state of more
  // than about 250M parameters do not fit one file.
  if (total >= static_cast<size_t>(INT_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path,
        ": the job's state is over 2 GiB, too large to checkpoint; it goes "
        "on in memory"));
  }
  return WriteFileAtomic(path, pieces);
}

}  // namespace tally
