#include "proto/transport.h"

#include "gtest/gtest.h"

namespace tally {
namespace {

// A shard map's ":PORT" is that port on the host the worker dials for the
// coordinator, whatever form the host takes; a full address stays as it is.
TEST(ResolveShardAddressTest, APortAloneIsOnTheCoordinatorsHost) {
  EXPECT_EQ(ResolveShardAddress("server:7070", ":7071"), "server:7071");
  EXPECT_EQ(ResolveShardAddress("10.0.0.5:7070", ":9000"), "10.0.0.5:9000");
  EXPECT_EQ(ResolveShardAddress("[::1]:7070", ":7071"), "[::1]:7071");
  EXPECT_EQ(ResolveShardAddress("unix:/tmp/s:7070", ":7071"),
            "unix:/tmp/s:7071");
  EXPECT_EQ(ResolveShardAddress("server:7070", "shard1:7070"), "shard1:7070");
  EXPECT_EQ(ResolveShardAddress("server:7070", ""), "server:7070");
}

}  // namespace
}  // namespace tally
