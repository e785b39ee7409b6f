#include "server/shard_control.h"

#include <cstring>
#include <utility>

namespace tally {

namespace {

bool BytesToFloats(const std::string& bytes, int64_t want,
                   std::vector<float>* out) {
  if (want < 0 || bytes.size() != static_cast<uint64_t>(want) * 4) return false;
  out->resize(want);
  std::memcpy(out->data(), bytes.data(), bytes.size());
  return true;
}

}  // namespace

MemberSpec FromProto(const v1::MemberSpec& m) {
  MemberSpec s;
  s.worker_id = m.worker_id();
  s.incarnation = m.incarnation();
  s.rank = m.rank();
  s.join_step = m.join_step();
  s.leave_step = m.leave_step() > 0 ? m.leave_step() : MemberSpec::kNoStep;
  s.last_refused = m.last_refused();
  return s;
}

v1::MemberSpec ToProto(const MemberSpec& m) {
  v1::MemberSpec s;
  s.set_worker_id(m.worker_id);
  s.set_incarnation(m.incarnation);
  s.set_rank(m.rank);
  s.set_join_step(m.join_step);
  s.set_leave_step(m.leave_step == MemberSpec::kNoStep ? 0 : m.leave_step);
  s.set_last_refused(m.last_refused);
  return s;
}

MemberProgress FromProto(const v1::MemberProgress& m) {
  MemberProgress p;
  p.worker_id = m.worker_id();
  p.incarnation = m.incarnation();
  p.pushed_step = m.pushed_step();
  p.committed_step = m.committed_step();
  p.clock = m.clock();
  p.waiting = m.waiting();
  p.last_refused = m.last_refused();
  return p;
}

v1::MemberProgress ToProto(const MemberProgress& m) {
  v1::MemberProgress p;
  p.set_worker_id(m.worker_id);
  p.set_incarnation(m.incarnation);
  p.set_pushed_step(m.pushed_step);
  p.set_committed_step(m.committed_step);
  p.set_clock(m.clock);
  p.set_waiting(m.waiting);
  p.set_last_refused(m.last_refused);
  return p;
}

void EncodeRangeRecord(const ShardState& state, v1::RangeState* out) {
  out->set_version(state.metrics.version);
  out->set_optimizer_step(state.optimizer.step);
  out->set_samples(state.metrics.samples);
  out->set_rejected_pushes(state.metrics.rejected_pushes);
  out->set_loss(state.metrics.loss);
  out->set_accuracy(state.metrics.accuracy);
  out->set_train_seconds(state.metrics.train_seconds);
  if (state.buffers != nullptr) out->set_buffers(*state.buffers);
  out->mutable_table_files()->Assign(state.table_files.begin(),
                                     state.table_files.end());
}

void DecodeRangeRecord(const v1::RangeState& in, ShardState* out) {
  out->metrics.version = in.version();
  out->optimizer.step = in.optimizer_step();
  out->metrics.samples = in.samples();
  out->metrics.rejected_pushes = in.rejected_pushes();
  out->metrics.loss = in.loss();
  out->metrics.accuracy = in.accuracy();
  out->metrics.train_seconds = in.train_seconds();
  if (!in.buffers().empty())
    out->buffers = std::make_shared<const std::string>(in.buffers());
  out->table_files.assign(in.table_files().begin(), in.table_files().end());
}

void FiguresToJob(const ShardMetrics& in, v1::JobMetrics* out) {
  out->set_step(in.version);
  out->set_samples(in.samples);
  out->set_loss(in.loss);
  out->set_accuracy(in.accuracy);
  out->set_train_seconds(in.train_seconds);
  out->set_rejected_pushes(in.rejected_pushes);
}

ShardMetrics FiguresOfJob(const v1::JobMetrics& in) {
  ShardMetrics out;
  out.version = in.step();
  out.samples = in.samples();
  out.loss = in.loss();
  out.accuracy = in.accuracy();
  out.train_seconds = in.train_seconds();
  out.rejected_pushes = in.rejected_pushes();
  return out;
}

void EncodeRangeState(const ShardState& state, v1::RangeState* out) {
  EncodeRangeRecord(state, out);
  const std::vector<float>& w = *state.weights;
  out->set_weights(w.data(), 4 * w.size());
  out->clear_optimizer_slots();
  for (const std::vector<float>& slot : state.optimizer.slots)
    out->add_optimizer_slots(slot.data(), 4 * slot.size());
}

absl::StatusOr<ShardState> DecodeRangeState(const v1::RangeState& in,
                                            int64_t count) {
  ShardState out;
  DecodeRangeRecord(in, &out);
  auto weights = std::make_shared<std::vector<float>>();
  if (!BytesToFloats(in.weights(), count, weights.get())) {
    return absl::InvalidArgumentError(
        "the range's weights do not match its size");
  }
  out.weights = std::move(weights);
  for (const std::string& slot : in.optimizer_slots()) {
    out.optimizer.slots.emplace_back();
    if (!BytesToFloats(slot, count, &out.optimizer.slots.back())) {
      return absl::InvalidArgumentError(
          "the range's optimizer state does not match its size");
    }
  }
  return out;
}

}  // namespace tally
