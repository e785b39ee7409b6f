// ShardControl over a shard process's ShardService (gRPC), dialled with
// the coordinator's transport options (TLS, its own token). Each call is
// bounded; a shard process's answer never makes the coordinator hold more
// than the range it was given.
#ifndef TALLY_SERVER_CONTROL_REMOTE_SHARD_CONTROL_H_
#define TALLY_SERVER_CONTROL_REMOTE_SHARD_CONTROL_H_

#include <memory>
#include <string>

#include "proto/transport.h"
#include "server/shard_control.h"

namespace tally {

// Over ShardService at `address`, dialled with `transport`.
std::unique_ptr<ShardControl> MakeRemoteShardControl(
    const std::string& address, const TransportOptions& transport);

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_REMOTE_SHARD_CONTROL_H_
