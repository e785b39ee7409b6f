// A job's table rows on disk, written by the shard that holds them
// (tally-server --table_dir, docs/cluster.md "Sparse tables"): at each of
// the coordinator's checkpoints every range with tables writes one file,
// a base (every row it holds) or a delta (the rows stepped since its last
// file, and the rows evicted since). A range's files at version V, base
// first, are its chain; the coordinator's checkpoint keeps every range's
// chain, and a range placed again loads, from all of them in order, the
// rows its slot now owns.
//
// The file: "TALLYTBL", a format number, then the header (job, version,
// slot, slots, whether a base) and each table's part (its index, dim,
// optimizer slots a row, rows, dropped rows, the rows' values and slots),
// all little-endian, and a CRC-32 (zlib's) of everything before it last.
// Written to a temporary name, fsynced and renamed; a file whose CRC does
// not match, or of another job, is kDataLoss.
#ifndef TALLY_SERVER_DATA_TABLE_CHECKPOINT_H_
#define TALLY_SERVER_DATA_TABLE_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tally {

struct TableRowsFile {
  std::string job_id;
  int64_t version = 0;  // the steps closed when it was taken
  int32_t slot = 0, slots = 1;
  bool base = false;  // every row held, not a delta
  struct Part {
    int32_t table = 0;
    int64_t dim = 0;
    int32_t slots = 0;  // optimizer values a row, dim each
    std::vector<int64_t> rows;
    std::vector<int64_t> dropped;  // evicted since the last file
    std::vector<float> values;     // rows * dim
    std::vector<float> state;      // rows * slots * dim
  };
  std::vector<Part> parts;
  int64_t bytes() const;  // the file's size, near enough
};

absl::Status WriteTableFile(const std::string& path, const TableRowsFile& f);
absl::StatusOr<TableRowsFile> ReadTableFile(const std::string& path,
                                            const std::string& job_id);

}  // namespace tally

#endif  // TALLY_SERVER_DATA_TABLE_CHECKPOINT_H_
