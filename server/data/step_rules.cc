#include "server/data/step_rules.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/errors.h"
#include "server/data/shard_stats.h"

namespace tally {

bool StepRules::AllowsStreaming() const {
  switch (spec_.mode) {
    case ConsistencyMode::kAsync:
      return false;
    case ConsistencyMode::kSsp:
      return spec_.staleness == 0;
    case ConsistencyMode::kBsp:
      return spec_.backup_workers == 0;
  }
  return false;
}

float StepRules::Scale(int64_t tau) const {
  if (spec_.lr_scaling != LrScaling::kStaleness || tau <= 1) return 1.0f;
  return 1.0f / static_cast<float>(tau);
}

int StepRules::StagingLimit(size_t members) const {
  const int window = spec_.mode == ConsistencyMode::kSsp
                         ? static_cast<int>(spec_.staleness)
                         : 0;
  return (2 + window) * static_cast<int>(members) + 4;
}

absl::Status StepRules::CheckPush(const PushMeta& meta, const ShardMember& m,
                                  int64_t version, bool ended, bool* duplicate,
                                  PushCounts* counts) const {
  *duplicate = false;
  if (meta.samples < 0) {
    return absl::InvalidArgumentError("samples must not be negative");
  }
  if (max_samples_ > 0 && meta.samples > max_samples_) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples ", meta.samples, " is over the job's batch size ",
                     max_samples_));
  }
  if (meta.buffers != nullptr &&
      static_cast<int64_t>(meta.buffers->size()) != buffer_bytes_) {
    return absl::InvalidArgumentError(
        buffer_bytes_ == 0
            ? std::string("this range keeps no buffers (a Python model's go "
                          "to the range at offset 0)")
            : absl::StrCat("buffers of ", meta.buffers->size(),
                           " bytes; the job's are ", buffer_bytes_));
  }
  return async() ? CheckAsyncPush(meta, m, version, ended, duplicate, counts)
                 : CheckStepPush(meta, m, version, ended, duplicate, counts);
}

absl::Status StepRules::Stale(const PushMeta& meta, int64_t staleness,
                              int64_t version, PushCounts* counts) const {
  ++counts->stale;
  return WithReason(
      absl::AbortedError(absl::StrCat(
          "the push was computed from version ", meta.base_version,
          ", staleness ", staleness, " > max_staleness ", spec_.max_staleness,
          "; refused and counted: pull and go on")),
      v1::STALE_GRADIENT, version);
}

// Async: a member's steps are its own clock; every push is applied alone.
absl::Status StepRules::CheckAsyncPush(const PushMeta& meta,
                                       const ShardMember& m, int64_t version,
                                       bool ended, bool* duplicate,
                                       PushCounts* counts) const {
  if (meta.step <= m.pushed_step) {
    *duplicate = true;
    return absl::OkStatus();
  }
  if (ended) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "the training is over at version ", version)),
                      v1::STEP_CLOSED, version);
  }
  if (meta.base_version < 0 || meta.base_version > version) {
    return absl::InvalidArgumentError(
        absl::StrCat("async: base version ", meta.base_version,
                     " is not one this shard served (at ", version, ")"));
  }
  const int64_t tau = version - meta.base_version;
  const int64_t max_stale = spec_.max_staleness;
  if (max_stale >= 0 && tau > max_stale)
    return Stale(meta, tau, version, counts);
  return absl::OkStatus();
}

// bsp and ssp: the push's step against the open ones, its base version
// against the step.
absl::Status StepRules::CheckStepPush(const PushMeta& meta,
                                      const ShardMember& m, int64_t version,
                                      bool ended, bool* duplicate,
                                      PushCounts* counts) const {
  if (meta.step < version && m.pushed_step >= meta.step) {
    *duplicate = true;
    return absl::OkStatus();
  }
  // A step that closed without this push, or one that will never open (the
  // training is over): either way, the next thing to do is to pull.
  if (meta.step < version || ended) {
    if (meta.step < version && Required(m, meta.step)) ++counts->late;
    return WithReason(
        absl::AbortedError(absl::StrCat("step ", meta.step,
                                        " is closed; the weights are at "
                                        "version ",
                                        version, ": pull and go on")),
        v1::STEP_CLOSED, version);
  }
  const int64_t window = spec_.Window();
  if (meta.step > version + window) {
    // ABORTED: redo at a higher level (pull this step, compute it again).
    return WithReason(
        absl::AbortedError(absl::StrCat(
            "step ", meta.step, " is not open yet (open: ", version,
            window > 0 ? absl::StrCat(" to ", version + window) : "", ")")),
        v1::STEP_NOT_OPEN, version);
  }
  if (meta.base_version > meta.step || meta.base_version < meta.step - window ||
      meta.base_version > version) {
    return absl::InvalidArgumentError(
        window == 0
            ? absl::StrCat("bsp: a push for step ", meta.step,
                           " must be computed from version ", meta.step,
                           ", not ", meta.base_version)
            : absl::StrCat("ssp(", window, "): a push for step ", meta.step,
                           " must be computed from a version in [",
                           meta.step - window, ", ",
                           std::min(meta.step, version), "], not ",
                           meta.base_version));
  }
  const int64_t max_stale = spec_.max_staleness;
  if (max_stale >= 0 && meta.step - meta.base_version > max_stale)
    return Stale(meta, meta.step - meta.base_version, version, counts);
  if (m.spec.join_step > meta.step) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "worker ", meta.worker_id, " joins at step ",
                          m.spec.join_step, "; pull that version first")),
                      v1::JOIN_LATER, m.spec.join_step);
  }
  if (m.pushed_step >= meta.step) *duplicate = true;
  return absl::OkStatus();
}

absl::Status StepRules::CheckRows(const ShardMember& m, int64_t step,
                                  int64_t samples, int64_t version,
                                  bool ended) const {
  if (absl::Status s = CheckRowsStep(m, step, version, ended); !s.ok())
    return s;
  if (samples < 0 || (max_samples_ > 0 && samples > max_samples_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples ", samples, " outside [0, ", max_samples_, "]"));
  }
  return absl::OkStatus();
}

absl::Status StepRules::CheckRowsStep(const ShardMember& m, int64_t step,
                                      int64_t version, bool ended) const {
  if (async()) {
    // A member's steps are its own clock: rows of a step it has not
    // pushed yet.
    if (ended) {
      return WithReason(absl::AbortedError(absl::StrCat(
                            "the training is over at version ", version)),
                        v1::STEP_CLOSED, version);
    }
    if (step <= m.pushed_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rows of step ", step, " after its push: send them before it"));
    }
    return absl::OkStatus();
  }
  // bsp: the open step; ssp: one of the open window's.
  const int64_t window = spec_.Window();
  if (ended || step < version) {
    return WithReason(
        absl::AbortedError(absl::StrCat(
            "step ", step, " closed; the weights are at version ", version)),
        v1::STEP_CLOSED, version);
  }
  if (step > version + window) {
    return WithReason(absl::AbortedError(absl::StrCat(
                          "step ", step, " is not open; the weights are at ",
                          "version ", version)),
                      v1::STEP_NOT_OPEN, version);
  }
  if (m.spec.join_step > step) {
    return WithReason(absl::AbortedError(absl::StrCat("a member from step ",
                                                      m.spec.join_step, " on")),
                      v1::JOIN_LATER, m.spec.join_step);
  }
  if (m.committed_step >= step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rows of step ", step, " after its commit: send them before the push"));
  }
  return absl::OkStatus();
}

}  // namespace tally
