// A registration's Attend call (WorkerService.Attend for a worker,
// CoordinatorService.AttendShard for a shard process), held open from a
// thread of its own for as long as the registration lives. The
// coordinator sends only an empty message on it every 20 s, which is read
// and dropped: it ends the registration's lease when
// the call ends, which a killed process's closed connection does at once
// (docs/cluster.md, "Jobs and workers").
//
// Thread-safe. A new registration cancels the last one's call and opens
// its own; a call that ends by itself (the coordinator away, restarting)
// is made again after a backoff; a coordinator without the call
// (UNIMPLEMENTED) is not asked again.
#ifndef TALLY_PROTO_ATTENDANCE_H_
#define TALLY_PROTO_ATTENDANCE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/tally.grpc.pb.h"

namespace tally {

class Attendance {
 public:
  // Opens the call for registration (id, incarnation) on `ctx`.
  using Open = std::function<
      std::unique_ptr<grpc::ClientReader<v1::AttendResponse>>(
          grpc::ClientContext* ctx, const std::string& id,
          int64_t incarnation)>;

  // Backs off from `min_backoff`, doubling up to `max_backoff`.
  Attendance(Open open, absl::Duration min_backoff,
             absl::Duration max_backoff);
  // Stop(), then waits for the thread.
  ~Attendance();
  Attendance(const Attendance&) = delete;
  Attendance& operator=(const Attendance&) = delete;

  // The registration is (id, incarnation) from now on; an empty id: none.
  void Registered(const std::string& id, int64_t incarnation);
  // Ends the call held and makes none again.
  void Stop();

 private:
  void Loop();

  const Open open_;
  const absl::Duration min_backoff_, max_backoff_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string id_ ABSL_GUARDED_BY(mu_);
  int64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // held now
  std::thread thread_;
};

}  // namespace tally

#endif  // TALLY_PROTO_ATTENDANCE_H_
