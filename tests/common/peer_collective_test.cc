// The peer-copy all-reduce over CPU devices and over devices that behave
// like GPUs (OffHostDevice): sums, odd sizes, failures and a missed barrier.
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "common/device.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "tests/off_host_device.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::OffHostDevice;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

struct Group {
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<DeviceBuffer<float>> buffers;
  std::vector<std::vector<float>> inputs;  // what each buffer started with
  std::unique_ptr<Collective> collective;

  Group(int k, int64_t n, bool off_host, absl::Duration timeout) {
    std::vector<Device*> raw;
    for (int r = 0; r < k; ++r) {
      const DeviceId id{DeviceType::kCpu, r};
      devices.push_back(off_host ? *OffHostDevice::Open(id) : *OpenDevice(id));
      raw.push_back(devices.back().get());
      Rng rng(100 + r);
      std::vector<float> v(n);
      for (float& x : v) x = rng.Uniform(-1, 1);
      buffers.push_back(*DeviceBuffer<float>::Create(raw.back(), n));
      std::copy(v.begin(), v.end(), buffers.back().data());
      inputs.push_back(std::move(v));
    }
    collective = CreatePeerCollective(raw, timeout);
  }

  // Every rank calls AllReduceSum on its own thread, as the engine does.
  std::vector<absl::Status> Run(std::vector<int64_t> counts) {
    std::vector<absl::Status> out(devices.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < devices.size(); ++r) {
      threads.emplace_back([&, r] {
        out[r] = collective->AllReduceSum(static_cast<int>(r),
                                          buffers[r].data(), counts[r]);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }
};

class PeerCollectiveTest
    : public ::testing::TestWithParam<std::tuple<int, int64_t, bool>> {};

TEST_P(PeerCollectiveTest, EveryMemberGetsTheSum) {
  const auto [k, n, off_host] = GetParam();
  Group g(k, n, off_host, absl::Seconds(30));
  EXPECT_STREQ(g.collective->name(), "peer");
  for (int round = 0; round < 2; ++round) {  // buffers are reused
    std::vector<float> want(n, 0.0f);
    for (const auto& in : g.inputs)
      for (int64_t i = 0; i < n; ++i) want[i] += in[i];
    for (const absl::Status& s : g.Run(std::vector<int64_t>(k, n)))
      TALLY_ASSERT_OK(s);
    for (int r = 0; r < k; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(g.buffers[r].data()[i], want[i], 1e-5f)
            << "rank " << r << " element " << i << " round " << round;
      }
      g.inputs[r].assign(g.buffers[r].data(), g.buffers[r].data() + n);
    }
  }
}

// Sizes smaller than the group leave some slices empty.
INSTANTIATE_TEST_SUITE_P(Sizes, PeerCollectiveTest,
                         ::testing::Values(std::make_tuple(1, 10, false),
                                           std::make_tuple(2, 1001, false),
                                           std::make_tuple(3, 2, false),
                                           std::make_tuple(4, 4099, false),
                                           std::make_tuple(2, 1001, true),
                                           std::make_tuple(3, 5000, true)));

TEST(PeerCollectiveErrorsTest, DifferentSizesAreInvalidArgumentEverywhere) {
  Group g(2, 100, false, absl::Seconds(30));
  for (const absl::Status& s : g.Run({100, 99})) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("sizes differ")));
  }
  // Nothing moved, and the group still works.
  EXPECT_EQ(g.buffers[0].data()[5], g.inputs[0][5]);
  for (const absl::Status& s : g.Run({100, 100})) TALLY_EXPECT_OK(s);
  EXPECT_NEAR(g.buffers[1].data()[5], g.inputs[0][5] + g.inputs[1][5], 1e-6);
}

TEST(PeerCollectiveErrorsTest, AMissedBarrierTimesOutAndBreaksTheGroup) {
  Group g(2, 100, false, absl::Milliseconds(50));
  // Rank 1 never comes.
  EXPECT_THAT(g.collective->AllReduceSum(0, g.buffers[0].data(), 100),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("did not arrive")));
  EXPECT_THAT(
      g.collective->AllReduceSum(1, g.buffers[1].data(), 100),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("broken")));
  EXPECT_EQ(g.buffers[0].data()[7], g.inputs[0][7]);
}

TEST(PeerCollectiveErrorsTest, BadRankIsInvalidArgument) {
  Group g(2, 10, false, absl::Seconds(1));
  EXPECT_THAT(g.collective->AllReduceSum(2, g.buffers[0].data(), 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
}

// The default CopyFromPeer bounces through host memory between devices that
// cannot see each other; between CPU devices it is a plain copy.
TEST(DevicePeerCopyTest, CopiesBetweenHostAndOffHostDevices) {
  auto cpu = *OpenDevice({DeviceType::kCpu, 0});
  OffHostDevice off({DeviceType::kCpu, 1});
  std::vector<float> src = {1, 2, 3, 4};
  auto a = *DeviceBuffer<float>::Create(cpu.get(), 4);
  auto b = *DeviceBuffer<float>::Create(&off, 4);
  TALLY_ASSERT_OK(off.CopyFromHost(b.data(), src.data(), 16));
  TALLY_ASSERT_OK(cpu->CopyFromPeer(a.data(), off, b.data(), 16));
  EXPECT_EQ(a.data()[3], 4.0f);
  a.data()[0] = 9;
  TALLY_ASSERT_OK(off.CopyFromPeer(b.data(), *cpu, a.data(), 16));
  TALLY_ASSERT_OK(off.Synchronize());
  std::vector<float> back(4);
  TALLY_ASSERT_OK(off.CopyToHost(back.data(), b.data(), 16));
  EXPECT_EQ(back[0], 9.0f);
}

// The async-copy checker of OffHostDevice itself: a device-to-host copy
// lands at Synchronize, and a source changed before then is reported.
TEST(OffHostDeviceTest, AsyncCopiesLandAtSynchronizeAndRacesAreCaught) {
  OffHostDevice d({DeviceType::kCpu, 0});
  auto buf = *DeviceBuffer<float>::Create(&d, 2);
  buf.data()[0] = 1;
  buf.data()[1] = 2;
  float host[2] = {0, 0};
  TALLY_ASSERT_OK(d.CopyToHostAsync(host, buf.data(), sizeof(host)));
  EXPECT_EQ(host[0], 0.0f);  // not yet
  TALLY_ASSERT_OK(d.Synchronize());
  EXPECT_EQ(host[1], 2.0f);
  TALLY_ASSERT_OK(d.CopyToHostAsync(host, buf.data(), sizeof(host)));
  buf.data()[1] = 5;  // a later kernel overwrote the source
  EXPECT_THAT(d.Synchronize(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("race")));
  EXPECT_EQ(d.async_to_host(), 2);
}

// A mark lands the copies to host enqueued before it, and only those.
TEST(OffHostDeviceTest, WaitingOnAMarkLandsTheCopiesBeforeIt) {
  OffHostDevice d({DeviceType::kCpu, 0});
  auto buf = *DeviceBuffer<float>::Create(&d, 2);
  buf.data()[0] = 1;
  buf.data()[1] = 2;
  float first = 0, second = 0;
  TALLY_ASSERT_OK(d.CopyToHostAsync(&first, buf.data(), sizeof(float)));
  auto mark = d.MarkCopiesToHost();
  TALLY_ASSERT_OK(mark.status());
  TALLY_ASSERT_OK(d.CopyToHostAsync(&second, buf.data() + 1, sizeof(float)));
  TALLY_ASSERT_OK(d.WaitCopiesToHost(*mark));
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(second, 0.0f);  // after the mark: not yet
  buf.data()[0] = 7;        // landed: its source is free again
  TALLY_ASSERT_OK(d.Synchronize());
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(second, 2.0f);
  EXPECT_THAT(d.WaitCopiesToHost(5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mark")));
}

}  // namespace
}  // namespace tally
