#include "worker/health.h"

#include "absl/synchronization/mutex.h"

namespace tally {

namespace {

using grpc::health::v1::HealthCheckResponse;

// Sends SERVING once, then holds the stream open until the client leaves.
class WatchReactor final
    : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  WatchReactor() {
    resp_.set_status(HealthCheckResponse::SERVING);
    StartWrite(&resp_);
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    written_ = true;
    if (!ok || cancelled_) FinishOnce();
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (written_) FinishOnce();
  }
  void OnDone() override { delete this; }

 private:
  void FinishOnce() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status::OK);
  }
  HealthCheckResponse resp_;
  absl::Mutex mu_;
  bool written_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerUnaryReactor* HealthService::Check(
    grpc::CallbackServerContext* ctx,
    const grpc::health::v1::HealthCheckRequest* req,
    HealthCheckResponse* resp) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  if (!req->service().empty() && req->service() != "tally.worker") {
    r->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
    return r;
  }
  resp->set_status(HealthCheckResponse::SERVING);
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext*, const grpc::health::v1::HealthCheckRequest*) {
  return new WatchReactor();
}

}  // namespace tally
