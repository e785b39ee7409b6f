#include "common/data/csv.h"

#include <charconv>
#include <cmath>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/data/data_file.h"
#include "common/status_macros.h"

namespace tally {

namespace {

// A cell without the spaces and the double quotes around it.
absl::string_view Trim(absl::string_view cell) {
  while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t'))
    cell.remove_prefix(1);
  while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t' ||
                           cell.back() == '\r'))
    cell.remove_suffix(1);
  if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') {
    cell.remove_prefix(1);
    cell.remove_suffix(1);
  }
  return cell;
}

bool ParseNumber(absl::string_view cell, double* out) {
  if (cell.empty()) return false;
  const char* end = cell.data() + cell.size();
  auto [p, ec] = std::from_chars(cell.data(), end, *out);
  // Finite, and within float32's range (what a sample holds).
  return ec == std::errc() && p == end && std::isfinite(*out) &&
         std::fabs(*out) <= 3.4028234663852886e38;
}

absl::Status At(const std::string& name, int64_t line, int64_t column,
                absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ":", line, ":", column, ": ", why));
}

// The columns of the label and of each feature, from the header.
absl::Status Columns(const std::vector<absl::string_view>& header,
                     const std::string& name, const CsvOptions& o, int* label,
                     std::vector<int>* features) {
  std::map<std::string, int, std::less<>> index;
  for (size_t c = 0; c < header.size(); ++c) {
    if (!index.emplace(std::string(Trim(header[c])), static_cast<int>(c))
             .second) {
      return At(name, 1, static_cast<int64_t>(c) + 1,
                "a second column of the same name");
    }
  }
  auto find = [&](const std::string& col) -> absl::StatusOr<int> {
    auto it = index.find(col);
    if (it == index.end()) {
      return At(name, 1, 1,
                absl::StrCat("the header has no column '", col, "'"));
    }
    return it->second;
  };
  absl::StatusOr<int> l = find(o.label);
  if (!l.ok()) return l.status();
  *label = *l;
  if (o.features.empty()) {
    for (int c = 0; c < static_cast<int>(header.size()); ++c)
      if (c != *label) features->push_back(c);
  } else {
    for (const std::string& f : o.features) {
      absl::StatusOr<int> c = find(f);
      if (!c.ok()) return c.status();
      if (*c == *label) {
        return At(name, 1, *c + 1,
                  absl::StrCat("'", f, "' is the label, not a feature"));
      }
      features->push_back(*c);
    }
  }
  if (features->empty()) return At(name, 1, 1, "no feature columns");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> ParseCsv(absl::string_view text, const std::string& name,
                                 const CsvOptions& o) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  while (!lines.empty() && Trim(lines.back()).empty()) lines.pop_back();
  if (lines.empty()) return At(name, 1, 1, "no header row");
  const std::vector<absl::string_view> header = absl::StrSplit(lines[0], ',');
  int label = 0;
  std::vector<int> features;
  if (absl::Status s = Columns(header, name, o, &label, &features); !s.ok())
    return s;
  Dataset d;
  d.num_classes = o.num_classes;
  d.sample_shape = {static_cast<int64_t>(features.size())};
  d.features.reserve((lines.size() - 1) * features.size());
  d.labels.reserve(lines.size() - 1);
  for (size_t i = 1; i < lines.size(); ++i) {
    const int64_t line = static_cast<int64_t>(i) + 1;
    const std::vector<absl::string_view> cells = absl::StrSplit(lines[i], ',');
    if (cells.size() != header.size()) {
      return At(name, line, 1,
                absl::StrCat(cells.size(), " cells; the header has ",
                             header.size()));
    }
    double v = 0;
    if (!ParseNumber(Trim(cells[label]), &v) || v != std::floor(v) || v < 0 ||
        v >= o.num_classes) {
      return At(name, line, label + 1,
                absl::StrCat("the label is not an integer in [0, ",
                             o.num_classes, ") (dataset.classes)"));
    }
    d.labels.push_back(static_cast<int32_t>(v));
    for (int c : features) {
      if (!ParseNumber(Trim(cells[c]), &v)) {
        return At(name, line, c + 1,
                  "not a number");
      }
      d.features.push_back(static_cast<float>(v));
    }
  }
  return d;
}

absl::StatusOr<Dataset> LoadCsv(const std::string& path,
                                const CsvOptions& options) {
  TALLY_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return ParseCsv(text, path, options);
}

}  // namespace tally
