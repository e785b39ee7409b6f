// A range's schedule: the job's total steps and steps per epoch, the plan
// they belong to (a job that grew runs a newer plan), and the dataset
// fingerprint its workers claim. The first claim fixes each; later claims
// must agree (ParameterShard::SetSchedule).
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock.
#ifndef TALLY_SERVER_DATA_SHARD_SCHEDULE_H_
#define TALLY_SERVER_DATA_SHARD_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/optim/optimizer.h"

namespace tally {

class ShardSchedule {
 public:
  // `plan`: the plan the range is installed with.
  explicit ShardSchedule(int64_t plan) : plan_(plan) {}

  // A worker's claim (ParameterShard::SetSchedule's codes).
  absl::Status Set(int64_t total_steps, int64_t steps_per_epoch,
                   const std::string& fingerprint, int64_t plan);
  // The job's plan `plan` runs `total_steps` versions (the range is at
  // `version`; `optimizer`, if any, learns the new total). An older or the
  // same plan changes nothing; kInvalidArgument past that total already.
  absl::Status SetPlan(int64_t plan, int64_t total_steps, int64_t version,
                       Optimizer* optimizer);
  // A restored range's schedule, as its checkpoint had it.
  void GoOnFrom(int64_t total_steps, int64_t steps_per_epoch) {
    total_steps_ = total_steps;
    steps_per_epoch_ = steps_per_epoch;
  }
  // Whether the training is over at `version`.
  bool Ended(int64_t version) const {
    return total_steps_ > 0 && version >= total_steps_;
  }
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }

 private:
  int64_t total_steps_ = 0;
  int64_t plan_ = 0;
  int64_t steps_per_epoch_ = 0;
  std::string data_fingerprint_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARD_SCHEDULE_H_
