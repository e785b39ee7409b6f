#include "server/data/row_staging.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "server/data/internal/finite.h"
#include "server/data/internal/sum_kernels.h"
#include "server/data/shard_stats.h"

namespace tally {

namespace {

// A message's bytes on the wire, by its table blocks: each block's own,
// and the rest of the message (its other fields, the blocks' tags and
// lengths) with the first, so that they add up to the whole message.
std::vector<int64_t> WireShares(
    const google::protobuf::MessageLite& message,
    const google::protobuf::RepeatedPtrField<v1::TableRows>& blocks) {
  std::vector<int64_t> out;
  int64_t rest = static_cast<int64_t>(message.ByteSizeLong());
  for (const v1::TableRows& t : blocks) {
    out.push_back(static_cast<int64_t>(t.ByteSizeLong()));
    rest -= out.back();
  }
  if (!out.empty()) out[0] += rest;
  return out;
}

// A request's table blocks as SparseTables::CheckRequest sees them (the
// count checked before the list is made of it).
absl::StatusOr<std::vector<SparseTables::Block>> BlocksOf(
    const google::protobuf::RepeatedPtrField<v1::TableRows>& tables,
    absl::string_view what) {
  if (tables.size() > SparseTables::kMaxBlocksPerMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", what, " of rows in ", tables.size(), " table blocks; at most ",
        SparseTables::kMaxBlocksPerMessage, " a request"));
  }
  std::vector<SparseTables::Block> blocks;
  blocks.reserve(tables.size());
  for (const v1::TableRows& t : tables)
    blocks.push_back({t.table(), t.rows().data(), t.rows_size()});
  return blocks;
}

}  // namespace

absl::Status RowStaging::NoTables(const std::string& job_id) {
  return absl::InvalidArgumentError(absl::StrCat(
      "job ", Quoted(job_id), " has no embedding tables (model.embeddings)"));
}

absl::Status RowStaging::CheckPull(const SparseTables* tables,
                                   const v1::PullRowsRequest& req) {
  if (tables == nullptr) return NoTables(req.job_id());
  TALLY_ASSIGN_OR_RETURN(std::vector<SparseTables::Block> blocks,
                         BlocksOf(req.tables(), "pull"));
  return tables->CheckRequest(blocks, "pull");
}

absl::Status RowStaging::Read(const v1::PullRowsRequest& req, int64_t version,
                              v1::PullRowsResponse* resp) {
  TALLY_RETURN_IF_ERROR(CheckPull(tables_.get(), req));
  resp->set_version(version);
  for (const v1::TableRows& t : req.tables()) {
    v1::TableRows* out = resp->add_tables();
    out->set_table(t.table());
    *out->mutable_rows() = t.rows();
    std::string* bytes = out->mutable_values();
    bytes->resize(t.rows_size() * tables_->spec(t.table()).dim * 4);
    TALLY_RETURN_IF_ERROR(
        tables_->Read(t.table(), t.rows().data(), t.rows_size(),
                      reinterpret_cast<float*>(bytes->data())));
  }
  const std::vector<int64_t> wire = WireShares(*resp, resp->tables());
  for (int i = 0; i < resp->tables_size(); ++i) {
    tables_->CountPull(resp->tables(i).table(), resp->tables(i).rows_size(),
                       wire[i]);
  }
  return absl::OkStatus();
}

absl::Status RowStaging::Stage(ShardMember& m, const v1::PushRowsRequest& req,
                               bool now, int64_t version, PushCounts* counts,
                               bool* replaced) {
  // Piece 0 first (it starts the member's rows of the step), then the
  // others in any order (a worker sends them at once), at most
  // kMaxRowPieces: the rows a member stages for a step stay bounded.
  auto has = m.rows.find(req.step());
  const bool started = has != m.rows.end() && has->second.pieces.count(0);
  if (req.piece() < 0 || req.piece() >= kMaxRowPieces ||
      (req.piece() > 0 && !started)) {
    return absl::InvalidArgumentError(
        absl::StrCat("piece ", req.piece(),
                     " of a push of rows (piece 0 first, then up "
                     "to ",
                     kMaxRowPieces - 1, " more in any order; piece 0 ",
                     started ? "came" : "has not come", ")"));
  }
  if (now) return StepNow(m, req, version, counts);
  std::vector<RowGrads> blocks;
  TALLY_RETURN_IF_ERROR(Decode(req, &blocks, counts));
  StagedRows& staged = m.rows[req.step()];
  if (req.piece() == 0) {
    *replaced = !staged.pieces.empty();
    staged.pieces.clear();
    staged.samples = req.samples();
  }
  staged.pieces[req.piece()] = std::move(blocks);
  return absl::OkStatus();
}

absl::Status RowStaging::StepNow(ShardMember& m, const v1::PushRowsRequest& req,
                                 int64_t version, PushCounts* counts) {
  // Each piece is stepped once: a retried one (its answer lost) is not
  // stepped again. What is kept is the mark, not the gradients.
  StagedRows& staged = m.rows[req.step()];
  if (staged.pieces.count(req.piece())) return absl::OkStatus();
  std::vector<RowGrads> blocks;
  TALLY_RETURN_IF_ERROR(Decode(req, &blocks, counts));
  staged.pieces[req.piece()];
  // Async has no closing step to drop the marks: a member's earlier
  // steps' go once it sends a later one's.
  m.rows.erase(m.rows.begin(), m.rows.find(req.step()));
  if (req.samples() <= 0) return absl::OkStatus();  // nothing to step
  // The member's rows are its batch's mean gradients already: each table
  // steps them alone (a row listed once a table in a request).
  for (const RowGrads& g : blocks) {
    tables_->Apply(g.table, g.rows.data(), static_cast<int64_t>(g.rows.size()),
                   g.grads.data(), version);
  }
  return absl::OkStatus();
}

absl::Status RowStaging::Decode(const v1::PushRowsRequest& req,
                                std::vector<RowGrads>* blocks,
                                PushCounts* counts) {
  {
    TALLY_ASSIGN_OR_RETURN(std::vector<SparseTables::Block> rows,
                           BlocksOf(req.tables(), "push"));
    TALLY_RETURN_IF_ERROR(tables_->CheckRequest(rows, "push"));
  }
  for (const v1::TableRows& t : req.tables()) {
    const EmbeddingTableSpec& spec = tables_->spec(t.table());
    const int64_t n = t.rows_size() * spec.dim;
    if (static_cast<int64_t>(t.values().size()) != n * 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", Quoted(spec.name), ": ", t.values().size(),
                       " bytes of gradients for ", t.rows_size(), " rows of ",
                       spec.dim, " values (", n * 4, " bytes)"));
    }
    RowGrads g;
    g.table = t.table();
    g.rows.assign(t.rows().begin(), t.rows().end());
    g.grads.resize(n);
    const int64_t bad =
        internal::CopyAndFindNonFinite(g.grads.data(), t.values().data(), n);
    if (bad >= 0) {
      ++counts->rejected;
      return WithReason(
          absl::InvalidArgumentError(absl::StrCat(
              "table ", Quoted(spec.name), ": row ", g.rows[bad / spec.dim],
              " has a non-finite gradient")),
          v1::NON_FINITE);
    }
    blocks->push_back(std::move(g));
  }
  const std::vector<int64_t> wire = WireShares(req, req.tables());
  for (int i = 0; i < req.tables_size(); ++i) {
    tables_->CountPush(req.tables(i).table(), req.tables(i).rows_size(),
                       wire[i]);
  }
  return absl::OkStatus();
}

void RowStaging::Apply(const std::vector<ShardMember*>& required,
                       int64_t version, int64_t samples, bool stepped_already,
                       PushCounts* counts) {
  // Per table: each row's place in the sum, the rows in order of first
  // contribution, and the sum (dim a row).
  struct Sum {
    absl::flat_hash_map<int64_t, int64_t> at;
    std::vector<int64_t> rows;
    std::vector<float> values;
  };
  std::vector<Sum> sums(tables_->size());
  for (ShardMember* m : required) {
    // Nothing to sum: the step contributes nothing, or its rows were
    // stepped as they came (tables: async).
    if (samples <= 0 || stepped_already) break;
    // A push that counted: committed as contributing (a backup's late or
    // missing one, or one refused on some range, does not).
    if (m->committed_step < version ||
        (m->committed_step == version && m->last_refused)) {
      continue;
    }
    auto it = m->rows.find(version);
    if (it == m->rows.end()) continue;
    const float w = static_cast<float>(it->second.samples);
    for (const auto& [piece, blocks] : it->second.pieces)
      for (const RowGrads& g : blocks) {
        Sum& sum = sums[g.table];
        const int64_t dim = tables_->spec(g.table).dim;
        for (size_t i = 0; i < g.rows.size(); ++i) {
          auto [place, fresh] = sum.at.try_emplace(g.rows[i], sum.rows.size());
          const float* src = g.grads.data() + i * dim;
          if (fresh) {
            sum.rows.push_back(g.rows[i]);
            sum.values.resize(sum.values.size() + dim);
            internal::PutScaled(sum.values.data() + place->second * dim, src, w,
                                dim);
          } else {
            internal::AddScaled(sum.values.data() + place->second * dim, src, w,
                                dim);
          }
        }
      }
  }
  for (int t = 0; t < tables_->size(); ++t) {
    Sum& sum = sums[t];
    if (sum.rows.empty()) continue;
    if (!internal::ScaleFinite(sum.values.data(), 1.0f / samples,
                               static_cast<int64_t>(sum.values.size()))) {
      ++counts->rejected;  // the table's mean overflowed: its rows stay
      continue;
    }
    tables_->Apply(t, sum.rows.data(), static_cast<int64_t>(sum.rows.size()),
                   sum.values.data(), version);
  }
  tables_->EndStep(version);
}

}  // namespace tally
