#include "common/data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tally {

namespace {

constexpr char kMagic[] = "\x93NUMPY";

absl::Status Bad(const std::string& name, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": not a .npy file Tally reads: ", why));
}

// The value of 'key' in the header's dict text, up to its end (the text
// after the key's colon, spaces skipped); empty when absent.
absl::string_view ValueOf(absl::string_view dict, absl::string_view key) {
  for (const char q : {'\'', '"'}) {
    const std::string quoted = absl::StrCat(std::string(1, q), key,
                                            std::string(1, q));
    size_t at = dict.find(quoted);
    if (at == absl::string_view::npos) continue;
    at = dict.find(':', at + quoted.size());
    if (at == absl::string_view::npos) return {};
    absl::string_view rest = dict.substr(at + 1);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    return rest;
  }
  return {};
}

absl::StatusOr<std::pair<NpyType, int>> ParseDescr(absl::string_view v,
                                                   const std::string& name) {
  if (v.size() < 2 || (v[0] != '\'' && v[0] != '"')) {
    return Bad(name, "'descr' is not a simple dtype (structured arrays are not "
                     "read)");
  }
  const size_t end = v.find(v[0], 1);
  if (end == absl::string_view::npos) return Bad(name, "'descr' is unterminated");
  const absl::string_view d = v.substr(1, end - 1);
  if (d.size() < 3) return Bad(name, absl::StrCat("dtype '", d, "'"));
  if (d[0] == '>') {
    return Bad(name, absl::StrCat("dtype '", d,
                                  "' is big-endian (save it little-endian: "
                                  "a.astype(a.dtype.newbyteorder('<')))"));
  }
  if (d[0] != '<' && d[0] != '|' && d[0] != '=') {
    return Bad(name, absl::StrCat("dtype '", d, "'"));
  }
  const absl::string_view t = d.substr(1);
  struct Known {
    absl::string_view code;
    NpyType type;
    int width;
  };
  static constexpr Known kKnown[] = {
      {"b1", NpyType::kBool, 1}, {"u1", NpyType::kU8, 1},
      {"i1", NpyType::kI8, 1},   {"u2", NpyType::kU16, 2},
      {"i2", NpyType::kI16, 2},  {"u4", NpyType::kU32, 4},
      {"i4", NpyType::kI32, 4},  {"u8", NpyType::kU64, 8},
      {"i8", NpyType::kI64, 8},  {"f2", NpyType::kF16, 2},
      {"f4", NpyType::kF32, 4},  {"f8", NpyType::kF64, 8}};
  for (const Known& k : kKnown) {
    if (t == k.code) return std::make_pair(k.type, k.width);
  }
  return Bad(name, absl::StrCat("dtype '", d,
                                "' (Tally reads bool, integers of 1 to 8 "
                                "bytes, float16, float32, float64)"));
}

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view v,
                                                const std::string& name) {
  if (v.empty() || v[0] != '(') return Bad(name, "'shape' is not a tuple");
  const size_t end = v.find(')');
  if (end == absl::string_view::npos) return Bad(name, "'shape' is unterminated");
  std::vector<int64_t> shape;
  absl::string_view body = v.substr(1, end - 1);
  while (!body.empty()) {
    while (!body.empty() && (body.front() == ' ' || body.front() == ','))
      body.remove_prefix(1);
    if (body.empty()) break;
    int64_t n = 0;
    size_t digits = 0;
    while (digits < body.size() && body[digits] >= '0' && body[digits] <= '9') {
      if (n > (int64_t{1} << 50)) return Bad(name, "a dimension is too large");
      n = n * 10 + (body[digits] - '0');
      ++digits;
    }
    if (digits == 0) return Bad(name, "'shape' holds something not a size");
    shape.push_back(n);
    body.remove_prefix(digits);
    if (shape.size() > 8) return Bad(name, "more than 8 dimensions");
  }
  return shape;
}

}  // namespace

int64_t NpyHeader::values() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes,
                                         const std::string& name) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != absl::string_view(kMagic, 6)) {
    return Bad(name, "no \\x93NUMPY magic at its start");
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  int64_t len = 0, at = 0;
  if (major == 1) {
    len = static_cast<uint8_t>(bytes[8]) |
          (static_cast<int64_t>(static_cast<uint8_t>(bytes[9])) << 8);
    at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Bad(name, "its header is cut short");
    for (int i = 0; i < 4; ++i)
      len |= static_cast<int64_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    at = 12;
  } else {
    return Bad(name, absl::StrCat("format version ", major, " (1 to 3 are read)"));
  }
  if (len > (int64_t{1} << 20) ||
      static_cast<int64_t>(bytes.size()) < at + len) {
    return absl::DataLossError(absl::StrCat(
        name, ": its header says ", len, " bytes, the file holds fewer"));
  }
  const absl::string_view dict = bytes.substr(at, len);
  NpyHeader h;
  TALLY_ASSIGN_OR_RETURN(auto type, ParseDescr(ValueOf(dict, "descr"), name));
  h.type = type.first;
  h.width = type.second;
  const absl::string_view fortran = ValueOf(dict, "fortran_order");
  if (fortran.substr(0, 5) != "False") {
    return Bad(name, fortran.substr(0, 4) == "True"
                         ? "Fortran order (save a C-ordered array: "
                           "np.ascontiguousarray)"
                         : "'fortran_order' is missing");
  }
  TALLY_ASSIGN_OR_RETURN(h.shape, ParseShape(ValueOf(dict, "shape"), name));
  // values() must not overflow: at most 2^50 values (a petabyte of bytes).
  int64_t values = 1;
  for (int64_t d : h.shape) {
    if (d != 0 && values > (int64_t{1} << 50) / d) {
      return Bad(name, "more than 2^50 values");
    }
    values *= d;
  }
  h.data_offset = at + len;
  return h;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);  // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(
    const std::string& path) {
  // Non-blocking: a FIFO named by mistake must not hang the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot open: ", why));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": not a regular file"));
  }
  std::shared_ptr<MappedFile> f(new MappedFile);
  f->path_ = path;
  f->size_ = st.st_size;
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(f->size_), PROT_READ,
                     MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot map: ", why));
    }
    f->data_ = static_cast<const char*>(p);
  }
  ::close(fd);  // the mapping stays
  return std::shared_ptr<const MappedFile>(std::move(f));
}

void MappedFile::AdviseRandom() const {
  if (data_ != nullptr) {
    ::madvise(const_cast<char*>(data_), static_cast<size_t>(size_),
              MADV_RANDOM);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr)
    ::munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
}

namespace {

// The header of a mapped file, and its values all there.
absl::StatusOr<NpyHeader> HeaderOf(const MappedFile& f) {
  TALLY_ASSIGN_OR_RETURN(
      NpyHeader h,
      ParseNpyHeader(absl::string_view(f.data(), static_cast<size_t>(f.size())),
                     f.path()));
  const int64_t values = h.values();
  if (values > (int64_t{1} << 50) / h.width ||
      f.size() - h.data_offset < values * h.width) {
    return absl::DataLossError(absl::StrCat(
        f.path(), ": its header says ", values, " values of ", h.width,
        " bytes, the file holds ", f.size() - h.data_offset, " bytes of data"));
  }
  return h;
}

// Value i of a mapped array, as a double (exact for every integer a label
// may be and every value a float32 sample may hold).
double ValueAt(const char* p, NpyType t, int64_t i) {
  auto get = [&](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(v)), sizeof(v));
    return static_cast<double>(v);
  };
  switch (t) {
    case NpyType::kBool:
    case NpyType::kU8:
      return get(uint8_t{});
    case NpyType::kI8:
      return get(int8_t{});
    case NpyType::kU16:
      return get(uint16_t{});
    case NpyType::kI16:
      return get(int16_t{});
    case NpyType::kU32:
      return get(uint32_t{});
    case NpyType::kI32:
      return get(int32_t{});
    case NpyType::kU64:
      return get(uint64_t{});
    case NpyType::kI64:
      return get(int64_t{});
    case NpyType::kF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return HalfToFloat(h);
    }
    case NpyType::kF32:
      return get(float{});
    case NpyType::kF64:
      return get(double{});
  }
  return 0.0;
}

std::string ShapeText(std::span<const int64_t> s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const NpyArrays>> NpyArrays::Open(
    const std::string& inputs_path, const std::string& labels_path,
    const Shape& sample_shape, int num_classes) {
  std::shared_ptr<NpyArrays> a(new NpyArrays);
  TALLY_ASSIGN_OR_RETURN(a->inputs_, MappedFile::Open(inputs_path));
  TALLY_ASSIGN_OR_RETURN(a->labels_, MappedFile::Open(labels_path));
  TALLY_ASSIGN_OR_RETURN(a->in_, HeaderOf(*a->inputs_));
  TALLY_ASSIGN_OR_RETURN(a->lab_, HeaderOf(*a->labels_));
  const std::vector<int64_t>& s = a->in_.shape;
  const std::vector<int64_t> want(sample_shape.begin(), sample_shape.end());
  if (s.empty() || std::vector<int64_t>(s.begin() + 1, s.end()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        inputs_path, ": inputs of shape ", ShapeText(s), "; the job's samples are ",
        ShapeText(want), " (dataset.shape), so [n, ", absl::StrJoin(want, ", "),
        "]"));
  }
  if (a->lab_.shape.size() != 1 || a->lab_.type == NpyType::kF16 ||
      a->lab_.type == NpyType::kF32 || a->lab_.type == NpyType::kF64) {
    return absl::InvalidArgumentError(absl::StrCat(
        labels_path, ": labels of shape ", ShapeText(a->lab_.shape),
        (a->lab_.shape.size() == 1 ? " and a floating dtype" : ""),
        "; they are one integer per sample"));
  }
  if (a->lab_.shape[0] != s[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        inputs_path, " holds ", s[0], " samples, ", labels_path, " ",
        a->lab_.shape[0], " labels"));
  }
  a->size_ = s[0];
  a->sample_values_ = a->size_ == 0 ? 0 : a->in_.values() / a->size_;
  const char* labels = a->labels_->data() + a->lab_.data_offset;
  for (int64_t i = 0; i < a->size_; ++i) {
    const double v = ValueAt(labels, a->lab_.type, i);
    if (!(v >= 0 && v < num_classes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          labels_path, ": label ", v, " of sample ", i, " is outside [0, ",
          num_classes, ") (the job's classes)"));
    }
  }
  // Batches gather samples of a shuffled order: read-ahead would read the
  // neighbours of every one, and under memory pressure push out what the
  // next batches need.
  a->inputs_->AdviseRandom();
  return std::shared_ptr<const NpyArrays>(std::move(a));
}

void NpyArrays::Describe(Fingerprint* f) const {
  for (const auto& [file, header] :
       {std::pair{inputs_.get(), &in_}, std::pair{labels_.get(), &lab_}}) {
    f->AddFile(file->size());
    f->Add(absl::string_view(file->data(),
                             static_cast<size_t>(header->data_offset)));
  }
}

absl::Status NpyArrays::Gather(std::span<const int64_t> indices,
                               const GatherContext& /*context*/, float* x,
                               int32_t* y) const {
  const char* in = inputs_->data() + in_.data_offset;
  const char* lab = labels_->data() + lab_.data_offset;
  const int64_t n = sample_values_;
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t s = indices[i];
    float* dst = x + static_cast<int64_t>(i) * n;
    switch (in_.type) {
      case NpyType::kF32:
        std::memcpy(dst, in + s * n * 4, static_cast<size_t>(n) * 4);
        break;
      case NpyType::kU8: {  // as torchvision's ToTensor (and LoadIdx)
        const uint8_t* src = reinterpret_cast<const uint8_t*>(in) + s * n;
        for (int64_t k = 0; k < n; ++k) dst[k] = src[k] / 255.0f;
        break;
      }
      default:
        for (int64_t k = 0; k < n; ++k)
          dst[k] = static_cast<float>(ValueAt(in, in_.type, s * n + k));
    }
    y[i] = static_cast<int32_t>(ValueAt(lab, lab_.type, s));
  }
  bytes_.fetch_add(static_cast<int64_t>(indices.size()) *
                       (n * in_.width + lab_.width),
                   std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace tally
