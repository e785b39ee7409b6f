#include "server/data/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"

namespace tally {

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
    t.spec = std::move(s);
    tables_.push_back(std::move(t));
  }
}

SparseTables::~SparseTables() {
  if (budget_ != nullptr) budget_->fetch_add(bytes_);
}

int64_t SparseTables::RowBytes(const Table& t) const {
  const int slots = t.spec.optimizer.type == TableOptimizer::Type::kAdagrad
                        ? 2
                        : 1;
  // Values and slots, and about 16 bytes of the index's entry.
  return t.spec.dim * 4 * slots + 16;
}

absl::Status SparseTables::CheckRows(int table, const int64_t* rows,
                                     int64_t n) const {
  if (table < 0 || table >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table, ": the job has ", size(), " tables (model.embeddings)"));
  }
  const EmbeddingTableSpec& s = tables_[table].spec;
  absl::flat_hash_set<int64_t> seen;
  seen.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= s.num_embeddings) {
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
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", Quoted(s.name), ": row ", r, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

int64_t SparseTables::Make(Table& t, int64_t row) {
  auto [it, made] = t.index.try_emplace(row, t.metrics.rows);
  if (!made) return it->second;
  const int64_t dim = t.spec.dim;
  t.values.resize(t.values.size() + dim);
  InitRow(t.spec, seed_, row, t.values.data() + it->second * dim);
  if (t.spec.optimizer.type == TableOptimizer::Type::kAdagrad) {
    t.accum.resize(t.accum.size() + dim,
                   static_cast<float>(t.spec.optimizer.initial_accumulator_value));
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
  return absl::ResourceExhaustedError(absl::StrCat(
      "table ", Quoted(t.spec.name), ": ", missing,
      " new rows would take this shard past its --max_table_bytes (", left,
      " bytes left)"));
}

absl::Status SparseTables::Read(int table, const int64_t* rows, int64_t n,
                                float* out) {
  Table& t = tables_[table];
  int64_t missing = 0;
  for (int64_t i = 0; i < n; ++i) missing += t.index.contains(rows[i]) ? 0 : 1;
  TALLY_RETURN_IF_ERROR(Reserve(t, missing, missing * RowBytes(t)));
  const int64_t dim = t.spec.dim;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = Make(t, rows[i]);
    std::copy_n(t.values.data() + at * dim, dim, out + i * dim);
  }
  t.metrics.rows_created += missing;
  return absl::OkStatus();
}

void SparseTables::Apply(int table, const int64_t* rows, int64_t n,
                         const float* g) {
  Table& t = tables_[table];
  const int64_t dim = t.spec.dim;
  const TableOptimizer& o = t.spec.optimizer;
  const float lr = static_cast<float>(o.lr);
  const float wd = static_cast<float>(o.weight_decay);
  const float eps = static_cast<float>(o.eps);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t before = t.metrics.bytes;
    const int64_t at = Make(t, rows[i]);
    if (budget_ != nullptr && t.metrics.bytes > before)
      budget_->fetch_sub(t.metrics.bytes - before);
    float* p = t.values.data() + at * dim;
    const float* gi = g + i * dim;
    if (o.type == TableOptimizer::Type::kSgd) {
      // As the dense SGD's kernel (common/optim): d = g + wd * p, then
      // p += -lr * d, each one rounding.
      for (int64_t j = 0; j < dim; ++j) {
        const float d = std::fma(p[j], wd, gi[j]);
        p[j] = std::fma(d, -lr, p[j]);
      }
    } else {
      float* s = t.accum.data() + at * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const float d = wd != 0.0f ? gi[j] + wd * p[j] : gi[j];
        s[j] = s[j] + d * d;                     // state_sum.addcmul_(g, g)
        const float std_dev = std::sqrt(s[j]) + eps;  // .sqrt().add_(eps)
        // param.add_(g / std, alpha=-clr): a sparse add, fused (axpy).
        p[j] = std::fma(-lr, d / std_dev, p[j]);
      }
    }
  }
  t.metrics.rows_applied += n;
}

void SparseTables::Freeze() {
  if (frozen_) return;
  frozen_ = true;
  for (Table& t : tables_) {
    t.sorted.reserve(t.index.size());
    for (const auto& [row, at] : t.index) t.sorted.push_back(row);
    std::sort(t.sorted.begin(), t.sorted.end());
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
