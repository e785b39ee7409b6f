// SIGTERM and SIGINT set the stop flag instead of ending the process.
#include "common/stop_signal.h"

#include <csignal>

#include "gtest/gtest.h"

namespace tally {
namespace {

// One test: the flag is process-wide and set once.
TEST(StopSignalTest, ASignalSetsTheFlagAndTheFirstOneIsKept) {
  InstallStopSignals();
  EXPECT_EQ(StopSignal(), 0);
  ASSERT_EQ(std::raise(SIGTERM), 0);  // would end the test binary otherwise
  EXPECT_EQ(StopSignal(), SIGTERM);
  RequestStop(SIGINT);
  EXPECT_EQ(StopSignal(), SIGTERM);
  EXPECT_EQ(WaitForStopSignal(absl::Milliseconds(1)), SIGTERM);
}

}  // namespace
}  // namespace tally
