// The allocator settings: memory freed after a burst of large transient
// buffers goes back to the kernel when ReturnFreeMemory is called.
#include "common/malloc_tuning.h"

#include <malloc.h>

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(MallocTuningTest, FreedBuffersGoBackOnlyWhenAskedAndOnlyAboveTheKeep) {
  TuneMallocForBulkTransfers();
  // 400 MiB in 1 MiB blocks (under the mmap threshold: they come from the
  // heap, as gRPC's message slices do), then freed.
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 400; ++i) {
    blocks.emplace_back(new char[1 << 20]);
    blocks.back()[0] = 1;
  }
  blocks.clear();
  // The trim threshold keeps it in the heap...
  EXPECT_GT(mallinfo2().fordblks, size_t{300} << 20);
  // ...until asked; then at most about the keep stays free.
  EXPECT_TRUE(ReturnFreeMemory(size_t{64} << 20));
  EXPECT_FALSE(ReturnFreeMemory(size_t{1} << 40));  // under the keep: no-op
}

}  // namespace
}  // namespace tally
