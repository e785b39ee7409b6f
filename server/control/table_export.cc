#include "server/control/table_export.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"

namespace tally {

namespace {

// Values a block (and a shard's answer) holds at most: 1 MiB of float32,
// within SparseTables::kMaxValuesPerMessage.
constexpr int64_t kBlockValues = int64_t{1} << 18;

int64_t BlockRows(const EmbeddingTableSpec& t) {
  return std::max<int64_t>(1, kBlockValues / t.dim);
}

}  // namespace

TableExport::TableExport(std::string job_id, int64_t map_version,
                         std::vector<EmbeddingTableSpec> tables,
                         uint64_t seed,
                         std::vector<std::shared_ptr<ShardControl>> slots)
    : job_id_(std::move(job_id)),
      map_version_(map_version),
      tables_(std::move(tables)),
      seed_(seed),
      slots_(std::move(slots)),
      cursors_(slots_.size()) {}

std::vector<LaterTensor> TableExport::Tensors() const {
  std::vector<LaterTensor> out;
  for (const EmbeddingTableSpec& t : tables_) {
    out.push_back({absl::StrCat(t.name, ".weight"), "F32",
                   {t.num_embeddings, t.dim},
                   t.num_embeddings * t.dim * int64_t{4}});
  }
  return out;
}

int64_t TableExport::bytes() const {
  int64_t n = 0;
  for (const LaterTensor& t : Tensors()) n += t.bytes;
  return n;
}

absl::Status TableExport::Refill(int slot) {
  const EmbeddingTableSpec& t = tables_[table_];
  Cursor& c = cursors_[slot];
  const int64_t max_rows = BlockRows(t);
  TALLY_ASSIGN_OR_RETURN(
      v1::ReadTableResponse r,
      slots_[slot]->ReadTable(job_id_, map_version_, static_cast<int>(table_),
                              c.next_start, max_rows));
  const auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(
        "table ", Quoted(t.name), " from the shard of slot ", slot, ": ", why));
  };
  if (r.rows_size() > max_rows)
    return bad(absl::StrCat(r.rows_size(), " rows for ", max_rows, " asked"));
  if (r.values().size() != static_cast<size_t>(r.rows_size() * t.dim * 4))
    return bad(absl::StrCat(r.values().size(), " bytes for ", r.rows_size(),
                            " rows of ", t.dim));
  int64_t last = c.next_start - 1;
  for (int64_t row : r.rows()) {
    if (row <= last || row >= t.num_embeddings ||
        SlotOfRow(row, t.salt, static_cast<int>(slots_.size())) != slot)
      return bad(absl::StrCat("row ", row, " is out of order, outside the ",
                              t.num_embeddings, " rows, or not its slot's"));
    last = row;
  }
  c.rows.assign(r.rows().begin(), r.rows().end());
  c.values = std::move(*r.mutable_values());
  c.at = 0;
  c.next_start = last + 1;
  c.done = r.rows_size() < max_rows;
  return absl::OkStatus();
}

absl::StatusOr<std::string> TableExport::Next() {
  while (table_ < tables_.size() && row_ >= tables_[table_].num_embeddings) {
    ++table_;
    row_ = 0;
    cursors_.assign(slots_.size(), Cursor{});
  }
  if (table_ == tables_.size()) return std::string();
  const EmbeddingTableSpec& t = tables_[table_];
  const int64_t dim = t.dim;
  const int64_t n = std::min(BlockRows(t), t.num_embeddings - row_);
  std::string out(static_cast<size_t>(n * dim * 4), '\0');
  std::vector<float> init(dim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = row_ + i;
    const int slot = SlotOfRow(row, t.salt, static_cast<int>(slots_.size()));
    Cursor& c = cursors_[slot];
    if (c.at == c.rows.size() && !c.done) TALLY_RETURN_IF_ERROR(Refill(slot));
    char* to = out.data() + i * dim * 4;
    if (c.at < c.rows.size() && c.rows[c.at] == row) {
      std::memcpy(to, c.values.data() + c.at * dim * 4, dim * 4);
      ++c.at;
    } else {
      InitRow(t, seed_, row, init.data());
      std::memcpy(to, init.data(), dim * 4);
    }
  }
  row_ += n;
  return out;
}

}  // namespace tally
