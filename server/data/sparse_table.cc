#include "server/data/sparse_table.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/optim/row_optimizer.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "proto/errors.h"

namespace tally {

namespace {

constexpr int64_t kSeenCounters = int64_t{1} << 20;

}  // namespace

SparseTables::SparseTables(std::vector<EmbeddingTableSpec> specs,
                           uint64_t seed, int slot, int slots,
                           std::shared_ptr<std::atomic<int64_t>> budget)
    : seed_(seed),
      slot_(slot),
      slots_(std::max(1, slots)),
      budget_(std::move(budget)) {
  for (EmbeddingTableSpec& s : specs) {
    Table t;
    t.metrics.name = s.name;
    if (s.min_count > 1) t.seen.assign(kSeenCounters, 0);
    if (s.max_rows > 0) t.max_rows = (s.max_rows + slots_ - 1) / slots_;
    t.spec = std::move(s);
    ReserveShare(t);
    tables_.push_back(std::move(t));
  }
}

void SparseTables::ReserveShare(Table& t) const {
  if (budget_ == nullptr || t.spec.dynamic()) return;
  // This slot's share of the buckets, and a little more for the hash's
  // spread (a few standard deviations of a binomial count).
  const int64_t n = t.spec.num_embeddings;
  const int64_t share = n / slots_ + n / (int64_t{32} * slots_) + 1024;
  const int64_t values = share * t.spec.dim;
  const int64_t slots = values * t.spec.optimizer.slots();
  if ((values + slots) * int64_t{4} > budget_->load()) return;
  try {
    t.values.reserve(static_cast<size_t>(values));
    t.accum.reserve(static_cast<size_t>(slots));
  } catch (const std::bad_alloc&) {
    // A budget larger than the address space allows (strict overcommit):
    // the rows grow as they come instead.
    t.values.shrink_to_fit();
    t.accum.shrink_to_fit();
  }
}

SparseTables::~SparseTables() {
  if (budget_ != nullptr) budget_->fetch_add(bytes_);
}

int64_t SparseTables::RowBytes(const Table& t) const {
  const int slots = 1 + t.spec.optimizer.slots();
  return t.spec.dim * 4 * slots + kIndexBytesPerRow +
         (t.spec.evict_after_steps > 0 ? kEvictBytesPerRow : 0);
}

absl::Status SparseTables::CheckTable(int table) const {
  if (table >= 0 && table < size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "table ", table, ": the job has ", size(), " tables (model.embeddings)"));
}

absl::Status SparseTables::CheckRows(int table, const int64_t* rows,
                                     int64_t n) const {
  absl::flat_hash_set<int64_t> listed;
  return CheckRowsIn(table, rows, n, listed);
}

absl::Status SparseTables::CheckRequest(const std::vector<Block>& blocks,
                                        absl::string_view what) const {
  if (blocks.size() > static_cast<size_t>(kMaxBlocksPerMessage)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", what, " of rows in ", blocks.size(), " table blocks; at most ",
        kMaxBlocksPerMessage, " a request"));
  }
  // Sizes first: the rows' checks below allocate for each row.
  int64_t values = 0;
  for (const Block& b : blocks) {
    TALLY_RETURN_IF_ERROR(CheckTable(b.table));
    values += b.n * tables_[b.table].spec.dim;
  }
  if (values > kMaxValuesPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", what, " of ", values, " row values; at most ",
        kMaxValuesPerMessage, " a request"));
  }
  // A table's rows over all its blocks: each row once in the request.
  std::vector<absl::flat_hash_set<int64_t>> listed(tables_.size());
  for (const Block& b : blocks) {
    TALLY_RETURN_IF_ERROR(CheckRowsIn(b.table, b.rows, b.n, listed[b.table]));
  }
  return absl::OkStatus();
}

absl::Status SparseTables::CheckRowsIn(
    int table, const int64_t* rows, int64_t n,
    absl::flat_hash_set<int64_t>& listed) const {
  TALLY_RETURN_IF_ERROR(CheckTable(table));
  const EmbeddingTableSpec& s = tables_[table].spec;
  listed.reserve(listed.size() + n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    if (!s.dynamic() && (r < 0 || r >= s.num_embeddings)) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", Quoted(s.name), ": row ", r,
                       " is outside its ", s.num_embeddings, " rows"));
    }
    const int owner = SlotOfRow(r, s.salt, slots_);
    if (owner != slot_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", Quoted(s.name), ": row ", r, " belongs to shard ", owner,
          " of ", slots_, ", not this one (", slot_, ")"));
    }
    if (!listed.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", Quoted(s.name), ": row ", r, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Room for `more` values in `v`, growing it by an eighth rather than the
// library's doubling: the rows a table holds are counted against the
// shard's budget, and a doubled vector would hold up to twice them.
void GrowByAnEighth(std::vector<float>& v, int64_t more) {
  const size_t need = v.size() + static_cast<size_t>(more);
  if (more > 0 && need > v.capacity()) v.reserve(need + need / 8);
}

}  // namespace

int64_t SparseTables::Make(Table& t, int64_t row) {
  auto [it, made] = t.index.try_emplace(row, t.metrics.rows);
  if (!made) return it->second;
  const int64_t dim = t.spec.dim;
  GrowByAnEighth(t.values, dim);
  t.values.resize(t.values.size() + dim);
  InitRow(t.spec, seed_, row, t.values.data() + it->second * dim);
  GrowByAnEighth(t.accum, t.spec.optimizer.slots() * dim);
  if (t.spec.optimizer.type == TableOptimizer::Type::kAdagrad) {
    t.accum.resize(t.accum.size() + dim,
                   static_cast<float>(t.spec.optimizer.initial_accumulator_value));
  } else if (t.spec.optimizer.type == TableOptimizer::Type::kAdam) {
    t.accum.resize(t.accum.size() + 2 * dim, 0.0f);  // m, then v
  }
  if (t.spec.evict_after_steps > 0) {
    t.rows.push_back(row);
    t.stepped.push_back(last_step_);  // a row made now is not stale
  }
  const int64_t b = RowBytes(t);
  ++t.metrics.rows;
  t.metrics.bytes += b;
  bytes_ += b;
  return it->second;
}

absl::Status SparseTables::Reserve(const Table& t, int64_t missing,
                                   int64_t more) {
  if (more == 0 || budget_ == nullptr) return absl::OkStatus();
  // Taken from the shared budget at once, or not at all; short, the
  // ended jobs' tables make room first.
  bool reclaimed = false;
  int64_t left = budget_->load();
  while (true) {
    if (left >= more) {
      if (budget_->compare_exchange_weak(left, left - more))
        return absl::OkStatus();
      continue;
    }
    if (reclaimed || !reclaim_ || !reclaim_(more - left)) break;
    reclaimed = true;
    left = budget_->load();
  }
  return WithReason(
      absl::ResourceExhaustedError(absl::StrCat(
          "table ", Quoted(t.spec.name), ": ", missing,
          " new rows would take this shard past its --max_table_bytes (",
          left, " bytes left)")),
      v1::TABLE_FULL);
}

bool SparseTables::Seen(Table& t, int64_t row) {
  const uint64_t h = SplitMix64(static_cast<uint64_t>(row) ^ t.spec.salt);
  uint8_t& a = t.seen[h & (kSeenCounters - 1)];
  uint8_t& b = t.seen[(h >> 32) & (kSeenCounters - 1)];
  if (a < 255) ++a;
  if (b < 255) ++b;
  return std::min(a, b) >= t.spec.min_count;
}

absl::Status SparseTables::Read(int table, const int64_t* rows, int64_t n,
                                float* out) {
  Table& t = tables_[table];
  // Which rows are made now; a filtered table's ids asked for too few
  // times yet read as their initial values, without a row.
  std::vector<char> make(n, 0);
  int64_t missing = 0, filtered = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t.index.contains(rows[i])) continue;
    if (!t.seen.empty() && !Seen(t, rows[i])) {
      ++filtered;
      continue;
    }
    make[i] = 1;
    ++missing;
  }
  if (t.max_rows > 0 && t.metrics.rows + missing > t.max_rows) {
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            "table ", Quoted(t.spec.name), ": ", missing,
            " new rows would pass its max_rows (", t.max_rows,
            " on this shard, which holds ", t.metrics.rows, ")")),
        v1::TABLE_FULL);
  }
  TALLY_RETURN_IF_ERROR(Reserve(t, missing, missing * RowBytes(t)));
  const int64_t dim = t.spec.dim;
  for (int64_t i = 0; i < n; ++i) {
    auto it = t.index.find(rows[i]);
    if (it == t.index.end() && !make[i]) {
      InitRow(t.spec, seed_, rows[i], out + i * dim);
      continue;
    }
    const int64_t at = it != t.index.end() ? it->second : Make(t, rows[i]);
    std::copy_n(t.values.data() + at * dim, dim, out + i * dim);
  }
  t.metrics.rows_created += missing;
  t.metrics.rows_filtered += filtered;
  return absl::OkStatus();
}

void SparseTables::Apply(int table, const int64_t* rows, int64_t n,
                         const float* g, int64_t step) {
  Table& t = tables_[table];
  const int64_t dim = t.spec.dim;
  const TableOptimizer& o = t.spec.optimizer;
  const float lr = static_cast<float>(o.lr);
  const float wd = static_cast<float>(o.weight_decay);
  const float eps = static_cast<float>(o.eps);
  int64_t applied = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Filtered tables make no rows here; in evicting ones a row missing now
    // was evicted after its pull (async: versions pass between them), and
    // starts again from its initial values as an evicted row does.
    if ((!t.seen.empty() || t.spec.evict_after_steps > 0) &&
        !t.index.contains(rows[i]))
      continue;
    ++applied;
    const int64_t before = t.metrics.bytes;
    const int64_t at = Make(t, rows[i]);
    if (!t.stepped.empty()) t.stepped[at] = step;
    if (checkpointed_ && !t.renote) t.dirty.insert(rows[i]);
    if (budget_ != nullptr && t.metrics.bytes > before)
      budget_->fetch_sub(t.metrics.bytes - before);
    float* p = t.values.data() + at * dim;
    const float* gi = g + i * dim;
    // The rules: common/optim/row_optimizer.h.
    if (o.type == TableOptimizer::Type::kAdam) {
      SparseAdamRow(o.lr, o.beta1, o.beta2, o.eps, step + 1, dim, gi, p,
                    t.accum.data() + at * 2 * dim);
    } else if (o.type == TableOptimizer::Type::kSgd) {
      SgdRow(lr, wd, dim, gi, p);
    } else {
      AdagradRow(lr, wd, eps, dim, gi, p, t.accum.data() + at * dim);
    }
  }
  t.metrics.rows_applied += applied;
}

void SparseTables::Evict(Table& t, int64_t place) {
  const int64_t dim = t.spec.dim;
  const int64_t last = static_cast<int64_t>(t.rows.size()) - 1;
  t.index.erase(t.rows[place]);
  if (checkpointed_ && !t.renote) {
    t.dirty.erase(t.rows[place]);
    t.dropped.insert(t.rows[place]);
    // Rows come and go with no save taking the notes (a coordinator
    // without --state_dir): past the rows held, the notes go and the next
    // save is a base.
    if (t.dropped.size() > t.index.size() + kMaxDroppedNotes) {
      t.dirty.clear();
      t.dropped.clear();
      t.renote = true;
    }
  }
  if (place != last) {
    std::copy_n(t.values.data() + last * dim, dim,
                t.values.data() + place * dim);
    const int64_t slots = t.spec.optimizer.slots();
    if (slots > 0) {
      std::copy_n(t.accum.data() + last * slots * dim, slots * dim,
                  t.accum.data() + place * slots * dim);
    }
    t.rows[place] = t.rows[last];
    t.stepped[place] = t.stepped[last];
    t.index[t.rows[place]] = place;
  }
  t.values.resize(last * dim);
  t.accum.resize(last * t.spec.optimizer.slots() * dim);
  t.rows.pop_back();
  t.stepped.pop_back();
  const int64_t b = RowBytes(t);
  --t.metrics.rows;
  t.metrics.bytes -= b;
  ++t.metrics.rows_evicted;
  bytes_ -= b;
  if (budget_ != nullptr) budget_->fetch_add(b);
}

void SparseTables::EndStep(int64_t step) {
  last_step_ = step;
  for (Table& t : tables_) {
    const int64_t after = t.spec.evict_after_steps;
    if (after <= 0 || step % std::max<int64_t>(1, after / 4) != 0) continue;
    // From the end: a place moved into an evicted one was looked at.
    for (int64_t place = static_cast<int64_t>(t.rows.size()) - 1; place >= 0;
         --place) {
      if (step - t.stepped[place] >= after) Evict(t, place);
    }
  }
}

TableRowsFile SparseTables::TakeSave(bool base) {
  TableRowsFile f;
  for (const Table& t : tables_) base = base || t.renote;
  f.base = base;
  f.slot = slot_;
  f.slots = slots_;
  for (int i = 0; i < size(); ++i) {
    Table& t = tables_[i];
    TableRowsFile::Part p;
    p.table = i;
    p.dim = t.spec.dim;
    p.slots = t.spec.optimizer.slots();
    const int64_t dim = p.dim, k = p.slots;
    const auto add = [&](int64_t row, int64_t at) {
      p.rows.push_back(row);
      p.values.insert(p.values.end(), t.values.begin() + at * dim,
                      t.values.begin() + (at + 1) * dim);
      p.state.insert(p.state.end(), t.accum.begin() + at * k * dim,
                     t.accum.begin() + (at + 1) * k * dim);
    };
    if (base) {
      for (const auto& [row, at] : t.index) add(row, at);
    } else {
      for (int64_t row : t.dirty) add(row, t.index.at(row));
      p.dropped.assign(t.dropped.begin(), t.dropped.end());
    }
    t.dirty.clear();
    t.dropped.clear();
    t.renote = false;
    f.parts.push_back(std::move(p));
  }
  return f;
}

absl::Status SparseTables::Load(const TableRowsFile& file) {
  last_step_ = std::max(last_step_, file.version);  // loaded rows are fresh
  for (const TableRowsFile::Part& p : file.parts) {
    if (p.table < 0 || p.table >= size() ||
        p.dim != tables_[p.table].spec.dim ||
        p.slots != tables_[p.table].spec.optimizer.slots()) {
      return absl::DataLossError(absl::StrCat(
          "a table checkpoint's table ", p.table, " (dim ", p.dim, ", ",
          p.slots, " slots) is not one of the job's"));
    }
    Table& t = tables_[p.table];
    const int64_t dim = p.dim, k = p.slots;
    for (int64_t row : p.dropped) {
      auto it = t.index.find(row);
      if (it != t.index.end() && !t.rows.empty()) Evict(t, it->second);
    }
    std::vector<int64_t> mine;
    for (size_t i = 0; i < p.rows.size(); ++i) {
      if (SlotOfRow(p.rows[i], t.spec.salt, slots_) == slot_)
        mine.push_back(static_cast<int64_t>(i));
    }
    // Each new row counted once (a part lists a row once; a later part
    // replaces it). A slot may end past its max_rows here (its share of a
    // table spread over other slots before): new rows are refused then
    // until eviction brings it under.
    absl::flat_hash_set<int64_t> fresh;
    for (int64_t i : mine) {
      if (!t.index.contains(p.rows[i])) fresh.insert(p.rows[i]);
    }
    const int64_t missing = static_cast<int64_t>(fresh.size());
    TALLY_RETURN_IF_ERROR(Reserve(t, missing, missing * RowBytes(t)));
    for (int64_t i : mine) {
      const int64_t at = Make(t, p.rows[i]);
      std::copy_n(p.values.begin() + i * dim, dim, t.values.begin() + at * dim);
      std::copy_n(p.state.begin() + i * k * dim, k * dim,
                  t.accum.begin() + at * k * dim);
    }
    t.metrics.rows_evicted = 0;  // the evictions replayed are not new
  }
  return absl::OkStatus();
}

void SparseTables::Freeze() {
  if (frozen_) return;
  frozen_ = true;
  for (Table& t : tables_) {
    t.sorted.reserve(t.index.size());
    for (const auto& [row, at] : t.index) t.sorted.push_back(row);
    std::sort(t.sorted.begin(), t.sorted.end());
    // The order is memory the rows take from now on: counted, though a
    // freeze cannot be refused (the budget may run below zero until the
    // tables go).
    const int64_t b = static_cast<int64_t>(t.sorted.size() * sizeof(int64_t));
    t.metrics.bytes += b;
    bytes_ += b;
    if (budget_ != nullptr) budget_->fetch_sub(b);
  }
}

void SparseTables::ReadSorted(int table, int64_t start, int64_t max_rows,
                              std::vector<int64_t>* rows,
                              std::string* values) const {
  const Table& t = tables_[table];
  const int64_t dim = t.spec.dim;
  auto it = std::lower_bound(t.sorted.begin(), t.sorted.end(), start);
  const int64_t n = std::min<int64_t>(max_rows, t.sorted.end() - it);
  rows->assign(it, it + n);
  values->resize(static_cast<size_t>(n * dim) * sizeof(float));
  char* out = values->data();
  for (int64_t i = 0; i < n; ++i) {
    const float* p = t.values.data() + t.index.at((*rows)[i]) * dim;
    std::memcpy(out + i * dim * sizeof(float), p, dim * sizeof(float));
  }
}

void SparseTables::CountPull(int table, int64_t rows, int64_t wire_bytes) {
  TableMetrics& m = tables_[table].metrics;
  m.rows_pulled += rows;
  m.pulled_bytes += rows * tables_[table].spec.dim * 4;
  m.pull_wire_bytes += wire_bytes;
}

void SparseTables::CountPush(int table, int64_t rows, int64_t wire_bytes) {
  TableMetrics& m = tables_[table].metrics;
  m.rows_pushed += rows;
  m.pushed_bytes += rows * tables_[table].spec.dim * 4;
  m.push_wire_bytes += wire_bytes;
}

std::vector<TableMetrics> SparseTables::Metrics() const {
  std::vector<TableMetrics> out;
  for (const Table& t : tables_) out.push_back(t.metrics);
  return out;
}

}  // namespace tally
