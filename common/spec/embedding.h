// Sparse embedding tables (model.embeddings): their spec, and the
// arithmetic every program must agree on bit for bit: which row of a table
// an input id is, which virtual bucket and so which shard a row lives on,
// and a row's initial values.
//
// A table is the weight of one nn.Embedding or nn.EmbeddingBag of a Python
// model, named by its module path. Its rows are not in the flat vector:
// they live on the shards, hashed into kTableBuckets virtual buckets that
// the shard map's slots own in contiguous runs (slot i of k owns buckets
// [i*B/k, (i+1)*B/k)), so that a table spreads over every shard of its job
// and a change of shards would move whole buckets, never every row. A
// worker pulls, for each step, only the rows its batch touches, and pushes
// their gradients back (docs/cluster.md, "Sparse tables").
#ifndef TALLY_COMMON_SPEC_EMBEDDING_H_
#define TALLY_COMMON_SPEC_EMBEDDING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tally {

// Virtual buckets a table's rows hash into. Fixed for the life of every
// job (a row's bucket is part of where it lives).
inline constexpr int kTableBuckets = 4096;

// How raw input ids become rows.
enum class TableIds {
  kHashed,   // row = hash(id, the table's salt) mod num_embeddings
  kDirect,   // row = id, which must be in [0, num_embeddings)
  kDynamic,  // row = id, any int64 (dynamic: true; num_embeddings 0)
};

enum class TableInit {
  kNormal,   // N(0, scale^2); scale 1 by default, as nn.Embedding
  kUniform,  // U(-scale, scale); sqrt(1 / num_embeddings) by default
  kZeros,
};

// A table's own optimizer, applied by the shards to the rows pushed.
struct TableOptimizer {
  // kAdam: lazy Adam (torch.optim.SparseAdam): moments of the rows a step
  // touched only, bias correction by the job's step.
  enum class Type { kSgd, kAdagrad, kAdam };
  Type type = Type::kSgd;
  double lr = 0.01;  // the job's optimizer.lr unless given; constant
  double weight_decay = 0.0;  // sgd, adagrad
  // Adagrad (torch.optim.Adagrad: lr_decay 0): eps 1e-10; Adam: 1e-8
  double eps = 1e-10;
  double initial_accumulator_value = 0.0;
  double beta1 = 0.9, beta2 = 0.999;  // Adam
  // Values kept a row besides its own: adagrad's sum, Adam's two moments.
  int slots() const {
    return type == Type::kSgd ? 0 : type == Type::kAdagrad ? 1 : 2;
  }
};

struct EmbeddingTableSpec {
  std::string name;  // the module's path in the model, e.g. "emb" or "tables.3"
  int64_t dim = 0;
  int64_t num_embeddings = 0;
  TableIds ids = TableIds::kHashed;
  // nn.EmbeddingBag's mode ("sum" or "mean"); empty: an nn.Embedding.
  std::string combiner;
  TableInit init = TableInit::kNormal;
  double init_scale = 1.0;
  TableOptimizer optimizer;
  // The input columns (of a 1-D int64 sample: clicks) whose ids the table
  // looks up: the worker then pulls the step's rows of every such table
  // before the forward pass, in one message per shard. Empty: each lookup
  // pulls its rows as it runs.
  std::vector<int64_t> features;
  uint64_t salt = 0;  // TableSalt(name)
  // Dynamic tables only (ids kDynamic): the rows the table may hold over
  // all its shards (each shard its share, ceil(max_rows / shards); 0:
  // bounded by --max_table_bytes alone); rows not stepped for this many
  // steps are dropped (0: never); an id gets a row once this many pulls
  // asked for it (1: at once), before which it reads as its initial
  // values and its gradients are dropped.
  int64_t max_rows = 0;
  int64_t evict_after_steps = 0;
  int64_t min_count = 1;
  bool dynamic() const { return ids == TableIds::kDynamic; }
};

// A table's salt: FNV-1a of its name.
uint64_t TableSalt(absl::string_view name);
// The row of `id` in a table of `n` rows (kHashed).
int64_t HashedRow(int64_t id, uint64_t salt, int64_t n);
// The virtual bucket of `row`, and the slot (of `slots`) that owns it.
int BucketOf(int64_t row, uint64_t salt);
int SlotOfBucket(int bucket, int slots);
inline int SlotOfRow(int64_t row, uint64_t salt, int slots) {
  return SlotOfBucket(BucketOf(row, salt), slots);
}
// The initial values of `row` (dim floats into out), from the job's seed:
// the same whichever shard or worker makes them.
void InitRow(const EmbeddingTableSpec& table, uint64_t seed, int64_t row,
             float* out);

}  // namespace tally

#endif  // TALLY_COMMON_SPEC_EMBEDDING_H_
