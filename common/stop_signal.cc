#include "common/stop_signal.h"

#include <atomic>
#include <csignal>

#include "absl/time/clock.h"

namespace tally {

namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void OnSignal(int sig) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, sig);
}

}  // namespace

void InstallStopSignals() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
}

int StopSignal() { return g_stop_signal.load(); }

void RequestStop(int sig) { OnSignal(sig); }

int WaitForStopSignal(absl::Duration poll) {
  while (StopSignal() == 0) absl::SleepFor(poll);
  return StopSignal();
}

}  // namespace tally
