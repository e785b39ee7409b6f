// RemoteShardControl against a shard process that misbehaves: what it may
// make the coordinator hold is bounded by the range it was given.
#include "server/control/remote_shard_control.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/tally.grpc.pb.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

// Answers SaveRange for a range of a few KiB with 1 MiB pieces, up to
// 400 MiB, for as long as the caller reads them.
class FloodingShard final : public v1::ShardService::Service {
 public:
  grpc::Status SaveRange(grpc::ServerContext* ctx,
                         const v1::SaveRangeRequest* req,
                         grpc::ServerWriter<v1::SaveRangeChunk>* out) override {
    v1::SaveRangeChunk chunk;
    chunk.mutable_state()->set_version(req->version());
    chunk.set_part(0);
    chunk.set_data(std::string(1 << 20, 'x'));
    for (int i = 0; i < 400 && !ctx->IsCancelled(); ++i) {
      if (!out->Write(chunk)) break;
      ++written;
      chunk.clear_state();
    }
    return grpc::Status::OK;
  }
  std::atomic<int> written{0};
};

TEST(RemoteShardControlTest, ASaveLargerThanTheRangeIsCutOffAtItsSize) {
  FloodingShard shard;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&shard);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<ShardControl> control = MakeRemoteShardControl(
      absl::StrCat("127.0.0.1:", port), TransportOptions());
  constexpr int64_t kCount = 1024;  // 4 KiB of weights
  EXPECT_THAT(control->Save("job-1", 1, 5, kCount, absl::Seconds(5),
                            /*weights_only=*/true),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("more than the range's 1024 values")));
  server->Shutdown();
  // Refused at the first piece: what the shard got to send is what the
  // stream's flow control let through, not the 400 MiB it had.
  EXPECT_LT(shard.written.load(), 64);
}

}  // namespace
}  // namespace tally
