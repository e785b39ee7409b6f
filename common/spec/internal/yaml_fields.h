// The job spec's field readers: each reads one field of a YAML mapping,
// checks its type and range, and names the field's path in the
// kInvalidArgument it returns (e.g. "training.epochs: must be in [1,
// 1000000], got 0"). A missing field leaves the output as it was (its
// default). Internal to common/spec: the section parsers share them.
//
// All functions are thread-safe (they touch only their arguments).
#ifndef TALLY_COMMON_SPEC_INTERNAL_YAML_FIELDS_H_
#define TALLY_COMMON_SPEC_INTERNAL_YAML_FIELDS_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace tally::spec_internal {

// The largest size of one dimension a spec may name.
inline constexpr int64_t kMaxDim = int64_t{1} << 24;

// kInvalidArgument "path: what".
absl::Status FieldError(const std::string& path, absl::string_view what);

// `path.key`, or `key` at the top level (an empty path).
std::string Join(const std::string& path, absl::string_view key);

// Rejects keys of `node` (a map) that are not in `allowed`.
absl::Status CheckKeys(const YAML::Node& node, const std::string& path,
                       const std::set<std::string>& allowed);

// parent[key] into *out, when present: an integer in [min, max], a finite
// number, true or false, a scalar.
absl::Status ReadInt(const YAML::Node& parent, const std::string& path,
                     const char* key, int64_t min, int64_t max, int64_t* out);
absl::Status ReadDouble(const YAML::Node& parent, const std::string& path,
                        const char* key, double* out);
absl::Status ReadBool(const YAML::Node& parent, const std::string& path,
                      const char* key, bool* out);
absl::Status ReadString(const YAML::Node& parent, const std::string& path,
                        const char* key, std::string* out);

// A tensor's shape: a list of at most 8 sizes in [min, kMaxDim], appended
// to *out. Unlike the readers above, a missing node is an error.
absl::Status ReadShape(const YAML::Node& shape, const std::string& at,
                       int64_t min, Shape* out);

}  // namespace tally::spec_internal

#endif  // TALLY_COMMON_SPEC_INTERNAL_YAML_FIELDS_H_
