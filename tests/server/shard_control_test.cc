// RemoteShardControl against a shard process that misbehaves: what it may
// make the coordinator hold is bounded by the range it was given.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/tally.grpc.pb.h"
#include "server/control/remote_shard_control.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

// Answers SaveRange for a range of a few KiB with pieces of `piece` bytes,
// up to 400, for as long as the caller reads them: all of part 0 (a flood
// of weights), or each of its own part (many parts of the range's size).
class FloodingShard final : public v1::ShardService::Service {
 public:
  FloodingShard(size_t piece, bool part_each)
      : piece_(piece), part_each_(part_each) {}
  grpc::Status SaveRange(grpc::ServerContext* ctx,
                         const v1::SaveRangeRequest* req,
                         grpc::ServerWriter<v1::SaveRangeChunk>* out) override {
    v1::SaveRangeChunk chunk;
    chunk.mutable_state()->set_version(req->version());
    chunk.set_data(std::string(piece_, 'x'));
    for (int i = 0; i < 400 && !ctx->IsCancelled(); ++i) {
      chunk.set_part(part_each_ ? i : 0);
      if (!out->Write(chunk)) break;
      ++written;
      chunk.clear_state();
    }
    return grpc::Status::OK;
  }
  std::atomic<int> written{0};

 private:
  const size_t piece_;
  const bool part_each_;
};

// This process's peak resident memory (VmHWM), in bytes.
int64_t PeakRss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

std::unique_ptr<grpc::Server> Serve(FloodingShard* shard, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           port);
  builder.RegisterService(shard);
  return builder.BuildAndStart();
}

TEST(RemoteShardControlTest, ASaveLargerThanTheRangeIsCutOffAtItsSize) {
  FloodingShard shard(1 << 20, /*part_each=*/false);
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&shard, &port);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<ShardControl> control = MakeRemoteShardControl(
      absl::StrCat("127.0.0.1:", port), TransportOptions());
  constexpr int64_t kCount = 1024;  // 4 KiB of weights
  const int64_t peak_before = PeakRss();
  EXPECT_THAT(control->Save("job-1", 1, 5, kCount, absl::Seconds(5),
                            /*weights_only=*/true),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("more than the range's 1024 values")));
  server->Shutdown();
  // Measured once: the process (the fake shard's sending side included)
  // grew by far less than the 400 MiB the shard had to send.
  ASSERT_GT(peak_before, 0);
  EXPECT_LT(PeakRss() - peak_before, int64_t{100} << 20);
  // Refused at the first piece: what the shard got to send is what the
  // stream's flow control let through, not the 400 MiB it had.
  EXPECT_LT(shard.written.load(), 64);
}

// Each part within the range's size, but more parts than a range's state
// has (the weights and the optimizer's slots): refused at the first one
// too many, so the caller holds no more than the range's state.
TEST(RemoteShardControlTest, MorePartsThanAStateHasAreRefused) {
  constexpr int64_t kCount = 1024;
  FloodingShard shard(4 * kCount, /*part_each=*/true);
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&shard, &port);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<ShardControl> control = MakeRemoteShardControl(
      absl::StrCat("127.0.0.1:", port), TransportOptions());
  EXPECT_THAT(control->Save("job-1", 1, 5, kCount, absl::Seconds(5),
                            /*weights_only=*/true),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
  EXPECT_THAT(control->Save("job-1", 1, 5, kCount, absl::Seconds(5),
                            /*weights_only=*/false),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
  server->Shutdown();
}

// A hold's report crosses the wire whole: an async job's join bound reads
// each member's clock from a shard on another host.
TEST(ShardControlProtoTest, AMembersProgressCrossesTheWireWhole) {
  MemberProgress p;
  p.worker_id = "worker-7";
  p.incarnation = 3;
  p.pushed_step = 41;
  p.committed_step = 40;
  p.clock = 42;
  p.waiting = true;
  p.last_refused = true;
  const MemberProgress q = FromProto(ToProto(p));
  EXPECT_EQ(q.worker_id, p.worker_id);
  EXPECT_EQ(q.incarnation, p.incarnation);
  EXPECT_EQ(q.pushed_step, p.pushed_step);
  EXPECT_EQ(q.committed_step, p.committed_step);
  EXPECT_EQ(q.clock, p.clock);
  EXPECT_EQ(q.waiting, p.waiting);
  EXPECT_EQ(q.last_refused, p.last_refused);
}

}  // namespace
}  // namespace tally
