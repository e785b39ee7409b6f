// The worker daemon's registration: it says the worker protocol it speaks
// (proto/tally.proto, WorkerProtocol), and a coordinator that needs a newer
// worker stops it at once with that reason, since retrying cannot help.
#include "worker/daemon.h"

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "proto/errors.h"
#include "proto/tally.grpc.pb.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;

// A coordinator newer than any worker: every registration is refused with
// PROTOCOL_TOO_OLD; the versions the registrations claimed are kept.
class TooNewCoordinator final : public v1::WorkerService::CallbackService {
 public:
  grpc::ServerUnaryReactor* RegisterWorker(
      grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* req,
      v1::RegisterWorkerResponse* /*resp*/) override {
    {
      absl::MutexLock lock(&mu_);
      versions_.push_back(req->protocol_version());
    }
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpc(WithReason(
        absl::FailedPreconditionError("this coordinator takes protocol 99"),
        v1::PROTOCOL_TOO_OLD)));
    return reactor;
  }

  std::vector<uint32_t> versions() {
    absl::MutexLock lock(&mu_);
    return versions_;
  }

 private:
  absl::Mutex mu_;
  std::vector<uint32_t> versions_ ABSL_GUARDED_BY(mu_);
};

TEST(WorkerDaemonTest, SendsItsProtocolAndStopsWhenTheCoordinatorNeedsANewer) {
  TooNewCoordinator coordinator;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  DaemonOptions o;
  o.server = absl::StrCat("127.0.0.1:", port);
  o.verbose = false;
  WorkerDaemon daemon(o);
  // Run() returns by itself: no Stop() is needed.
  const absl::Status s = daemon.Run();
  EXPECT_THAT(s, HasReason(absl::StatusCode::kFailedPrecondition,
                           v1::PROTOCOL_TOO_OLD));
  // One registration (not retried), with this build's protocol.
  EXPECT_EQ(coordinator.versions(),
            std::vector<uint32_t>(
                1, static_cast<uint32_t>(v1::WORKER_PROTOCOL_CURRENT)));
  server->Shutdown();
}

}  // namespace
}  // namespace tally
