// ShardControl over this process's own ShardHost: the coordinator's shard
// in a one-process cluster, called directly.
#ifndef TALLY_SERVER_DATA_LOCAL_SHARD_CONTROL_H_
#define TALLY_SERVER_DATA_LOCAL_SHARD_CONTROL_H_

#include <memory>

#include "server/shard_control.h"

namespace tally {

class ShardHost;

// `host` is borrowed and must outlive the control.
std::unique_ptr<ShardControl> MakeLocalShardControl(ShardHost* host);

}  // namespace tally

#endif  // TALLY_SERVER_DATA_LOCAL_SHARD_CONTROL_H_
