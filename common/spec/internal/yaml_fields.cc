#include "common/spec/internal/yaml_fields.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tally::spec_internal {

absl::Status FieldError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string Join(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// Rejects keys of `node` (a map) that are not in `allowed`.
absl::Status CheckKeys(const YAML::Node& node, const std::string& path,
                       const std::set<std::string>& allowed) {
  if (!node.IsMap()) {
    return FieldError(path.empty() ? "document" : path, "must be a mapping");
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    if (!allowed.count(key)) {
      return FieldError(Join(path, key),
                        absl::StrCat("unknown field (known: ",
                                     absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadInt(const YAML::Node& parent, const std::string& path,
                     const char* key, int64_t min, int64_t max, int64_t* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  const std::string p = Join(path, key);
  int64_t v = 0;
  if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
    return FieldError(
        p, absl::StrCat("must be an integer, got '",
                        n.IsScalar() ? n.Scalar() : "a non-scalar", "'"));
  }
  if (v < min || v > max) {
    return FieldError(
        p, absl::StrCat("must be in [", min, ", ", max, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadDouble(const YAML::Node& parent, const std::string& path,
                        const char* key, double* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) ||
      !std::isfinite(v)) {
    return FieldError(
        Join(path, key),
        absl::StrCat("must be a finite number, got '",
                     n.IsScalar() ? n.Scalar() : "a non-scalar", "'"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadBool(const YAML::Node& parent, const std::string& path,
                      const char* key, bool* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  bool v = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
    return FieldError(Join(path, key), "must be true or false");
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadString(const YAML::Node& parent, const std::string& path,
                        const char* key, std::string* out) {
  const YAML::Node n = parent[key];
  if (!n) return absl::OkStatus();
  if (!n.IsScalar()) return FieldError(Join(path, key), "must be a string");
  *out = n.Scalar();
  return absl::OkStatus();
}

absl::Status ReadShape(const YAML::Node& shape, const std::string& at,
                       int64_t min, Shape* out) {
  if (!shape || !shape.IsSequence() || shape.size() > 8) {
    return FieldError(at, "must be a list of at most 8 sizes");
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t v = 0;
    if (!shape[d].IsScalar() || !YAML::convert<int64_t>::decode(shape[d], v) ||
        v < min || v > kMaxDim) {
      return FieldError(
          at, absl::StrCat("sizes must be in [", min, ", ", kMaxDim, "]"));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

}  // namespace tally::spec_internal
