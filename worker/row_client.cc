#include "worker/row_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "proto/errors.h"

namespace tally {

namespace {

// The most values in one request or answer (SparseTables::
// kMaxValuesPerMessage on the shards: within the 4 MiB message limit).
constexpr int64_t kMaxValuesPerMessage = int64_t{1} << 19;

// Calls start(i, ctx, done) for every i in [0, n) at once, each again
// (after a short backoff) while it fails with UNAVAILABLE, until
// `deadline`; waits for all. The first failure, if any.
template <typename Start>
absl::Status RunAll(int n, absl::Time deadline, const Start& start) {
  std::vector<absl::Status> results(n);
  for (int attempt = 0;; ++attempt) {
    std::vector<int> todo;
    for (int i = 0; i < n; ++i) {
      if (attempt == 0 || absl::IsUnavailable(results[i])) todo.push_back(i);
    }
    if (todo.empty()) break;
    if (attempt > 0) {
      if (absl::Now() + absl::Milliseconds(200) > deadline) break;
      absl::SleepFor(absl::Milliseconds(100) * std::min(attempt, 5));
    }
    absl::BlockingCounter left(static_cast<int>(todo.size()));
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    for (int i : todo) {
      auto ctx = std::make_unique<grpc::ClientContext>();
      ctx->set_deadline(absl::ToChronoTime(deadline));
      start(i, ctx.get(), [&results, &left, i](grpc::Status s) {
        results[i] = FromGrpc(s);
        left.DecrementCount();
      });
      contexts.push_back(std::move(ctx));
    }
    left.Wait();
  }
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RowClient>> RowClient::Create(
    const v1::ShardMap& map, std::vector<EmbeddingTableSpec> tables,
    const std::string& coordinator, const RowClientOptions& options) {
  if (map.shards().empty()) {
    return absl::InvalidArgumentError("the shard map has no shards");
  }
  std::unique_ptr<RowClient> client(new RowClient(std::move(tables), options));
  for (const v1::ShardMap::Entry& e : map.shards()) {
    client->stubs_.push_back(v1::ParameterService::NewStub(
        Dial(ResolveShardAddress(coordinator, e.address()), options.transport)));
  }
  return client;
}

void RowClient::BeginStep(int64_t step, int64_t min_version) {
  step_ = step;
  min_version_ = min_version;
}

absl::Status RowClient::PullAll(
    const std::vector<std::pair<int, v1::PullRowsRequest>>& calls,
    std::vector<v1::PullRowsResponse>* resps) {
  resps->assign(calls.size(), v1::PullRowsResponse());
  return RunAll(
      static_cast<int>(calls.size()),
      absl::Now() + options_.pull_wait + options_.rpc_timeout,
      [&](int i, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs_[calls[i].first]->async()->PullRows(ctx, &calls[i].second,
                                                  &(*resps)[i], std::move(done));
      });
}

absl::Status RowClient::PushAll(
    const std::vector<std::pair<int, v1::PushRowsRequest>>& calls) {
  std::vector<v1::PushRowsResponse> resps(calls.size());
  return RunAll(
      static_cast<int>(calls.size()), absl::Now() + options_.rpc_timeout,
      [&](int i, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs_[calls[i].first]->async()->PushRows(ctx, &calls[i].second,
                                                  &resps[i], std::move(done));
      });
}

absl::Status RowClient::Pull(int table, const int64_t* rows, int64_t n,
                             float* out) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no table ", table));
  }
  const EmbeddingTableSpec& t = tables_[table];
  const int slots = static_cast<int>(stubs_.size());
  // Each shard's rows, and where each goes in `out`.
  std::vector<std::vector<int64_t>> where(slots);
  for (int64_t i = 0; i < n; ++i)
    where[SlotOfRow(rows[i], t.salt, slots)].push_back(i);
  const int64_t per_piece = std::max<int64_t>(1, kMaxValuesPerMessage / t.dim);
  std::vector<std::pair<int, v1::PullRowsRequest>> calls;
  std::vector<std::pair<int, int64_t>> piece_of;  // (slot, first index)
  for (int s = 0; s < slots; ++s) {
    for (size_t at = 0; at < where[s].size(); at += per_piece) {
      v1::PullRowsRequest req;
      req.set_job_id(options_.job_id);
      req.set_worker_id(options_.worker_id);
      req.set_incarnation(options_.incarnation);
      req.set_min_version(min_version_);
      req.set_max_wait_ms(absl::ToInt64Milliseconds(options_.pull_wait));
      v1::TableRows* block = req.add_tables();
      block->set_table(table);
      const size_t end = std::min(where[s].size(), at + per_piece);
      for (size_t k = at; k < end; ++k) block->add_rows(rows[where[s][k]]);
      calls.emplace_back(s, std::move(req));
      piece_of.emplace_back(s, static_cast<int64_t>(at));
    }
  }
  std::vector<v1::PullRowsResponse> resps;
  if (absl::Status s = PullAll(calls, &resps); !s.ok()) return s;
  for (size_t c = 0; c < calls.size(); ++c) {
    const auto [slot, first] = piece_of[c];
    const v1::TableRows& asked = calls[c].second.tables(0);
    if (resps[c].tables_size() != 1 ||
        resps[c].tables(0).values().size() !=
            static_cast<size_t>(asked.rows_size() * t.dim * 4)) {
      return absl::InternalError(absl::StrCat(
          "shard ", slot, " answered a pull of ", asked.rows_size(),
          " rows of table ", Quoted(t.name), " with other rows"));
    }
    const char* values = resps[c].tables(0).values().data();
    for (int k = 0; k < asked.rows_size(); ++k) {
      std::memcpy(out + where[slot][first + k] * t.dim,
                  values + static_cast<size_t>(k) * t.dim * 4, t.dim * 4);
    }
  }
  return absl::OkStatus();
}

absl::Status RowClient::Push(int64_t samples, const std::vector<Grads>& grads) {
  const int slots = static_cast<int>(stubs_.size());
  // Each shard's requests: pieces of at most kMaxValuesPerMessage values.
  std::vector<std::vector<v1::PushRowsRequest>> pieces(slots);
  std::vector<int64_t> filled(slots, kMaxValuesPerMessage);  // of the last
  auto next = [&](int s, int64_t dim) -> v1::PushRowsRequest& {
    if (filled[s] + dim > kMaxValuesPerMessage) {
      v1::PushRowsRequest req;
      req.set_job_id(options_.job_id);
      req.set_worker_id(options_.worker_id);
      req.set_incarnation(options_.incarnation);
      req.set_step(step_);
      req.set_samples(samples);
      req.set_piece(static_cast<int>(pieces[s].size()));
      pieces[s].push_back(std::move(req));
      filled[s] = 0;
    }
    filled[s] += dim;
    return pieces[s].back();
  };
  for (const Grads& g : grads) {
    if (g.table < 0 || g.table >= static_cast<int>(tables_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("no table ", g.table));
    }
    const EmbeddingTableSpec& t = tables_[g.table];
    for (int64_t i = 0; i < g.n; ++i) {
      const int s = SlotOfRow(g.rows[i], t.salt, slots);
      v1::PushRowsRequest& req = next(s, t.dim);
      if (req.tables_size() == 0 ||
          req.tables(req.tables_size() - 1).table() != g.table) {
        req.add_tables()->set_table(g.table);
      }
      v1::TableRows* block = req.mutable_tables(req.tables_size() - 1);
      block->add_rows(g.rows[i]);
      block->mutable_values()->append(
          reinterpret_cast<const char*>(g.grads + i * t.dim), t.dim * 4);
    }
  }
  std::vector<std::pair<int, v1::PushRowsRequest>> calls;
  for (int s = 0; s < slots; ++s) {
    for (v1::PushRowsRequest& r : pieces[s]) calls.emplace_back(s, std::move(r));
  }
  // Piece 0 first everywhere (it replaces what a shard staged for the
  // step), then the others.
  std::vector<std::pair<int, v1::PushRowsRequest>> firsts, rest;
  for (auto& c : calls) (c.second.piece() == 0 ? firsts : rest).push_back(std::move(c));
  if (absl::Status s = PushAll(firsts); !s.ok()) return s;
  return PushAll(rest);
}

}  // namespace tally
