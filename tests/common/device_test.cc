#include "common/device.h"

#include "common/kernels.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ParseDevicesTest, CpuReplicas) {
  auto d = ParseDevices("cpu:3");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 3u);
  EXPECT_EQ((*d)[2], (DeviceId{DeviceType::kCpu, 2}));
  EXPECT_EQ((*d)[2].ToString(), "cpu:2");
}

TEST(ParseDevicesTest, MalformedSpecsAreInvalidArgument) {
  for (const char* bad : {"cpu", "cpu:0", "cpu:-1", "cpu:x", "tpu:1", "",
                          "cuda:a", "cuda:0,0", "cuda:"}) {
    EXPECT_THAT(ParseDevices(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("--devices")))
        << bad;
  }
}

TEST(ParseDevicesTest, CudaWithoutUsableGpuFailsClearly) {
  if (CudaBackendCompiled()) GTEST_SKIP() << "covered by the CUDA tests";
  EXPECT_THAT(ParseDevices("cuda:all"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no CUDA backend")));
}

TEST(CpuDeviceTest, AllocatesCopiesAndReportsKernelErrorsOnSync) {
  auto dev = OpenDevice({DeviceType::kCpu, 0});
  ASSERT_TRUE(dev.ok());
  EXPECT_TRUE((*dev)->host_accessible());
  auto buf = DeviceBuffer<float>::Create(dev->get(), 4);
  ASSERT_TRUE(buf.ok());
  float host[4] = {1, 2, 3, 4}, back[4] = {};
  TALLY_ASSERT_OK((*dev)->CopyFromHost(buf->data(), host, sizeof(host)));
  (*dev)->kernels().Scale(4, 2.0f, buf->data());
  TALLY_ASSERT_OK((*dev)->CopyToHost(back, buf->data(), sizeof(back)));
  EXPECT_EQ(back[3], 8.0f);
  // A bad label is reported once, at the next synchronisation point.
  int32_t label = 7;
  float stats[2];
  (*dev)->kernels().SoftmaxCrossEntropyStats(buf->data(), &label, 1, 4, stats);
  EXPECT_THAT((*dev)->Synchronize(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("label")));
  TALLY_EXPECT_OK((*dev)->Synchronize());
}

}  // namespace
}  // namespace tally
