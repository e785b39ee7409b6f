// One job's embedding tables on one shard (model.embeddings): the rows
// whose virtual buckets this range's slot owns, their optimizer slots, and
// their counters. Rows are made on first touch with their initial values
// (common/spec/embedding.h's InitRow), so a table costs memory for the rows
// its batches touched, and a row's first value is the same on whichever
// shard makes it.
//
// A dynamic table (dynamic: true) keys its rows by the raw id (any int64)
// and may bound itself: max_rows (this slot's share of it), eviction of
// rows not stepped for evict_after_steps steps (swept every quarter of
// that), and a frequency filter (min_count): an id gets its row once
// min_count pulls have asked for it, counted in a counting Bloom filter
// of 2^20 8-bit counters (1 MiB a table, two hashes, as Monolith's);
// until then it reads as its initial values and its gradients are
// dropped.
//
// The optimizers are PyTorch's rules on the rows a step touched (sgd,
// adagrad, lazy adam: common/optim/row_optimizer.h, beside the dense
// ones), a row's slots kept with it; adam's bias correction counts the
// job's steps (the step closing, counted from 1).
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock.
// CheckRows and CheckRequest read only what construction set (the specs,
// the slot), and so may run beside its other calls.
#ifndef TALLY_SERVER_DATA_SPARSE_TABLE_H_
#define TALLY_SERVER_DATA_SPARSE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/spec/embedding.h"
#include "server/data/table_checkpoint.h"
#include "server/shard_control.h"

namespace tally {

class SparseTables {
 public:
  // The most values one PullRows answer or PushRows request may carry:
  // 1 MiB of them, and at most as many row numbers (10 bytes each at
  // worst), within the 4 MiB message limit.
  static constexpr int64_t kMaxValuesPerMessage = int64_t{1} << 18;
  // The most table blocks (v1::TableRows) one request may have: a worker
  // sends one a table, so this is room to spare over the 256 tables a
  // job may have.
  static constexpr int kMaxBlocksPerMessage = 1024;
  // What a row's index entry costs: a flat_hash_map<int64_t, int64_t>
  // slot (16 bytes) and its control byte, at the map's lowest load. It
  // doubles its slots when 7/8 full, so right after that each entry has
  // 16/7 slots: 17 * 16 / 7 = 38.9 bytes. A budget that counts less lets
  // a shard's index outgrow what it was given.
  static constexpr int64_t kIndexBytesPerRow = 40;
  // And an evicting table's place lists (a row and a step, 8 bytes each).
  static constexpr int64_t kEvictBytesPerRow = 16;
  // The evicted rows noted for a delta beyond the rows held before the
  // next save is made a base instead.
  static constexpr size_t kMaxDroppedNotes = size_t{1} << 16;

  // `budget` (shared by every job's tables on this server) is the bytes
  // the tables may still take; null: unbounded.
  SparseTables(std::vector<EmbeddingTableSpec> specs, uint64_t seed, int slot,
               int slots, std::shared_ptr<std::atomic<int64_t>> budget);
  SparseTables(const SparseTables&) = delete;
  SparseTables& operator=(const SparseTables&) = delete;
  ~SparseTables();  // gives its bytes back to the budget

  int size() const { return static_cast<int>(tables_.size()); }
  const EmbeddingTableSpec& spec(int t) const { return tables_[t].spec; }

  // kInvalidArgument unless `table` is one of the job's and every row is
  // inside it, owned by this slot and listed once.
  absl::Status CheckRows(int table, const int64_t* rows, int64_t n) const;
  // One table's rows in a request (a v1::TableRows, as CheckRequest sees
  // it): `n` row numbers at `rows`.
  struct Block {
    int table = 0;
    const int64_t* rows = nullptr;
    int64_t n = 0;
  };
  // A whole PullRows or PushRows request's rows (`what`: "pull" or "push",
  // for the message): kInvalidArgument past kMaxBlocksPerMessage blocks
  // or kMaxValuesPerMessage values (checked first, so nothing is made of
  // an oversized request), for rows CheckRows refuses, and for a row that
  // two blocks of the request list (it would be read twice, or stepped
  // twice as far). The message names the table and the row.
  absl::Status CheckRequest(const std::vector<Block>& blocks,
                            absl::string_view what) const;
  // The rows' values into out (n * dim floats), making missing rows;
  // kResourceExhausted (nothing made) when the new rows would pass the
  // budget. Rows checked by CheckRows.
  absl::Status Read(int table, const int64_t* rows, int64_t n, float* out);
  // Steps the optimizer on each row with its mean gradient (g: n * dim).
  // A row not held yet starts from its initial values (and its budget is
  // not checked: it was pulled before, unless the table was emptied).
  // In a filtered table (min_count > 1) a row not held is not made: its
  // gradient is dropped (the id has no row yet); so in an evicting one
  // (evicted since its pull). `step` is the step's.
  void Apply(int table, const int64_t* rows, int64_t n, const float* g,
             int64_t step = 0);
  // Step `step` closed: evicts the rows of dynamic tables not stepped for
  // evict_after_steps steps, when a sweep is due.
  void EndStep(int64_t step);

  // Called when new rows would pass the budget, with the bytes missing:
  // frees what it can (an ended job's tables, ShardHost) and says whether
  // it freed any, for Read to try once more. Set before the first Read.
  void set_reclaim(std::function<bool(int64_t)> reclaim) {
    reclaim_ = std::move(reclaim);
  }

  // Tables checkpointed by this shard (--table_dir): the rows stepped and
  // evicted are noted from now on, for TakeSave's deltas.
  void set_checkpointed() { checkpointed_ = true; }
  // The rows to write at a checkpoint: every row held (`base`, or when
  // the notes outgrew kMaxDroppedNotes; the file says which), or those
  // stepped since the last TakeSave and those evicted since. Clears the
  // notes.
  TableRowsFile TakeSave(bool base);
  // A range placed again: the rows of `file` (a chain's, in order) that
  // this slot owns, replacing what an earlier file gave; dropped rows go.
  // kDataLoss for a part that does not fit the job's tables;
  // kResourceExhausted past the budget.
  absl::Status Load(const TableRowsFile& file);

  // The job ended: nothing changes the rows from now on. Orders each
  // table's rows for ReadSorted (8 bytes a row more, taken from the
  // budget). Idempotent.
  void Freeze();
  // Up to `max_rows` of the table's rows from row `start` on, in order:
  // their numbers into *rows, their values (float32) into *values. After
  // Freeze only; thread-safe then.
  void ReadSorted(int table, int64_t start, int64_t max_rows,
                  std::vector<int64_t>* rows, std::string* values) const;

  void CountPull(int table, int64_t rows, int64_t wire_bytes);
  void CountPush(int table, int64_t rows, int64_t wire_bytes);
  // The bytes every table here holds.
  int64_t bytes() const { return bytes_; }
  std::vector<TableMetrics> Metrics() const;

 private:
  struct Table {
    EmbeddingTableSpec spec;
    absl::flat_hash_map<int64_t, int64_t> index;  // row -> its place
    std::vector<float> values;  // dim a row, in order of making
    std::vector<float> accum;   // adagrad's sums; adam's m and v a row
    // Evicting tables: each place's row and the step it was last stepped.
    std::vector<int64_t> rows, stepped;
    std::vector<uint8_t> seen;  // filtered tables: the Bloom counters
    int64_t max_rows = 0;       // this slot's share; 0: unbounded
    std::vector<int64_t> sorted;  // the rows in order, once frozen
    // Checkpointed: rows stepped and rows evicted since the last save;
    // renote: too many evicted, the notes went, the next save is a base.
    absl::flat_hash_set<int64_t> dirty, dropped;
    bool renote = false;
    TableMetrics metrics;
  };
  // A fixed table whose share of rows the budget holds: its values and
  // slots reserved at once, so that growing never copies them (three
  // times their bytes for a moment, which a 4 GiB table cannot spare).
  // Untouched pages of the reservation cost no memory.
  void ReserveShare(Table& t) const;
  // Counts a pull of `row` in a filtered table; whether it has been asked
  // for min_count times now.
  bool Seen(Table& t, int64_t row);
  // Drops the row at `place`, moving the last place into it.
  void Evict(Table& t, int64_t place);
  // Takes `more` bytes from the budget, or none (kResourceExhausted).
  absl::Status Reserve(const Table& t, int64_t missing, int64_t more);
  // What a row of `t` costs, as counted against the budget: its values
  // and optimizer slots, its index entry (kIndexBytesPerRow) and an
  // evicting table's place lists.
  int64_t RowBytes(const Table& t) const;
  // kInvalidArgument unless `table` is one of the job's.
  absl::Status CheckTable(int table) const;
  // CheckRows, with the rows listed so far (in this request's other
  // blocks of the table) in `listed`, to which the rows are added.
  absl::Status CheckRowsIn(int table, const int64_t* rows, int64_t n,
                           absl::flat_hash_set<int64_t>& listed) const;
  // The place of `row`, made with its initial values if missing.
  int64_t Make(Table& t, int64_t row);

  std::vector<Table> tables_;
  const uint64_t seed_;
  const int slot_, slots_;
  std::shared_ptr<std::atomic<int64_t>> budget_;
  std::function<bool(int64_t)> reclaim_;
  int64_t bytes_ = 0;
  bool frozen_ = false;
  bool checkpointed_ = false;
  int64_t last_step_ = 0;  // the last step closed (EndStep)
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SPARSE_TABLE_H_
