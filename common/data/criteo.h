// Click logs in Criteo's format (dataset.name: criteo, docs/job-spec.md):
// the tab-separated text of the Criteo Display Advertising (Kaggle) and
// Terabyte logs, one sample a line:
//
//   label \t I1 ... I13 \t C1 ... C26
//
// a 0/1 label, integer features (decimal, possibly negative) and hashed
// categorical features (hexadecimal, 8 digits in Criteo's files, at most
// 16). Any feature may be empty: a missing integer reads as 0, a missing
// category as id 0 (as the DLRM reference's preprocessing does). A
// sample's inputs are int64 [integer_features + categorical_features], as
// dataset.name: clicks makes them (common/data/clicks.h), so one model
// trains on either.
//
// The files are mapped (mmap, read-only) and checked line by line when
// opened: a line with another number of fields, a label other than 0 or 1,
// or a value that is not a number is an error naming the file, the line
// and the field, before training starts. The opened source keeps 8 bytes
// a line (where it starts) and parses a sample's line again each time it
// is gathered. Compressed files (.gz) are not read: decompress them first.
// Thread-safe once opened.
#ifndef TALLY_COMMON_DATA_CRITEO_H_
#define TALLY_COMMON_DATA_CRITEO_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/dataset.h"
#include "common/data/npy.h"

namespace tally {

struct CriteoOptions {
  std::vector<std::string> files;  // in order (globs expanded)
  int64_t integer_features = 13;
  int64_t categorical_features = 26;
  // The lines a split takes, as fractions of all the files' lines:
  // [floor(begin * n), floor(end * n)) of n (a held-out fraction f: the
  // training split [0, 1 - f), the test split [1 - f, 1)).
  double begin = 0.0, end = 1.0;
};

// One line's sample (`line` without its '\n'): inputs into x
// (integer_features + categorical_features values) and the label into *y.
// kInvalidArgument saying which field is wrong (1-based, the label is
// field 1), for the caller to prefix with the file and line.
absl::Status ParseCriteoLine(absl::string_view line, int64_t integer_features,
                             int64_t categorical_features, int64_t* x,
                             int32_t* y);

class CriteoLines : public SampleSource {
 public:
  // kNotFound for a missing file; kInvalidArgument "FILE:LINE: ..." for the
  // first line that is not a sample, or for a .gz file.
  static absl::StatusOr<std::shared_ptr<const CriteoLines>> Open(
      const CriteoOptions& options);

  int64_t size() const override {
    return static_cast<int64_t>(starts_.size());
  }
  InputType input_type() const override { return InputType::kInt64; }
  absl::Status Gather(std::span<const int64_t> indices,
                      const GatherContext& context, float* x,
                      int32_t* y) const override;
  absl::Status GatherIds(std::span<const int64_t> indices,
                         const GatherContext& context, int64_t* x,
                         int32_t* y) const override;
  void Describe(Fingerprint* f) const override;
  // Lines in all the files (both splits).
  int64_t lines() const { return lines_; }

 private:
  CriteoLines() = default;
  struct Line {
    const char* at;
    int64_t size;
  };
  Line LineAt(int64_t i) const;

  std::vector<std::shared_ptr<const MappedFile>> files_;
  // Per sample: its file (index into files_) in the top 16 bits, its
  // line's offset in that file below.
  std::vector<uint64_t> starts_;
  int64_t integer_ = 0, categorical_ = 0, lines_ = 0;
};

}  // namespace tally

#endif  // TALLY_COMMON_DATA_CRITEO_H_
