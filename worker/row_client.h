// The worker's side of a job's sparse embedding tables: TableRows over the
// job's shards. A table's row lives on the shard whose slot owns its
// virtual bucket (common/spec/embedding.h), so a pull or push sends each
// shard only its rows, every shard in parallel, in pieces of at most
// SparseTables' per-message bound. PullRows and PushRows are unary calls on
// a channel of their own per shard (gRPC shares the connection with the
// parameter client's when their settings match).
//
// Every request names the map's version: a shard map is a placement, and
// a row's shard is its slot's entry of that placement alone. When the job
// is placed again (a lost shard: ranges restored from a checkpoint,
// perhaps in another order, a restarted shard at the old address), a
// shard of the new placement answers this client's calls NOT_FOUND (a
// stale map) instead of reading or staging rows of another slot or of a
// step it rolled back; the job runner that owns the client then ends,
// and the next one builds a client from the new map.
//
// A failed call is tried again (UNAVAILABLE, a shard restarting or moving)
// within the RPC timeout, while options.keep_trying says so; any other
// error is the step's, with its code and reason (worker/reaction.h,
// Call::kRows).
//
// Thread-safe: replicas may pull from their own threads at once.
#ifndef TALLY_WORKER_ROW_CLIENT_H_
#define TALLY_WORKER_ROW_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/spec/embedding.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "worker/internal/waits.h"
#include "worker/model_engine.h"

namespace tally {

struct RowClientOptions {
  std::string job_id;
  std::string worker_id;
  int64_t incarnation = 0;
  absl::Duration pull_wait = internal::kDefaultPullWait;  // the shard's bound
  absl::Duration rpc_timeout = internal::kDefaultRpcTimeout;
  // A call answered UNAVAILABLE is tried again after this times its
  // attempts (at most five times this), unless less than retry_min_left
  // is left of its deadline.
  absl::Duration retry_backoff = absl::Milliseconds(100);
  absl::Duration retry_min_left = absl::Milliseconds(200);
  TransportOptions transport;
  // Asked before each retry of an UNAVAILABLE call: false once the answer
  // no longer matters (the job was placed again or taken away), so that a
  // shard that is gone does not hold the step for the whole RPC timeout.
  // Called from the calling threads; null: always keep trying.
  std::function<bool()> keep_trying;
};

class RowClient final : public TableRows {
 public:
  // kInvalidArgument for a map with no shards.
  static absl::StatusOr<std::unique_ptr<RowClient>> Create(
      const v1::ShardMap& map, std::vector<EmbeddingTableSpec> tables,
      const std::string& coordinator, const RowClientOptions& options);

  void BeginStep(int64_t step, int64_t min_version) override;
  absl::Status Pull(int table, const int64_t* rows, int64_t n,
                    float* out) override;
  absl::Status PullTables(const std::vector<Rows>& pulls) override;
  absl::Status Push(int64_t samples, const std::vector<Grads>& grads) override;

 private:
  RowClient(int64_t map_version, std::vector<EmbeddingTableSpec> tables,
            const RowClientOptions& options)
      : map_version_(map_version),
        tables_(std::move(tables)),
        options_(options) {}
  // Runs every (shard, request) call in parallel, each tried again while
  // its shard answers UNAVAILABLE (within the RPC timeout, while
  // options_.keep_trying allows); the first error, if any.
  absl::Status PullAll(const std::vector<std::pair<int, v1::PullRowsRequest>>& calls,
                       std::vector<v1::PullRowsResponse>* resps);
  absl::Status PushAll(const std::vector<std::pair<int, v1::PushRowsRequest>>& calls);

  const int64_t map_version_;  // the placement stubs_ are the slots of
  const std::vector<EmbeddingTableSpec> tables_;
  const RowClientOptions options_;
  std::vector<std::unique_ptr<v1::ParameterService::Stub>> stubs_;
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> min_version_{0};
};

}  // namespace tally

#endif  // TALLY_WORKER_ROW_CLIENT_H_
