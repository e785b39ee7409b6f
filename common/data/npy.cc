#include "common/data/npy.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/data_file.h"
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
  // A regular file only, opened without blocking (data_file.h).
  TALLY_ASSIGN_OR_RETURN(DataFile file, DataFile::Open(path));
  std::shared_ptr<MappedFile> f(new MappedFile);
  f->path_ = path;
  f->size_ = file.size();
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(f->size_), PROT_READ,
                     MAP_SHARED, file.fd(), 0);
    if (p == MAP_FAILED) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot map: ", std::strerror(errno)));
    }
    f->data_ = static_cast<const char*>(p);
  }
  return std::shared_ptr<const MappedFile>(std::move(f));  // the mapping stays
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

// The array's values must all be in its file (up to end_of_data).
absl::Status CheckData(const MappedArray& a, int64_t end_of_data) {
  const NpyHeader& h = a.header;
  const int64_t values = h.values();
  if (values > (int64_t{1} << 50) / h.width ||
      end_of_data - h.data_offset < values * h.width) {
    return absl::DataLossError(absl::StrCat(
        a.name, ": its header says ", values, " values of ", h.width,
        " bytes, the file holds ",
        std::max<int64_t>(0, end_of_data - h.data_offset), " bytes of data"));
  }
  return absl::OkStatus();
}

uint64_t Le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

absl::Status ZipCut(const std::string& name, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(name, ": ", what, " is cut off"));
}

// The central directory's offset and entry count, from the end record
// (zip64's when the plain one overflows).
absl::Status FindCentralDirectory(const MappedFile& f, int64_t* offset,
                                  int64_t* entries) {
  const char* d = f.data();
  const int64_t n = f.size();
  int64_t eocd = -1;
  for (int64_t at = n - 22; at >= 0 && at >= n - 22 - 65535; --at) {
    if (Le(d + at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
  }
  if (eocd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": not a .npz file (no zip directory at its end)"));
  }
  *entries = static_cast<int64_t>(Le(d + eocd + 10, 2));
  *offset = static_cast<int64_t>(Le(d + eocd + 16, 4));
  if (*offset == 0xffffffff && eocd >= 20 &&
      Le(d + eocd - 20, 4) == 0x07064b50) {
    const uint64_t z = Le(d + eocd - 12, 8);
    if (z > static_cast<uint64_t>(n - 56) || Le(d + z, 4) != 0x06064b50) {
      return ZipCut(f.path(), "its zip64 directory");
    }
    *entries = static_cast<int64_t>(Le(d + z + 32, 8) & 0xffffffff);
    *offset = static_cast<int64_t>(Le(d + z + 48, 8) & ((uint64_t{1} << 62) - 1));
  }
  if (*offset > n) return ZipCut(f.path(), "its zip directory");
  return absl::OkStatus();
}

// Where member `member`'s bytes are in a mapped zip archive (offset, size),
// and how they are stored (0: as they are).
absl::Status FindZipMember(const MappedFile& f, const std::string& member,
                           int64_t* offset, int64_t* size, int* method) {
  const char* d = f.data();
  const int64_t n = f.size();
  int64_t at = 0, entries = 0;
  TALLY_RETURN_IF_ERROR(FindCentralDirectory(f, &at, &entries));
  std::vector<std::string> names;
  for (int64_t e = 0; e < entries; ++e) {
    if (at > n - 46 || Le(d + at, 4) != 0x02014b50) {
      return ZipCut(f.path(), "its zip directory");
    }
    const int64_t name_len = static_cast<int64_t>(Le(d + at + 28, 2));
    const int64_t extra_len = static_cast<int64_t>(Le(d + at + 30, 2));
    const int64_t comment_len = static_cast<int64_t>(Le(d + at + 32, 2));
    const int64_t extra = at + 46 + name_len;
    if (extra + extra_len > n) return ZipCut(f.path(), "its zip directory");
    const std::string entry(d + at + 46, static_cast<size_t>(name_len));
    if (entry != member) {
      names.push_back(entry);
      at = extra + extra_len + comment_len;
      continue;
    }
    *method = static_cast<int>(Le(d + at + 10, 2));
    uint64_t bytes = Le(d + at + 24, 4), local = Le(d + at + 42, 4);
    // zip64: the sizes and offset that overflow follow in an extra field.
    for (int64_t x = extra; x + 4 <= extra + extra_len;) {
      const uint64_t id = Le(d + x, 2), len = Le(d + x + 2, 2);
      int64_t v = x + 4;
      if (id == 1 && x + 4 + static_cast<int64_t>(len) <= extra + extra_len) {
        if (bytes == 0xffffffff && v + 8 <= x + 4 + static_cast<int64_t>(len)) {
          bytes = Le(d + v, 8);
          v += 8;
        }
        if (Le(d + at + 20, 4) == 0xffffffff) v += 8;
        if (local == 0xffffffff && v + 8 <= x + 4 + static_cast<int64_t>(len)) {
          local = Le(d + v, 8);
        }
      }
      x += 4 + static_cast<int64_t>(len);
    }
    const std::string what = absl::StrCat("its member ", member);
    if (local > static_cast<uint64_t>(n - 30) || Le(d + local, 4) != 0x04034b50) {
      return ZipCut(f.path(), what);
    }
    *offset = static_cast<int64_t>(local) + 30 +
              static_cast<int64_t>(Le(d + local + 26, 2)) +
              static_cast<int64_t>(Le(d + local + 28, 2));
    if (*method != 0) return absl::OkStatus();  // refused by the caller
    if (*offset > n || bytes > static_cast<uint64_t>(n - *offset)) {
      return ZipCut(f.path(), what);
    }
    *size = static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      f.path(), ": no array '", member.substr(0, member.size() - 4),
      "' (it holds ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<MappedArray> OpenNpz(std::shared_ptr<const MappedFile> f,
                                    const std::string& key) {
  MappedArray a;
  a.name = absl::StrCat(f->path(), "[", key, "]");
  int64_t offset = 0, size = 0;
  int method = 0;
  TALLY_RETURN_IF_ERROR(FindZipMember(*f, key + ".npy", &offset, &size, &method));
  if (method != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        a.name, ": compressed (np.savez_compressed), so it cannot be mapped: "
                "save it with np.savez, or as .npy files"));
  }
  TALLY_ASSIGN_OR_RETURN(
      a.header, ParseNpyHeader(absl::string_view(f->data() + offset,
                                                 static_cast<size_t>(size)),
                               a.name));
  a.header.data_offset += offset;
  TALLY_RETURN_IF_ERROR(CheckData(a, offset + size));
  a.file = std::move(f);
  return a;
}

absl::StatusOr<std::pair<NpyType, int>> SafetensorsType(
    const std::string& dtype) {
  static const auto* kTypes = new std::map<std::string, std::pair<NpyType, int>>{
      {"BOOL", {NpyType::kBool, 1}}, {"U8", {NpyType::kU8, 1}},
      {"I8", {NpyType::kI8, 1}},     {"U16", {NpyType::kU16, 2}},
      {"I16", {NpyType::kI16, 2}},   {"U32", {NpyType::kU32, 4}},
      {"I32", {NpyType::kI32, 4}},   {"U64", {NpyType::kU64, 8}},
      {"I64", {NpyType::kI64, 8}},   {"F16", {NpyType::kF16, 2}},
      {"BF16", {NpyType::kBF16, 2}}, {"F32", {NpyType::kF32, 4}},
      {"F64", {NpyType::kF64, 8}}};
  auto it = kTypes->find(dtype);
  if (it == kTypes->end()) return absl::InvalidArgumentError(dtype);
  return it->second;
}

// Tensor `key`'s dtype, shape and offsets from a safetensors header.
absl::Status ReadTensorEntry(const nlohmann::json& t, const std::string& key,
                             NpyHeader* h, uint64_t* begin, uint64_t* end) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", key, "' ", why));
  };
  if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() ||
      !t.contains("shape") || !t["shape"].is_array() || t["shape"].size() > 8 ||
      !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
      t["data_offsets"].size() != 2 || !t["data_offsets"][0].is_number_unsigned() ||
      !t["data_offsets"][1].is_number_unsigned()) {
    return bad("needs dtype, shape (at most 8 sizes) and data_offsets");
  }
  auto type = SafetensorsType(t["dtype"].get<std::string>());
  if (!type.ok()) return bad(absl::StrCat("has dtype ", type.status().message()));
  h->type = type->first;
  h->width = type->second;
  int64_t values = 1;
  for (const auto& d : t["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 50)) {
      return bad("has a bad shape");
    }
    h->shape.push_back(d.get<int64_t>());
    if (h->shape.back() != 0 && values > (int64_t{1} << 50) / h->shape.back()) {
      return bad("has more than 2^50 values");
    }
    values *= h->shape.back();
  }
  *begin = t["data_offsets"][0].get<uint64_t>();
  *end = t["data_offsets"][1].get<uint64_t>();
  if (*begin > *end) return bad("has bad data_offsets");
  return absl::OkStatus();
}

absl::StatusOr<MappedArray> OpenSafetensors(std::shared_ptr<const MappedFile> f,
                                            const std::string& key) {
  MappedArray a;
  a.name = absl::StrCat(f->path(), "[", key, "]");
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(f->path(), ": not a .safetensors file Tally reads: ", why));
  };
  if (f->size() < 8) return bad("shorter than its 8-byte header length");
  const uint64_t n = Le(f->data(), 8);
  if (n > static_cast<uint64_t>(f->size() - 8) || n > (uint64_t{1} << 27)) {
    return bad(absl::StrCat("a header of ", n, " bytes"));
  }
  const nlohmann::json header = nlohmann::json::parse(
      std::string_view(f->data() + 8, static_cast<size_t>(n)), nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return bad("its header is not a JSON object");
  }
  if (!header.contains(key)) {
    std::vector<std::string> names;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() != "__metadata__") names.push_back(it.key());
    }
    return absl::InvalidArgumentError(absl::StrCat(
        f->path(), ": no tensor '", key, "' (it holds ",
        absl::StrJoin(names, ", "), ")"));
  }
  uint64_t begin = 0, end = 0;
  absl::Status entry = ReadTensorEntry(header[key], key, &a.header, &begin, &end);
  if (!entry.ok()) return bad(entry.message());
  const uint64_t data = static_cast<uint64_t>(f->size()) - 8 - n;
  if (begin > data) return bad(absl::StrCat("tensor '", key, "' starts past the end"));
  a.header.data_offset = static_cast<int64_t>(8 + n + begin);
  TALLY_RETURN_IF_ERROR(
      CheckData(a, static_cast<int64_t>(8 + n + std::min(end, data))));
  a.file = std::move(f);
  return a;
}

bool EndsWith(const std::string& s, absl::string_view suffix) {
  return s.size() >= suffix.size() &&
         absl::string_view(s).substr(s.size() - suffix.size()) == suffix;
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
    case NpyType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
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

absl::StatusOr<MappedArray> OpenArray(const std::string& path,
                                      const std::string& key) {
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f,
                         MappedFile::Open(path));
  if (EndsWith(path, ".npz")) return OpenNpz(std::move(f), key);
  if (EndsWith(path, ".safetensors")) return OpenSafetensors(std::move(f), key);
  MappedArray a;
  a.name = path;
  TALLY_ASSIGN_OR_RETURN(
      a.header,
      ParseNpyHeader(absl::string_view(f->data(), static_cast<size_t>(f->size())),
                     path));
  TALLY_RETURN_IF_ERROR(CheckData(a, f->size()));
  a.file = std::move(f);
  return a;
}

absl::StatusOr<std::vector<std::string>> ExpandGlob(const std::string& path) {
  if (path.find_first_of("*?[") == std::string::npos) {
    return std::vector<std::string>{path};
  }
  glob_t g;
  const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the pattern matches no file"));
  }
  return out;  // glob sorts them
}

absl::Status NpyArrays::AddShard(MappedArray in, MappedArray lab,
                                 const Shape& sample_shape, int num_classes) {
  const std::vector<int64_t>& s = in.header.shape;
  const std::vector<int64_t> want(sample_shape.begin(), sample_shape.end());
  if (s.empty() || std::vector<int64_t>(s.begin() + 1, s.end()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        in.name, ": inputs of shape ", ShapeText(s), "; the job's samples are ",
        ShapeText(want), " (dataset.shape), so [n, ", absl::StrJoin(want, ", "),
        "]"));
  }
  const NpyHeader& lh = lab.header;
  if (lh.shape.size() != 1 || lh.type == NpyType::kF16 ||
      lh.type == NpyType::kBF16 || lh.type == NpyType::kF32 ||
      lh.type == NpyType::kF64) {
    return absl::InvalidArgumentError(absl::StrCat(
        lab.name, ": labels of shape ", ShapeText(lh.shape),
        (lh.shape.size() == 1 ? " and a floating dtype" : ""),
        "; they are one integer per sample"));
  }
  if (lh.shape[0] != s[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        in.name, " holds ", s[0], " samples, ", lab.name, " ", lh.shape[0],
        " labels"));
  }
  const char* labels = lab.file->data() + lh.data_offset;
  for (int64_t i = 0; i < lh.shape[0]; ++i) {
    const double v = ValueAt(labels, lh.type, i);
    if (!(v >= 0 && v < num_classes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          lab.name, ": label ", v, " of sample ", i, " is outside [0, ",
          num_classes, ") (the job's classes)"));
    }
  }
  // Batches gather samples of a shuffled order: read-ahead would read the
  // neighbours of every one, and under memory pressure push out what the
  // next batches need.
  in.file->AdviseRandom();
  sample_values_ = NumElements(sample_shape);
  const int64_t begin = size_;
  size_ += s[0];
  shards_.push_back(Shard{std::move(in), std::move(lab), begin});
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const NpyArrays>> NpyArrays::Open(
    const ArrayFiles& files, const Shape& sample_shape, int num_classes) {
  std::shared_ptr<NpyArrays> a(new NpyArrays);
  std::vector<std::pair<std::string, std::string>> pairs;  // (inputs, labels)
  if (!files.file.empty()) {
    TALLY_ASSIGN_OR_RETURN(std::vector<std::string> paths,
                           ExpandGlob(files.file));
    for (const std::string& p : paths) pairs.emplace_back(p, p);
  } else {
    TALLY_ASSIGN_OR_RETURN(std::vector<std::string> ins,
                           ExpandGlob(files.inputs));
    TALLY_ASSIGN_OR_RETURN(std::vector<std::string> labs,
                           ExpandGlob(files.labels));
    if (ins.size() != labs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          files.inputs, " matches ", ins.size(), " files, ", files.labels, " ",
          labs.size(), " (a shard of inputs goes with a shard of labels)"));
    }
    for (size_t i = 0; i < ins.size(); ++i) pairs.emplace_back(ins[i], labs[i]);
  }
  const std::string in_key = files.file.empty() ? "" : files.inputs;
  const std::string lab_key = files.file.empty() ? "" : files.labels;
  for (const auto& [in_path, lab_path] : pairs) {
    TALLY_ASSIGN_OR_RETURN(MappedArray in, OpenArray(in_path, in_key));
    TALLY_ASSIGN_OR_RETURN(MappedArray lab, OpenArray(lab_path, lab_key));
    TALLY_RETURN_IF_ERROR(
        a->AddShard(std::move(in), std::move(lab), sample_shape, num_classes));
  }
  return std::shared_ptr<const NpyArrays>(std::move(a));
}

void NpyArrays::Describe(Fingerprint* f) const {
  for (const Shard& s : shards_) {
    for (const MappedArray* a : {&s.inputs, &s.labels}) {
      f->AddFile(a->file->size());
      f->Add(absl::string_view(a->file->data(),
                               static_cast<size_t>(a->header.data_offset)));
    }
  }
}

absl::Status NpyArrays::Gather(std::span<const int64_t> indices,
                               const GatherContext& /*context*/, float* x,
                               int32_t* y) const {
  const int64_t n = sample_values_;
  int64_t bytes = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    // The shard holding the sample: the last that begins at or before it.
    auto it = std::upper_bound(
        shards_.begin(), shards_.end(), indices[i],
        [](int64_t v, const Shard& sh) { return v < sh.begin; });
    const Shard& sh = *(it - 1);
    const int64_t s = indices[i] - sh.begin;
    const NpyHeader& ih = sh.inputs.header;
    const char* in = sh.inputs.file->data() + ih.data_offset;
    const char* lab = sh.labels.file->data() + sh.labels.header.data_offset;
    float* dst = x + static_cast<int64_t>(i) * n;
    switch (ih.type) {
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
          dst[k] = static_cast<float>(ValueAt(in, ih.type, s * n + k));
    }
    y[i] = static_cast<int32_t>(ValueAt(lab, sh.labels.header.type, s));
    bytes += n * ih.width + sh.labels.header.width;
  }
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace tally
