// An ended job's embedding tables as the tail of its .safetensors file
// (tally fetch, docs/cluster.md "Sparse tables"):
//   a fixed table    "NAME.weight", float32 [num_embeddings, dim]: the
//                    weight of the model's nn.Embedding or nn.EmbeddingBag
//                    of that name, so that the file loads into the model
//                    with load_state_dict(strict=True);
//   a dynamic table  "NAME.ids", int64 [n], and "NAME.rows", float32
//                    [n, dim]: the n rows it holds, each under its id
//                    (shard by shard, ascending within each).
//
// The tables never pass through the coordinator whole: they are read a
// block of rows at a time (1 MiB) from the shards that held the job's
// slots when it ended (ShardControl::ReadTable). A fixed table goes in row
// order: each shard sends the rows of the block it made, and every other
// row is its initial value (InitRow), which no step changed. A shard's
// answer is checked: rows in order, inside the table, of its slot, with
// dim values each, as many as it said it holds.
//
// Not thread-safe: one caller reads it from start to end.
#ifndef TALLY_SERVER_CONTROL_TABLE_EXPORT_H_
#define TALLY_SERVER_CONTROL_TABLE_EXPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/safetensors.h"
#include "common/spec/embedding.h"
#include "server/shard_control.h"

namespace tally {

class TableExport {
 public:
  // `slots`: the shard of each slot of the job's last shard map, in order.
  TableExport(std::string job_id, int64_t map_version,
              std::vector<EmbeddingTableSpec> tables, uint64_t seed,
              std::vector<std::shared_ptr<ShardControl>> slots);

  // Asks the shards how many rows each dynamic table holds (the file's
  // header needs them). Before Tensors; the shards' errors.
  absl::Status Prepare();
  // The tensors, for the file's header.
  std::vector<LaterTensor> Tensors() const;
  // Their bytes in all.
  int64_t bytes() const;
  // The next piece of the tensors' bytes, in order (at most 1 MiB); empty
  // once every byte was given. Blocks on the shards (bounded calls). The
  // shard's error, or kDataLoss for an answer that does not fit.
  absl::StatusOr<std::string> Next();

 private:
  // A slot's rows of the current table, read ahead of the block.
  struct Cursor {
    std::vector<int64_t> rows;
    std::string values;
    size_t at = 0;           // the next row of `rows` to use
    int64_t next_start = 0;  // where the next read starts
    bool started = false;    // rows were read (next_start is past one)
    bool done = false;       // the slot has no rows past `rows`
  };
  // Reads the slot's next rows of the current table into its cursor.
  absl::Status Refill(int slot);
  absl::StatusOr<std::string> NextFixed();
  // A dynamic table: its ids (pass 0), then its rows (pass 1), slot by
  // slot.
  absl::StatusOr<std::string> NextDynamic();
  // Moves to the next table (or pass) once this one is given.
  void Advance();

  const std::string job_id_;
  const int64_t map_version_;
  const std::vector<EmbeddingTableSpec> tables_;
  const uint64_t seed_;
  const std::vector<std::shared_ptr<ShardControl>> slots_;
  std::vector<std::vector<int64_t>> held_;  // dynamic: rows per slot
  size_t table_ = 0;  // the table being read
  int64_t row_ = 0;   // a fixed table's next row
  int pass_ = 0;      // a dynamic table's: 0 ids, 1 rows
  int slot_ = 0;      // ... and the slot being read
  int64_t given_ = 0;  // ... rows of that slot given this pass
  std::vector<Cursor> cursors_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_TABLE_EXPORT_H_
