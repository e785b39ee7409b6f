// The default of each bound on a wait of the worker's data path that more
// than one options struct carries: one value each, so that the daemon's
// options (DaemonOptions, which it hands to the clients it builds) and
// the clients' own (ParamClientOptions, RowClientOptions) cannot disagree.
// A bound only one struct carries has its default there.
#ifndef TALLY_WORKER_INTERNAL_WAITS_H_
#define TALLY_WORKER_INTERNAL_WAITS_H_

#include "absl/time/time.h"

namespace tally {
namespace internal {

// What a shard may hold a pull (of weights or of rows) for its version
// (PullRequest.max_wait_ms, PullRowsRequest.max_wait_ms).
inline constexpr absl::Duration kDefaultPullWait = absl::Seconds(5);
// An RPC's own deadline, beyond any wait the shard was asked for.
inline constexpr absl::Duration kDefaultRpcTimeout = absl::Seconds(30);
// The loader's next batch: a stuck data source is reported, not waited for
// forever.
inline constexpr absl::Duration kDefaultBatchWait = absl::Minutes(1);

}  // namespace internal
}  // namespace tally

#endif  // TALLY_WORKER_INTERNAL_WAITS_H_
