#include "server/data/table_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/io/safetensors.h"

namespace tally {

namespace {

constexpr char kMagic[8] = {'T', 'A', 'L', 'L', 'Y', 'T', 'B', 'L'};
constexpr uint32_t kFormat = 1;

class Writer {
 public:
  void Bytes(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
  }
  template <typename T>
  void Put(T v) {
    Bytes(&v, sizeof(v));
  }
  template <typename T>
  void Vector(const std::vector<T>& v) {
    Put<int64_t>(static_cast<int64_t>(v.size()));
    Bytes(v.data(), v.size() * sizeof(T));
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool done() const { return at_ == in_.size(); }
  bool Bytes(void* p, size_t n) {
    if (n > in_.size() - at_) return false;
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
    return true;
  }
  template <typename T>
  bool Get(T* v) {
    return Bytes(v, sizeof(*v));
  }
  template <typename T>
  bool Vector(std::vector<T>* v) {
    int64_t n = 0;
    if (!Get(&n) || n < 0 ||
        static_cast<uint64_t>(n) > (in_.size() - at_) / sizeof(T))
      return false;
    v->resize(static_cast<size_t>(n));
    return Bytes(v->data(), v->size() * sizeof(T));
  }

 private:
  std::string_view in_;
  size_t at_ = 0;
};

}  // namespace

int64_t TableRowsFile::bytes() const {
  int64_t n = 64 + static_cast<int64_t>(job_id.size());
  for (const Part& p : parts) {
    n += 48 + 8 * static_cast<int64_t>(p.rows.size() + p.dropped.size()) +
         4 * static_cast<int64_t>(p.values.size() + p.state.size());
  }
  return n;
}

absl::Status WriteTableFile(const std::string& path, const TableRowsFile& f) {
  Writer w;
  w.Bytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(kFormat);
  w.Put<int64_t>(static_cast<int64_t>(f.job_id.size()));
  w.Bytes(f.job_id.data(), f.job_id.size());
  w.Put<int64_t>(f.version);
  w.Put<int32_t>(f.slot);
  w.Put<int32_t>(f.slots);
  w.Put<uint8_t>(f.base ? 1 : 0);
  w.Put<int64_t>(static_cast<int64_t>(f.parts.size()));
  for (const TableRowsFile::Part& p : f.parts) {
    w.Put<int32_t>(p.table);
    w.Put<int64_t>(p.dim);
    w.Put<int32_t>(p.slots);
    w.Vector(p.rows);
    w.Vector(p.dropped);
    w.Vector(p.values);
    w.Vector(p.state);
  }
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(0, reinterpret_cast<const Bytef*>(w.out().data()),
              w.out().size()));
  w.Put<uint32_t>(crc);
  return WriteFileAtomic(path, w.out());
}

absl::StatusOr<TableRowsFile> ReadTableFile(const std::string& path,
                                            const std::string& job_id) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) {
    return absl::DataLossError(absl::StrCat("table checkpoint ", path, ": ",
                                            bytes.status().message()));
  }
  const auto bad = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrCat("table checkpoint ", path, ": ", why));
  };
  const std::string& in = *bytes;
  if (in.size() < sizeof(kMagic) + 8) return bad("too short");
  uint32_t crc = 0;
  std::memcpy(&crc, in.data() + in.size() - 4, 4);
  if (crc != static_cast<uint32_t>(crc32_z(
                 0, reinterpret_cast<const Bytef*>(in.data()), in.size() - 4)))
    return bad("its CRC-32 does not match (the file is damaged)");
  Reader r(std::string_view(in).substr(0, in.size() - 4));
  char magic[8];
  uint32_t format = 0;
  int64_t n = 0;
  TableRowsFile f;
  if (!r.Bytes(magic, 8) || std::memcmp(magic, kMagic, 8) != 0 ||
      !r.Get(&format) || format != kFormat)
    return bad("not a table checkpoint of this format");
  std::vector<char> job;
  if (!r.Vector(&job)) return bad("cut short");
  f.job_id.assign(job.begin(), job.end());
  if (f.job_id != job_id)
    return bad(absl::StrCat("it is job ", f.job_id, "'s, not ", job_id, "'s"));
  uint8_t base = 0;
  if (!r.Get(&f.version) || !r.Get(&f.slot) || !r.Get(&f.slots) ||
      !r.Get(&base) || !r.Get(&n) || n < 0 || n > 4096)
    return bad("a bad header");
  f.base = base != 0;
  for (int64_t i = 0; i < n; ++i) {
    TableRowsFile::Part p;
    if (!r.Get(&p.table) || !r.Get(&p.dim) || !r.Get(&p.slots) ||
        !r.Vector(&p.rows) || !r.Vector(&p.dropped) || !r.Vector(&p.values) ||
        !r.Vector(&p.state))
      return bad("cut short");
    if (p.dim <= 0 || p.slots < 0 ||
        p.values.size() != p.rows.size() * static_cast<size_t>(p.dim) ||
        p.state.size() != p.values.size() * static_cast<size_t>(p.slots))
      return bad(absl::StrCat("table ", p.table, "'s sizes do not agree"));
    f.parts.push_back(std::move(p));
  }
  if (!r.done()) return bad("bytes after its last table");
  return f;
}

}  // namespace tally
