// EventWriteReactor: the base of Tally's server-streaming reactors that are
// woken by events from elsewhere (a shard reaching a version, a job
// changing). Internal to server/.
#ifndef TALLY_SERVER_INTERNAL_EVENT_REACTOR_H_
#define TALLY_SERVER_INTERNAL_EVENT_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tally::internal {

// A server-streaming reactor woken by events from elsewhere (a shard reaching
// a version, a job changing). The event sources hold a Handle, never the
// reactor: once gRPC is done with the call the handle is cleared, so a late
// event finds nothing instead of a deleted reactor. The base owns the
// finish-once and cancel logic; Derived writes under mu_.
template <typename Derived, typename Response>
class EventWriteReactor : public grpc::ServerWriteReactor<Response> {
 public:
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (!writing_)
      FinishOnceLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    static_cast<Derived*>(this)->Release();
    {
      absl::MutexLock lock(&handle_->mu);
      handle_->reactor = nullptr;
    }
    delete this;
  }

 protected:
  EventWriteReactor() : handle_(std::make_shared<Handle>()) {
    absl::MutexLock lock(&handle_->mu);
    handle_->reactor = static_cast<Derived*>(this);
  }

  // A callable for an event source: runs fn(reactor, args...) while the call
  // is live, and nothing after.
  template <typename Fn>
  auto WhileLive(Fn fn) {
    return [handle = handle_, fn](auto&&... args) {
      absl::MutexLock lock(&handle->mu);
      if (handle->reactor != nullptr)
        fn(handle->reactor, std::forward<decltype(args)>(args)...);
    };
  }

  // Hook for OnDone, before the reactor goes (unsubscribe and the like).
  void Release() {}

  void StartWriteLocked(const Response* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    this->StartWrite(r);
  }
  void FinishOnce(const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    FinishOnceLocked(s);
  }
  void FinishOnceLocked(const grpc::Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    this->Finish(s);
  }
  // Called by Derived::OnWriteDone first: false when the stream is over.
  bool WriteDoneLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = false;
    if (!ok) {
      FinishOnceLocked(
          grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    }
    return ok && !finished_;
  }

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;

 private:
  struct Handle {
    absl::Mutex mu;
    Derived* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<Handle> handle_;
};

}  // namespace tally::internal

#endif  // TALLY_SERVER_INTERNAL_EVENT_REACTOR_H_
