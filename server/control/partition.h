// How a job's flat vector is split over parameter shards.
//
// Shard i of k holds the contiguous range [i*N/k, (i+1)*N/k) (integer
// division, computed without overflow): sizes differ by at most one element,
// so the bytes per shard are balanced exactly, whatever the layer sizes.
// (Placing whole tensors, as MXNet's kvstore and BytePS's partitions hashed
// to servers do, leaves one shard with the largest layer: in the example MLP
// the first layer is 86% of the parameters.)
//
// The number of shards: the spec's `training.shards` when set (the job
// waits until that many shards are live), else every live shard, but no
// more than keep each range at least 1 MiB (262,144 float32 values) and at
// least one: small models are not cut into pieces smaller than the cost of
// a round trip.
#ifndef TALLY_SERVER_CONTROL_PARTITION_H_
#define TALLY_SERVER_CONTROL_PARTITION_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace tally {

inline constexpr int64_t kMinRangeElements = 262144;  // 1 MiB of float32

// k >= 1 contiguous [offset, count) ranges covering [0, n) in order.
std::vector<std::pair<int64_t, int64_t>> PartitionRanges(int64_t n, int k);

// How many shards a job of n parameters uses: `wanted` (> 0) as asked (at
// most n), else min(live, max(1, n / kMinRangeElements)). 0 when `live` is
// 0 or fewer than `wanted`: the job waits.
int ShardCount(int64_t n, int wanted, int live);

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_PARTITION_H_
