// A replicated range's primary copy sends each step it closes to its
// backup's shard (ShardService.ApplyClosedSteps), in order, from a thread
// of its own; the backup's answer acknowledges the version on the range
// (ParameterShard::Acknowledge), which publishes it to pulls. A step that
// fails (the backup restarting, a broken connection) is sent again after a
// backoff until it is taken or the forwarder is stopped: the coordinator
// gives the range another backup, or none, when the backup's shard is
// gone (docs/cluster.md, "Replicated ranges").
//
// Thread-safe.
#ifndef TALLY_SERVER_DATA_RANGE_FORWARDER_H_
#define TALLY_SERVER_DATA_RANGE_FORWARDER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "server/shard_control.h"

namespace tally {

class ParameterShard;

class RangeForwarder {
 public:
  struct Options {
    std::string job_id;
    int64_t map_version = 0;
    std::string backup_address;  // the backup's shard's data address
    TransportOptions transport;  // how it is dialled
    absl::Duration rpc_timeout = absl::Seconds(30);
    absl::Duration min_backoff = absl::Milliseconds(20);
    absl::Duration max_backoff = absl::Seconds(1);
  };
  // `shard` is the primary copy, acknowledged as its steps are taken.
  RangeForwarder(Options options, std::weak_ptr<ParameterShard> shard);
  // Stop(), then waits for the thread.
  ~RangeForwarder();
  RangeForwarder(const RangeForwarder&) = delete;
  RangeForwarder& operator=(const RangeForwarder&) = delete;

  // Queues a closed step (the range hands them over in order).
  void Send(ClosedStep step);
  // The range's forward call that hands `forwarder` its closed steps (none
  // once it is gone).
  static std::function<void(ClosedStep)> SendTo(
      const std::shared_ptr<RangeForwarder>& forwarder);
  // Sends nothing more; a call in flight is cancelled.
  void Stop();
  const std::string& backup_address() const { return options_.backup_address; }
  // Never the same twice in a process (nor 0): what the range's
  // acknowledgements from this forwarder are known by.
  int64_t id() const { return id_; }

 private:
  void Loop();
  // One step to the backup: its version after it.
  absl::StatusOr<int64_t> SendOne(const ClosedStep& step);

  const Options options_;
  const int64_t id_;
  const std::weak_ptr<ParameterShard> shard_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<ClosedStep> queue_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // in flight
  std::unique_ptr<v1::ShardService::Stub> stub_;  // the thread's own
  std::thread thread_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_RANGE_FORWARDER_H_
