#include "server/data/shard_members.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/errors.h"
#include "server/data/internal/sum_kernels.h"
#include "server/data/shard_stats.h"

namespace tally {

absl::Status ShardMembers::Check(const std::string& worker_id,
                                 int64_t incarnation, int64_t version,
                                 bool retired) const {
  if (retired) {
    return WithReason(absl::FailedPreconditionError("the job has ended"),
                      v1::JOB_ENDED);
  }
  auto it = members_.find(worker_id);
  if (it == members_.end()) {
    return WithReason(absl::PermissionDeniedError(absl::StrCat(
                          "worker ", Quoted(worker_id),
                          " is not a member of this job (lease lost?)")),
                      v1::NOT_A_MEMBER);
  }
  if (it->second.spec.incarnation != incarnation) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "stale incarnation ", incarnation, " of worker ", Quoted(worker_id),
            " (current ", it->second.spec.incarnation, ")")),
        v1::REGISTER_AGAIN);
  }
  if (it->second.spec.leave_step <= version) {
    return WithReason(
        absl::PermissionDeniedError(absl::StrCat("worker ", Quoted(worker_id),
                                                 " left this job at step ",
                                                 it->second.spec.leave_step)),
        v1::NOT_A_MEMBER);
  }
  return absl::OkStatus();
}

void ShardMembers::Set(const std::vector<MemberSpec>& specs, bool async,
                       std::deque<StagedPush>* apply_queue) {
  Map next;
  std::set<std::string> seen;
  for (const MemberSpec& spec : specs) {
    if (!seen.insert(spec.worker_id).second) continue;  // the first stands
    ShardMember& m = next[spec.worker_id];
    auto old = members_.find(spec.worker_id);
    const bool known = old != members_.end() &&
                       old->second.spec.incarnation == spec.incarnation;
    if (known) m = std::move(old->second);  // progress and staged pushes go on
    m.spec = spec;
    const bool leaves = spec.leave_step != MemberSpec::kNoStep;
    if (async && leaves) {
      // Out at once. Its commits reach the job's shards one pull at a
      // time, so this shard misses at most its last one, which another
      // shard had: that push is one version here as there (as nothing if
      // it was refused somewhere). A leaver unknown here changes nothing.
      if (known && m.committed_step < spec.leave_step - 1) {
        StagedPush st;
        auto it = m.staged.find(spec.leave_step - 1);
        if (it != m.staged.end()) {
          if (!spec.last_refused) st = std::move(it->second);
          pool_->Release(std::move(it->second.grads), members_.size());
          m.staged.erase(it);
        }
        apply_queue->push_back(std::move(st));
      }
      Unstage(m);
      next.erase(spec.worker_id);
      continue;
    }
    for (auto it = m.staged.lower_bound(spec.leave_step);
         it != m.staged.end();) {
      // Pushed past its last step: not counted anywhere.
      pool_->Release(std::move(it->second.grads), members_.size());
      it = m.staged.erase(it);
    }
    if (leaves && m.committed_step < spec.leave_step - 1) {
      // Its last step counts as committed: another shard had its commit,
      // so its push reached every shard, this one included (staged here,
      // or refused here and so contributing nothing), unless that commit
      // said it was refused somewhere.
      if (spec.last_refused) Unstage(m, spec.leave_step - 1);
      if (spec.last_refused) m.buffers.erase(spec.leave_step - 1);
      m.committed_step = spec.leave_step - 1;
      m.last_refused = spec.last_refused;
    }
  }
  for (auto& [id, m] : members_) {
    if (!next.count(id) || next[id].spec.incarnation != m.spec.incarnation)
      Unstage(m);
  }
  members_ = std::move(next);
}

std::vector<MemberSpec> ShardMembers::Specs() const {
  std::vector<MemberSpec> out;
  for (const auto& [id, m] : members_) out.push_back(m.spec);
  return out;
}

std::vector<MemberProgress> ShardMembers::Progress() const {
  std::vector<MemberProgress> out;
  for (const auto& [id, m] : members_) {
    out.push_back({id, m.spec.incarnation, m.pushed_step, m.committed_step,
                   m.clock, m.waiting, m.last_refused});
  }
  return out;
}

bool ShardMembers::ReadyToClose(int64_t version, int64_t backups,
                                std::vector<ShardMember*>* required) {
  int64_t committed = 0;
  for (auto& [id, m] : members_) {
    if (!Required(m, version)) continue;
    required->push_back(&m);
    if (m.committed_step >= version) ++committed;
  }
  if (required->empty()) return false;  // nobody to close it with
  // bsp with backup workers: all but b suffice (at least one).
  const int64_t need =
      std::max<int64_t>(1, static_cast<int64_t>(required->size()) - backups);
  if (committed < need) return false;  // still waiting
  // In the order of summation.
  std::sort(required->begin(), required->end(),
            [](ShardMember* a, ShardMember* b) {
              return a->spec.rank != b->spec.rank
                         ? a->spec.rank < b->spec.rank
                         : a->spec.worker_id < b->spec.worker_id;
            });
  return true;
}

std::unique_ptr<std::vector<float>> ShardMembers::SumStaged(
    const std::vector<ShardMember*>& required, int64_t version,
    const StepRules& rules, PushCounts* counts, StepTally* tally) {
  std::unique_ptr<std::vector<float>> sum;
  for (ShardMember* m : required) {
    auto it = m->staged.find(version);
    if (m->committed_step < version) {
      // A backup: its push of this step, if any, is late.
      if (it != m->staged.end()) {
        ++counts->late;
        pool_->Release(std::move(it->second.grads), members_.size());
        m->staged.erase(it);
      }
      continue;
    }
    if (it == m->staged.end() || it->second.grads == nullptr) continue;
    StagedPush& st = it->second;
    const int64_t n = static_cast<int64_t>(st.grads->size());
    // Weighted by samples (and staleness), in rank order.
    const float w =
        static_cast<float>(st.samples) * rules.Scale(version - st.base);
    if (sum == nullptr) {
      sum = std::move(st.grads);
      internal::Scale(sum->data(), w, n);
    } else {
      internal::AddScaled(sum->data(), st.grads->data(), w, n);
    }
    tally->samples += st.samples;
    tally->loss += st.loss_sum;
    tally->correct += st.correct;
  }
  return sum;
}

void ShardMembers::Stage(ShardMember& m, const PushMeta& meta,
                         std::unique_ptr<std::vector<float>> grads) {
  StagedPush& st = m.staged[meta.step];
  pool_->Release(std::move(st.grads), members_.size());
  st = StagedPush{};
  st.base = meta.base_version;
  if (meta.samples > 0) {
    st.grads = std::move(grads);
    st.samples = meta.samples;
    st.loss_sum = meta.loss_sum;
    st.correct = meta.correct;
  } else {
    pool_->Release(std::move(grads), members_.size());
  }
}

void ShardMembers::ReleaseStaged(int64_t step) {
  for (auto& [id, m] : members_) {
    for (auto it = m.staged.begin();
         it != m.staged.end() && it->first <= step;) {
      pool_->Release(std::move(it->second.grads), members_.size());
      it = m.staged.erase(it);
    }
  }
}

void ShardMembers::Unstage(ShardMember& m) {
  for (auto& [step, st] : m.staged)
    pool_->Release(std::move(st.grads), members_.size());
  m.staged.clear();
  m.buffers.clear();
}

void ShardMembers::Unstage(ShardMember& m, int64_t step) {
  auto it = m.staged.find(step);
  if (it == m.staged.end()) return;
  pool_->Release(std::move(it->second.grads), members_.size());
  m.staged.erase(it);
}

StagedPush ShardMembers::QueueCommitted(ShardMember& m, int64_t step,
                                        bool contributed) {
  // Its push of `step` is one version, whatever it holds; pushes it
  // abandoned before (never committed) go.
  StagedPush st;
  for (auto it = m.staged.begin(); it != m.staged.end() && it->first <= step;) {
    if (it->first == step && contributed) {
      st = std::move(it->second);
    } else {
      pool_->Release(std::move(it->second.grads), members_.size());
    }
    it = m.staged.erase(it);
  }
  auto b = m.buffers.find(step);
  if (contributed && b != m.buffers.end()) {
    st.buffers = b->second;
    st.rank = m.spec.rank;
  }
  m.buffers.erase(m.buffers.begin(), m.buffers.upper_bound(step));
  m.committed_step = step;
  m.last_refused = !contributed;
  return st;
}

void ShardMembers::KeepBuffers(const PushMeta& meta) {
  if (meta.buffers != nullptr)
    members_.at(meta.worker_id).buffers[meta.step] = meta.buffers;
}

void ShardMembers::TakeBuffers(const std::vector<ShardMember*>& required,
                               int64_t version,
                               std::shared_ptr<const std::string>* region) {
  for (ShardMember* m : required) {
    // A push that counts as nothing had its buffers dropped with it.
    const bool counted = m->committed_step >= version;
    auto it = m->buffers.find(version);
    if (counted && it != m->buffers.end()) {
      *region = it->second;
      break;
    }
  }
  for (auto& [id, m] : members_) {
    m.buffers.erase(m.buffers.begin(), m.buffers.upper_bound(version));
  }
}

bool ShardMembers::Lowest(int rank) const {
  bool lowest = true;
  for (const auto& [id, m] : members_) lowest &= m.spec.rank >= rank;
  return lowest;
}

void ShardMembers::EraseRows(int64_t version) {
  for (auto& [id, m] : members_) {
    for (auto it = m.rows.begin(); it != m.rows.end() && it->first <= version;)
      it = m.rows.erase(it);
  }
}

void ShardMembers::DropLeavers(int64_t version) {
  for (auto it = members_.begin(); it != members_.end();) {
    if (it->second.spec.leave_step <= version) {
      Unstage(it->second);
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
}

void ShardMembers::Retire() {
  for (auto& [id, m] : members_) Unstage(m);
  members_.clear();
}

}  // namespace tally
