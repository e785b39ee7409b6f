// The completion side of a push or pull over every shard of a job: the
// Work a caller holds (worker/param_client.h), which each shard's part
// (a unary call, an op on an Exchange stream) tells as it starts, as its
// values arrive and as it ends. And the count of calls whose reactor has
// not finished deleting itself, which a ParameterClient waits for before
// its channels go.
//
// Thread-safe.
#ifndef TALLY_WORKER_INTERNAL_SHARD_WORK_H_
#define TALLY_WORKER_INTERNAL_SHARD_WORK_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/param_client.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace tally {
namespace internal {

// The Work of one push or pull: the caller's side (Work's interface) and
// the completion side its parts call as they start, arrive and end.
class ShardWork final : public Work {
 public:
  explicit ShardWork(int parts, bool mixed_ok = false);

  absl::Status Wait(absl::Time deadline) override;
  absl::StatusOr<int64_t> WaitVersion(absl::Time deadline) override;
  absl::Status WaitRange(int64_t begin, int64_t end,
                         absl::Time deadline) override;
  void Cancel() override;
  bool Done() const override;
  std::vector<absl::Status> Results() const override;
  bool Committed() const override;

  // Called once per part, with its context (to cancel it) as it starts and
  // its result as it ends (`committed`: a push's commit was recorded).
  void Started(grpc::ClientContext* ctx);
  void Finished(int part, grpc::ClientContext* ctx, const absl::Status& status,
                int64_t version, bool cancel_others, bool committed = false);
  // A part that failed before it started.
  void Failed(int part, const absl::Status& status);
  // Part `part` of a pull covers [begin, end) of the vector; `upto`: its
  // elements before it have arrived.
  void SetRange(int part, int64_t begin, int64_t end);
  void Arrived(int part, int64_t upto);
  // The caller's buffer is lent to gRPC (a push's slices point into it)
  // until as many Returned() as Lend(): the work is not done before.
  // Returned() may run on any thread, inside gRPC, even one that holds
  // mu_ (a cancel): it takes lent_mu_ only.
  void Lend();
  void Returned();

 private:
  const bool mixed_ok_;  // different versions from different shards are fine
  mutable absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex lent_mu_;
  int lent_ ABSL_GUARDED_BY(lent_mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = -1;
  int committed_ ABSL_GUARDED_BY(mu_) = 0;  // parts whose commit was recorded
  bool mixed_versions_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> live_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  // A pull's parts: their ranges, how far each has arrived, which ended.
  std::vector<std::pair<int64_t, int64_t>> ranges_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> arrived_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> ended_ ABSL_GUARDED_BY(mu_);
};

// Calls whose reactor has not finished deleting itself. The client (and so
// its channels) outlives them: a channel whose last reference went with a
// call's context, inside gRPC's callback, crashes gRPC 1.51.
struct InFlightCalls {
  absl::Mutex mu;
  int calls ABSL_GUARDED_BY(mu) = 0;
  void Add() {
    absl::MutexLock lock(&mu);
    ++calls;
  }
  void Done() {
    absl::MutexLock lock(&mu);
    --calls;
  }
};

}  // namespace internal
}  // namespace tally

#endif  // TALLY_WORKER_INTERNAL_SHARD_WORK_H_
