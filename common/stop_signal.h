// SIGINT and SIGTERM for a program's main(): install once, then poll.
//
// The flag is the one global in Tally: a signal handler can reach nothing
// else. It is a lock-free atomic, safe to store from a handler and to read
// from any thread.
#ifndef TALLY_COMMON_STOP_SIGNAL_H_
#define TALLY_COMMON_STOP_SIGNAL_H_

#include "absl/time/time.h"

namespace tally {

// From now on SIGINT and SIGTERM set the stop flag instead of killing.
void InstallStopSignals();

// The signal that asked to stop, or 0.
int StopSignal();

// Sets the flag from the program itself (to end a thread that waits for
// it); a signal that came first is kept.
void RequestStop(int sig);

// Sleeps in steps of `poll` until the flag is set; returns the signal.
int WaitForStopSignal(absl::Duration poll = absl::Milliseconds(100));

}  // namespace tally

#endif  // TALLY_COMMON_STOP_SIGNAL_H_
