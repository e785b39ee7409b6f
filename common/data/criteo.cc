#include "common/data/criteo.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tally {

namespace {

constexpr int kFileBits = 48;  // a line's offset; the file's index above
constexpr int64_t kMaxFiles = int64_t{1} << 16;
constexpr int64_t kDescribedBytes = 4096;

// A decimal integer: an optional '-' and 1 to 18 digits.
bool ParseInteger(absl::string_view s, int64_t* out) {
  bool negative = false;
  if (!s.empty() && s[0] == '-') {
    negative = true;
    s.remove_prefix(1);
  }
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = negative ? -v : v;
  return true;
}

// 1 to 16 hexadecimal digits, as the 64 bits of an id.
bool ParseHex(absl::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = static_cast<int64_t>(v);
  return true;
}

// A line of the log is a label and 39 fields, a few hundred bytes: one
// past this is not a Criteo line (a binary file, or a sparse one), found
// without reading the rest of the file.
constexpr int64_t kMaxLineBytes = int64_t{1} << 20;

// Lines of a file: its '\n's, and one more for a last line without one.
absl::StatusOr<int64_t> CountLines(const MappedFile& f) {
  const char* p = f.data();
  const char* end = p + f.size();
  int64_t n = 0;
  while (p < end) {
    const size_t span =
        static_cast<size_t>(std::min<int64_t>(end - p, kMaxLineBytes + 1));
    const void* nl = std::memchr(p, '\n', span);
    ++n;
    if (nl == nullptr && span > static_cast<size_t>(kMaxLineBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ":", n, ": a line over ", kMaxLineBytes,
          " bytes (not a Criteo log)"));
    }
    if (nl == nullptr) break;
    p = static_cast<const char*>(nl) + 1;
  }
  return n;
}

// One field's value into *x (field 0, the label, into *y).
absl::Status ParseField(absl::string_view v, int64_t field,
                        int64_t integer_features, int64_t* x, int32_t* y) {
  if (field == 0) {
    if (v != "0" && v != "1") {
      return absl::InvalidArgumentError("field 1 (the label) is not 0 or 1");
    }
    *y = v[0] - '0';
    return absl::OkStatus();
  }
  if (v.empty()) {
    *x = 0;  // missing
  } else if (field <= integer_features) {
    if (!ParseInteger(v, x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("field ", field + 1, " (I", field,
                       ") is not a decimal integer"));
    }
  } else if (!ParseHex(v, x)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field ", field + 1, " (C", field - integer_features,
        ") is not 1 to 16 hexadecimal digits"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseCriteoLine(absl::string_view line, int64_t integer_features,
                             int64_t categorical_features, int64_t* x,
                             int32_t* y) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) return absl::InvalidArgumentError("an empty line");
  const int64_t fields = 1 + integer_features + categorical_features;
  int64_t field = 0;  // fields seen
  size_t at = 0;
  while (true) {
    const size_t tab = line.find('\t', at);
    const size_t stop = tab == absl::string_view::npos ? line.size() : tab;
    if (field < fields) {
      TALLY_RETURN_IF_ERROR(ParseField(line.substr(at, stop - at), field,
                                       integer_features,
                                       field > 0 ? &x[field - 1] : nullptr, y));
    }
    ++field;
    if (tab == absl::string_view::npos) break;
    at = tab + 1;
  }
  if (field != fields) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " tab-separated fields, not ", fields, " (a label, ",
        integer_features, " integer and ", categorical_features,
        " categorical features)"));
  }
  return absl::OkStatus();
}

namespace {

// One log file, mapped: plain text of at most 2^48 bytes.
absl::StatusOr<std::shared_ptr<const MappedFile>> MapLog(
    const std::string& path) {
  if (absl::EndsWith(path, ".gz")) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": compressed; dataset.name: criteo reads plain text "
              "(gunzip it first)"));
  }
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f,
                         MappedFile::Open(path));
  if (f->size() >= (int64_t{1} << kFileBits))
    return absl::InvalidArgumentError(absl::StrCat(path, ": over 2^48 bytes"));
  return f;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CriteoLines>> CriteoLines::Open(
    const CriteoOptions& o) {
  if (static_cast<int64_t>(o.files.size()) > kMaxFiles) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.files.size(), " files; at most ", kMaxFiles));
  }
  std::shared_ptr<CriteoLines> c(new CriteoLines);
  c->integer_ = o.integer_features;
  c->categorical_ = o.categorical_features;
  std::vector<int64_t> counts;
  for (const std::string& path : o.files) {
    TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f, MapLog(path));
    TALLY_ASSIGN_OR_RETURN(const int64_t lines, CountLines(*f));
    counts.push_back(lines);
    c->lines_ += counts.back();
    c->files_.push_back(std::move(f));
  }
  const int64_t lo = static_cast<int64_t>(std::floor(o.begin * c->lines_));
  const int64_t hi = static_cast<int64_t>(std::floor(o.end * c->lines_));
  c->starts_.reserve(static_cast<size_t>(std::max<int64_t>(0, hi - lo)));
  std::vector<int64_t> x(static_cast<size_t>(o.integer_features +
                                             o.categorical_features));
  int64_t line = 0;  // across every file
  for (size_t fi = 0; fi < c->files_.size() && line < hi; ++fi) {
    const MappedFile& f = *c->files_[fi];
    if (line + counts[fi] <= lo) {
      line += counts[fi];
      continue;
    }
    const char* p = f.data();
    const char* end = p + f.size();
    for (int64_t k = 1; p < end && line < hi; ++k, ++line) {
      const char* nl = static_cast<const char*>(
          std::memchr(p, '\n', static_cast<size_t>(end - p)));
      const char* stop = nl == nullptr ? end : nl;
      if (line >= lo) {
        int32_t y;
        absl::Status s = ParseCriteoLine(
            absl::string_view(p, static_cast<size_t>(stop - p)),
            o.integer_features, o.categorical_features, x.data(), &y);
        if (!s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(f.path(), ":", k, ": ", s.message()));
        }
        c->starts_.push_back(static_cast<uint64_t>(fi) << kFileBits |
                             static_cast<uint64_t>(p - f.data()));
      }
      p = stop + 1;
    }
  }
  for (const auto& f : c->files_) f->AdviseRandom();
  return std::shared_ptr<const CriteoLines>(std::move(c));
}

CriteoLines::Line CriteoLines::LineAt(int64_t i) const {
  const uint64_t s = starts_[static_cast<size_t>(i)];
  const MappedFile& f = *files_[s >> kFileBits];
  const char* at = f.data() + (s & ((uint64_t{1} << kFileBits) - 1));
  const char* end = f.data() + f.size();
  const void* nl = std::memchr(at, '\n', static_cast<size_t>(end - at));
  return {at, (nl == nullptr ? end : static_cast<const char*>(nl)) - at};
}

absl::Status CriteoLines::GatherIds(std::span<const int64_t> indices,
                                    const GatherContext& /*context*/,
                                    int64_t* x, int32_t* y) const {
  const int64_t numel = integer_ + categorical_;
  for (size_t i = 0; i < indices.size(); ++i) {
    const Line l = LineAt(indices[i]);
    // Checked when opened: a failure now means the file changed since.
    absl::Status s = ParseCriteoLine(
        absl::string_view(l.at, static_cast<size_t>(l.size)), integer_,
        categorical_, x + static_cast<int64_t>(i) * numel, y + i);
    if (!s.ok()) {
      const uint64_t f = starts_[static_cast<size_t>(indices[i])] >> kFileBits;
      return absl::DataLossError(absl::StrCat(
          files_[f]->path(), ": changed since it was opened: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CriteoLines::Gather(std::span<const int64_t> /*indices*/,
                                 const GatherContext& /*context*/,
                                 float* /*x*/, int32_t* /*y*/) const {
  return absl::FailedPreconditionError(
      "criteo samples are int64 (counts and ids), not floats");
}

void CriteoLines::Describe(Fingerprint* f) const {
  for (const auto& file : files_) {
    f->AddFile(file->size());
    f->Add(absl::string_view(
        file->data(),
        static_cast<size_t>(std::min(file->size(), kDescribedBytes))));
  }
  f->Add(integer_);
  f->Add(categorical_);
  f->Add(lines_);
}

}  // namespace tally
