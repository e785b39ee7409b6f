#include "proto/attendance.h"

#include <algorithm>
#include <utility>

namespace tally {

Attendance::Attendance(Open open, absl::Duration min_backoff,
                       absl::Duration max_backoff)
    : open_(std::move(open)),
      min_backoff_(min_backoff),
      max_backoff_(max_backoff),
      thread_([this] { Loop(); }) {}

Attendance::~Attendance() {
  Stop();
  thread_.join();
}

void Attendance::Registered(const std::string& id, int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  id_ = id;
  incarnation_ = incarnation;
  // The last registration's call ends; Loop makes this one's.
  if (call_ != nullptr) call_->TryCancel();
}

void Attendance::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  if (call_ != nullptr) call_->TryCancel();
}

void Attendance::Loop() {
  absl::Duration backoff = min_backoff_;
  while (true) {
    grpc::ClientContext ctx;
    std::string id;
    int64_t incarnation = 0;
    {
      absl::MutexLock lock(&mu_);
      auto registered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !id_.empty();
      };
      mu_.Await(absl::Condition(&registered));
      if (stop_) return;
      id = id_;
      incarnation = incarnation_;
      call_ = &ctx;
    }
    auto reader = open_(&ctx, id, incarnation);
    v1::AttendResponse ignored;
    while (reader->Read(&ignored)) {
    }
    const grpc::Status st = reader->Finish();
    absl::MutexLock lock(&mu_);
    call_ = nullptr;
    if (stop_ || st.error_code() == grpc::StatusCode::UNIMPLEMENTED) return;
    // Again at once for a new registration; after a backoff for the same
    // one.
    auto moved = [this, &id, incarnation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                     mu_) {
      return stop_ || id_ != id || incarnation_ != incarnation;
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&moved), backoff)) {
      backoff = min_backoff_;
    } else {
      backoff = std::min(backoff * 2, max_backoff_);
    }
  }
}

}  // namespace tally
