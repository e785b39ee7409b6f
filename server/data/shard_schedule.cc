#include "server/data/shard_schedule.h"

#include "absl/strings/str_cat.h"
#include "proto/errors.h"

namespace tally {

absl::Status ShardSchedule::Set(int64_t total_steps, int64_t steps_per_epoch,
                                const std::string& fingerprint, int64_t plan) {
  if (total_steps <= 0 || steps_per_epoch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_steps and steps_per_epoch must be positive, got ",
                     total_steps, " and ", steps_per_epoch));
  }
  if (total_steps_ == 0) {
    plan_ = plan;  // the first: the coordinator's, at install
  } else if (plan < plan_) {
    return WithReason(
        absl::AbortedError(absl::StrCat(
            "the job's plan changed (plan ", plan_, ", this worker's ", plan,
            "): a worker joined; take the new plan and pull again")),
        v1::PLAN_CHANGED, plan_);
  } else if (plan > plan_) {
    return absl::UnavailableError(absl::StrCat(
        "the job's plan ", plan, " has not reached this shard yet (it has ",
        plan_, "): pull again"));
  }
  if (!fingerprint.empty() && !data_fingerprint_.empty() &&
      data_fingerprint_ != fingerprint) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "this worker's dataset files (", fingerprint,
                          ") differ from the job's (", data_fingerprint_,
                          "): every worker must read the same files")),
                      v1::SCHEDULE_MISMATCH);
  }
  if (total_steps_ != 0 &&
      (total_steps_ != total_steps || steps_per_epoch_ != steps_per_epoch)) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "this worker's schedule (", total_steps, " steps, ",
            steps_per_epoch, " per epoch) differs from the job's (",
            total_steps_, ", ", steps_per_epoch_,
            "): does this worker see another dataset?")),
        v1::SCHEDULE_MISMATCH);
  }
  total_steps_ = total_steps;
  steps_per_epoch_ = steps_per_epoch;
  if (data_fingerprint_.empty()) data_fingerprint_ = fingerprint;
  return absl::OkStatus();
}

absl::Status ShardSchedule::SetPlan(int64_t plan, int64_t total_steps,
                                    int64_t version, Optimizer* optimizer) {
  if (plan <= plan_) return absl::OkStatus();
  if (total_steps <= version) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan ", plan, " ends at version ", total_steps,
                     ", which this range has passed (", version, ")"));
  }
  plan_ = plan;
  total_steps_ = total_steps;
  if (optimizer != nullptr) optimizer->set_total_steps(total_steps);
  return absl::OkStatus();
}

}  // namespace tally
