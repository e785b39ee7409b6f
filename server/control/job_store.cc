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

constexpr uint32_t kFormat = 2;

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

void StoredJob::EncodeRange(int64_t offset, int64_t count,
                            v1::RangeState* out) const {
  ShardState record;
  record.metrics = state.metrics;
  record.optimizer.step = state.optimizer.step;
  record.table_files = state.table_files;
  if (offset == 0) record.buffers = state.buffers;
  EncodeRangeRecord(record, out);
  out->set_weights(state.weights->data() + offset, 4 * count);
  out->clear_optimizer_slots();
  for (const std::vector<float>& slot : state.optimizer.slots)
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
  if (ck.format() == 1) UpgradeFormat1(&ck);
  if (ck.format() != 1 && ck.format() != kFormat) {
    return bad(absl::StrCat("format ", ck.format(), ", this server reads 1 and ",
                            kFormat));
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
  const v1::RangeState& st = ck.state();
  if (ck.has_data_crc32()) {
    uint32_t crc = Crc32(0, st.weights());
    for (const std::string& slot : st.optimizer_slots()) crc = Crc32(crc, slot);
    if (Crc32(crc, st.buffers()) != ck.data_crc32()) {
      return bad("its parameters do not match their checksum (damaged)");
    }
  }
  absl::StatusOr<ShardState> state =
      DecodeRangeState(st, spec->layout.num_params);
  if (!state.ok()) return bad(state.status().message());
  if (!st.buffers().empty() &&
      static_cast<int64_t>(st.buffers().size()) != spec->python.buffer_bytes) {
    return bad("the buffers do not match the model's");
  }
  out.state = *std::move(state);
  out.table_homes.assign(ck.table_homes().begin(), ck.table_homes().end());
  return out;
}

void JobStore::UpgradeFormat1(v1::JobCheckpoint* ck) {
  v1::RangeState& st = *ck->mutable_state();
  st.set_version(ck->version());
  st.set_samples(ck->samples());
  st.set_rejected_pushes(ck->rejected_pushes());
  st.set_loss(ck->loss());
  st.set_accuracy(ck->accuracy());
  st.set_train_seconds(ck->train_seconds());
  st.set_optimizer_step(ck->optimizer_step());
  st.set_allocated_weights(ck->release_weights());  // moved, not copied
  st.mutable_optimizer_slots()->Swap(ck->mutable_optimizer_slots());
  st.set_allocated_buffers(ck->release_buffers());
  st.mutable_table_files()->Swap(ck->mutable_table_files());
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
    // The state's record goes in the message; its tensors follow in a
    // second occurrence of the field, which a reader merges into the first.
    const ShardState& st = job.state;
    ck.set_has_shard(true);
    EncodeRangeRecord(st, ck.mutable_state());
    ck.mutable_table_homes()->Assign(job.table_homes.begin(),
                                     job.table_homes.end());
    data.push_back(FloatBytes(*st.weights));
    prefixes.push_back(BytesFieldPrefix(v1::RangeState::kWeightsFieldNumber,
                                        data.back().size()));
    for (const auto& slot : st.optimizer.slots) {
      data.push_back(FloatBytes(slot));
      prefixes.push_back(BytesFieldPrefix(
          v1::RangeState::kOptimizerSlotsFieldNumber, data.back().size()));
    }
    uint32_t crc = 0;
    size_t tensors = 0;
    for (size_t i = 0; i < data.size(); ++i) {
      crc = Crc32(crc, data[i]);
      tensors += prefixes[i].size() + data[i].size();
    }
    ck.set_data_crc32(Crc32(crc, ck.state().buffers()));
    prefixes.insert(prefixes.begin(),
                    BytesFieldPrefix(v1::JobCheckpoint::kStateFieldNumber,
                                     tensors));
    data.insert(data.begin(), absl::string_view());
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
