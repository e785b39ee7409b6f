// An ended job's embedding tables as the tail of its .safetensors file
// (tally fetch, docs/cluster.md "Sparse tables"): each table as the
// tensor "NAME.weight", float32 [num_embeddings, dim], the weight of the
// model's nn.Embedding or nn.EmbeddingBag of that name, so that the file
// loads into the model with load_state_dict(strict=True).
//
// The tables never pass through the coordinator whole: they are read in
// row order, a block of rows at a time (1 MiB), from the shards that held
// the job's slots when it ended (ShardControl::ReadTable); each shard
// sends the rows of the block it made, and every other row is its initial
// value (InitRow), which no step changed. A shard's answer is checked:
// rows in order, inside the table, of its slot, with dim values each.
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
    bool done = false;       // the slot has no rows past `rows`
  };
  // Reads the slot's next rows of the current table.
  absl::Status Refill(int slot);

  const std::string job_id_;
  const int64_t map_version_;
  const std::vector<EmbeddingTableSpec> tables_;
  const uint64_t seed_;
  const std::vector<std::shared_ptr<ShardControl>> slots_;
  size_t table_ = 0;  // the table being read
  int64_t row_ = 0;   // its next row
  std::vector<Cursor> cursors_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_TABLE_EXPORT_H_
