#include "worker/row_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "proto/errors.h"

namespace tally {

namespace {

// A request of this worker's, about the job's placement `map_version`.
template <typename Request>
Request Addressed(const RowClientOptions& o, int64_t map_version) {
  Request req;
  req.set_job_id(o.job_id);
  req.set_worker_id(o.worker_id);
  req.set_incarnation(o.incarnation);
  req.set_map_version(map_version);
  return req;
}

// The most values in one request or answer (SparseTables::
// kMaxValuesPerMessage on the shards: within the 4 MiB message limit).
constexpr int64_t kMaxValuesPerMessage = int64_t{1} << 18;

// Calls start(i, ctx, done) for every i in [0, n) at once, each again
// (after o.retry_backoff, growing) while it fails with UNAVAILABLE, until
// `deadline` is less than o.retry_min_left away or until o.keep_trying (if
// set) says no more; waits for all. The first failure, if any.
template <typename Start>
absl::Status RunAll(int n, absl::Time deadline, const RowClientOptions& o,
                    const Start& start) {
  std::vector<absl::Status> results(n);
  for (int attempt = 0;; ++attempt) {
    std::vector<int> todo;
    for (int i = 0; i < n; ++i) {
      if (attempt == 0 || absl::IsUnavailable(results[i])) todo.push_back(i);
    }
    if (todo.empty()) break;
    if (attempt > 0) {
      if (absl::Now() + o.retry_min_left > deadline) break;
      // A shard that is gone may come back as another placement's: its
      // answer would be to a step the job no longer takes.
      if (o.keep_trying && !o.keep_trying()) break;
      absl::SleepFor(o.retry_backoff * std::min(attempt, 5));
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

// A pull's request row: which pull, and which of its rows.
struct Place {
  int pull;
  int64_t index;
};

// Each answer's rows into the pulls that asked for them.
absl::Status Scatter(const std::vector<EmbeddingTableSpec>& tables_,
                     const std::vector<std::pair<int, v1::PullRowsRequest>>& calls,
                     const std::vector<v1::PullRowsResponse>& resps,
                     const std::vector<std::vector<Place>>& places,
                     const std::vector<TableRows::Rows>& pulls) {
  for (size_t c = 0; c < calls.size(); ++c) {
    const v1::PullRowsRequest& asked = calls[c].second;
    const v1::PullRowsResponse& got = resps[c];
    bool same = got.tables_size() == asked.tables_size();
    for (int b = 0; same && b < asked.tables_size(); ++b) {
      const int64_t dim = tables_[asked.tables(b).table()].dim;
      same = got.tables(b).table() == asked.tables(b).table() &&
             got.tables(b).values().size() ==
                 static_cast<size_t>(asked.tables(b).rows_size() * dim * 4);
    }
    if (!same) {
      return absl::InternalError(absl::StrCat(
          "shard ", calls[c].first, " answered a pull of rows with other rows"));
    }
    size_t k = 0;  // the call's row, over its blocks
    for (int b = 0; b < got.tables_size(); ++b) {
      const int64_t dim = tables_[got.tables(b).table()].dim;
      const char* values = got.tables(b).values().data();
      for (int i = 0; i < got.tables(b).rows_size(); ++i, ++k) {
        const Place& at = places[c][k];
        std::memcpy(pulls[at.pull].out + at.index * dim,
                    values + static_cast<size_t>(i) * dim * 4, dim * 4);
      }
    }
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
  std::unique_ptr<RowClient> client(
      new RowClient(map.version(), std::move(tables), options));
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
      absl::Now() + options_.pull_wait + options_.rpc_timeout, options_,
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
      options_,
      [&](int i, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs_[calls[i].first]->async()->PushRows(ctx, &calls[i].second,
                                                  &resps[i], std::move(done));
      });
}

absl::Status RowClient::Pull(int table, const int64_t* rows, int64_t n,
                             float* out) {
  return PullTables({Rows{table, rows, n, out}});
}

absl::Status RowClient::PullTables(const std::vector<Rows>& pulls) {
  const int slots = static_cast<int>(stubs_.size());
  std::vector<std::pair<int, v1::PullRowsRequest>> calls;
  std::vector<std::vector<Place>> places;  // per call, in its rows' order
  std::vector<int> open(slots, -1);        // each shard's call being filled
  std::vector<int64_t> filled(slots, 0);
  for (size_t p = 0; p < pulls.size(); ++p) {
    const Rows& r = pulls[p];
    if (r.table < 0 || r.table >= static_cast<int>(tables_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("no table ", r.table));
    }
    const EmbeddingTableSpec& t = tables_[r.table];
    for (int64_t i = 0; i < r.n; ++i) {
      const int s = SlotOfRow(r.rows[i], t.salt, slots);
      if (open[s] < 0 || filled[s] + t.dim > kMaxValuesPerMessage) {
        v1::PullRowsRequest req = Addressed<v1::PullRowsRequest>(
            options_, map_version_);
        req.set_min_version(min_version_);
        req.set_max_wait_ms(absl::ToInt64Milliseconds(options_.pull_wait));
        open[s] = static_cast<int>(calls.size());
        calls.emplace_back(s, std::move(req));
        places.emplace_back();
        filled[s] = 0;
      }
      v1::PullRowsRequest& req = calls[open[s]].second;
      if (req.tables_size() == 0 ||
          req.tables(req.tables_size() - 1).table() != r.table) {
        req.add_tables()->set_table(r.table);
      }
      req.mutable_tables(req.tables_size() - 1)->add_rows(r.rows[i]);
      places[open[s]].push_back({static_cast<int>(p), i});
      filled[s] += t.dim;
    }
  }
  std::vector<v1::PullRowsResponse> resps;
  if (absl::Status s = PullAll(calls, &resps); !s.ok()) return s;
  return Scatter(tables_, calls, resps, places, pulls);
}

absl::Status RowClient::Push(int64_t samples, const std::vector<Grads>& grads) {
  const int slots = static_cast<int>(stubs_.size());
  // Each shard's requests: pieces of at most kMaxValuesPerMessage values.
  std::vector<std::vector<v1::PushRowsRequest>> pieces(slots);
  std::vector<int64_t> filled(slots, kMaxValuesPerMessage);  // of the last
  auto next = [&](int s, int64_t dim) -> v1::PushRowsRequest& {
    if (filled[s] + dim > kMaxValuesPerMessage) {
      v1::PushRowsRequest req =
          Addressed<v1::PushRowsRequest>(options_, map_version_);
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
