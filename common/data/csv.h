// Tables of numbers as CSV files (dataset.name: csv, docs/job-spec.md): a
// header row naming the columns, then one sample per row; the label is one
// column, named, and the features are the columns named (or all the
// others), in that order. Cells are numbers only (spaces around them and
// double quotes are allowed); anything else is an error naming the file,
// the line and the column, never quoting the file's bytes. Read whole into
// memory (a regular file of at most kMaxWholeFileBytes): a table is small next to
// the images and arrays that need mapping.
#ifndef TALLY_COMMON_DATA_CSV_H_
#define TALLY_COMMON_DATA_CSV_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/dataset.h"

namespace tally {

struct CsvOptions {
  std::string label;                  // the label column's name
  std::vector<std::string> features;  // empty: every other column
  int num_classes = 0;                // labels are integers in [0, this)
};

// The samples of CSV text (a file's whole content); `name` is the file's,
// for errors: kInvalidArgument with "NAME:LINE:COLUMN: ..." for a cell that
// is not a number or a label out of range, a row with another number of
// cells than the header, a column named that the header lacks.
absl::StatusOr<Dataset> ParseCsv(absl::string_view text, const std::string& name,
                                 const CsvOptions& options);

// ParseCsv of a file (kNotFound when it is not there; kFailedPrecondition
// for one that is not a regular file or is larger than kMaxWholeFileBytes).
absl::StatusOr<Dataset> LoadCsv(const std::string& path,
                                const CsvOptions& options);

}  // namespace tally

#endif  // TALLY_COMMON_DATA_CSV_H_
