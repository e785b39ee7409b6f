#include "server/control/table_export.h"

#include <algorithm>
#include <climits>
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
      held_(tables_.size(), std::vector<int64_t>(slots_.size(), 0)),
      cursors_(slots_.size()) {}

absl::Status TableExport::Prepare() {
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (!tables_[t].dynamic()) continue;
    for (size_t s = 0; s < slots_.size(); ++s) {
      TALLY_ASSIGN_OR_RETURN(
          v1::ReadTableResponse r,
          slots_[s]->ReadTable(job_id_, map_version_, static_cast<int>(t),
                               INT64_MAX, 0));
      // A slot's rows are bounded by what one process can hold (4 TiB of
      // values): more is a broken answer.
      if (r.total_rows() < 0 ||
          r.total_rows() > (int64_t{1} << 40) / tables_[t].dim ||
          r.rows_size() != 0) {
        return absl::DataLossError(absl::StrCat(
            "table ", Quoted(tables_[t].name), ": the shard of slot ", s,
            " said it holds ", r.total_rows(), " rows"));
      }
      held_[t][s] = r.total_rows();
    }
  }
  return absl::OkStatus();
}

std::vector<LaterTensor> TableExport::Tensors() const {
  std::vector<LaterTensor> out;
  for (size_t i = 0; i < tables_.size(); ++i) {
    const EmbeddingTableSpec& t = tables_[i];
    if (!t.dynamic()) {
      out.push_back({absl::StrCat(t.name, ".weight"), "F32",
                     {t.num_embeddings, t.dim},
                     t.num_embeddings * t.dim * int64_t{4}});
      continue;
    }
    int64_t n = 0;
    for (int64_t h : held_[i]) n += h;
    out.push_back({absl::StrCat(t.name, ".ids"), "I64", {n}, n * 8});
    out.push_back({absl::StrCat(t.name, ".rows"), "F32", {n, t.dim},
                   n * t.dim * int64_t{4}});
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
  if (!c.started) c.next_start = t.dynamic() ? INT64_MIN : 0;
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
  // Ascending from where the read started.
  int64_t last = c.next_start;
  for (int i = 0; i < r.rows_size(); ++i) {
    const int64_t row = r.rows(i);
    const bool ordered = i == 0 ? row >= last : row > last;
    if (!ordered || (!t.dynamic() && row >= t.num_embeddings) ||
        SlotOfRow(row, t.salt, static_cast<int>(slots_.size())) != slot)
      return bad(absl::StrCat("row ", row, " is out of order, outside the ",
                              t.num_embeddings, " rows, or not its slot's"));
    last = row;
  }
  c.rows.assign(r.rows().begin(), r.rows().end());
  c.values = std::move(*r.mutable_values());
  c.at = 0;
  if (!c.rows.empty()) {
    c.started = true;
    c.next_start = last == INT64_MAX ? last : last + 1;
  }
  c.done = r.rows_size() < max_rows || last == INT64_MAX;
  return absl::OkStatus();
}

void TableExport::Advance() {
  while (table_ < tables_.size()) {
    const EmbeddingTableSpec& t = tables_[table_];
    if (!t.dynamic() && row_ < t.num_embeddings) return;
    if (t.dynamic()) {
      while (slot_ < static_cast<int>(slots_.size()) &&
             given_ >= held_[table_][slot_]) {
        ++slot_;
        given_ = 0;
      }
      if (slot_ < static_cast<int>(slots_.size())) return;
      if (pass_ == 0) {  // the ids given: the rows, from the first slot
        pass_ = 1;
        slot_ = 0;
        given_ = 0;
        cursors_.assign(slots_.size(), Cursor{});
        continue;
      }
    }
    ++table_;
    row_ = 0;
    pass_ = slot_ = 0;
    given_ = 0;
    cursors_.assign(slots_.size(), Cursor{});
  }
}

absl::StatusOr<std::string> TableExport::Next() {
  Advance();  // past tables (or slots) of no rows
  if (table_ == tables_.size()) return std::string();
  absl::StatusOr<std::string> out =
      tables_[table_].dynamic() ? NextDynamic() : NextFixed();
  Advance();
  return out;
}

absl::StatusOr<std::string> TableExport::NextFixed() {
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

absl::StatusOr<std::string> TableExport::NextDynamic() {
  const EmbeddingTableSpec& t = tables_[table_];
  Cursor& c = cursors_[slot_];
  TALLY_RETURN_IF_ERROR(Refill(slot_));
  const int64_t n = static_cast<int64_t>(c.rows.size());
  if (n == 0 || given_ + n > held_[table_][slot_] ||
      (c.done && given_ + n != held_[table_][slot_])) {
    return absl::DataLossError(absl::StrCat(
        "table ", Quoted(t.name), ": the shard of slot ", slot_, " said it "
        "holds ", held_[table_][slot_], " rows and sent ", given_ + n,
        c.done ? "" : " or more"));
  }
  given_ += n;
  if (pass_ == 1) return std::move(c.values);
  std::string ids(static_cast<size_t>(n) * 8, '\0');
  std::memcpy(ids.data(), c.rows.data(), ids.size());
  return ids;
}

}  // namespace tally
