// What a ParameterShard keeps of each member of its job: the
// coordinator's decision (MemberSpec), the member's progress, and what it
// pushed that waits for its step to close. Plain data, read and changed
// under the shard's lock by the shard and its parts (ShardMembers,
// StreamedSum, RowStaging, StepRules).
#ifndef TALLY_SERVER_DATA_SHARD_MEMBER_H_
#define TALLY_SERVER_DATA_SHARD_MEMBER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/shard_control.h"

namespace tally {

// A push kept until its step closes (async: until it is applied).
struct StagedPush {
  std::unique_ptr<std::vector<float>> grads;  // null: contributes nothing
  int64_t base = 0;  // the version it was computed from
  int64_t samples = 0;
  double loss_sum = 0.0;
  int64_t correct = 0;
  // async, in the apply queue: the pusher's buffers and rank.
  std::shared_ptr<const std::string> buffers;
  int rank = 0;
};

// A member's row gradients of one step for one table (StageRows).
struct RowGrads {
  int table = 0;
  std::vector<int64_t> rows;
  std::vector<float> grads;  // rows.size() * dim
};

// A member's row gradients of one step, by PushRowsRequest.piece.
struct StagedRows {
  int64_t samples = 0;
  std::map<int, std::vector<RowGrads>> pieces;
};

struct ShardMember {
  MemberSpec spec;
  std::map<int64_t, StagedRows> rows;  // by step
  int64_t pushed_step = -1;            // last step pushed (staged or rejected)
  int64_t committed_step = -1;         // last step committed
  std::map<int64_t, StagedPush> staged;  // by step: at most staleness + 1
  int64_t clock = -1;                    // MemberProgress
  bool waiting = false;
  bool last_refused = false;
  // The step whose streamed sum lost its push: it pushes it again
  // before it may commit it or wait for the step's end (-1: none).
  int64_t push_again = -1;
  // The buffers its pushes carried, by step, until the step closes.
  std::map<int64_t, std::shared_ptr<const std::string>> buffers;
};

// Whether `m` belongs to step `step`: [join_step, leave_step).
inline bool Required(const ShardMember& m, int64_t step) {
  return m.spec.join_step <= step && step < m.spec.leave_step;
}

// What the pushes that count in a step add up to, besides their gradients.
struct StepTally {
  int64_t samples = 0;
  double loss = 0.0;
  int64_t correct = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARD_MEMBER_H_
