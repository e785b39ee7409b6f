#include "server/data/streamed_sum.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "server/data/internal/sum_kernels.h"

namespace tally {

absl::Status StreamedSum::PushAgain(int64_t version) {
  return WithReason(
      absl::AbortedError(absl::StrCat(
          "the sum of step ", version,
          " was dropped (a push in it could not count): push step ", version,
          " again")),
      v1::PUSH_AGAIN, version);
}

bool StreamedSum::Begin(const PushMeta& meta, float weight, int64_t version,
                        ReadyCalls* ready) {
  auto it = parts_.find(meta.worker_id);
  if (it != parts_.end()) {
    const Part& p = it->second;
    if (p.incarnation == meta.incarnation && p.samples == meta.samples &&
        p.weight == weight && p.loss_sum == meta.loss_sum &&
        p.correct == meta.correct && p.whole == nullptr) {
      return false;  // the same push again: it goes on
    }
    // Another push of the step in its place: what the first added goes.
    DropPart(meta.worker_id, version, ready);
  }
  RestartIfLate(meta.worker_id, version, ready);
  Part& part = parts_[meta.worker_id];
  part = Part{};
  part.incarnation = meta.incarnation;
  part.samples = meta.samples;
  part.loss_sum = meta.loss_sum;
  part.correct = meta.correct;
  part.weight = weight;
  return true;
}

absl::StatusOr<StreamedSum::Part*> StreamedSum::Find(const PushMeta& meta,
                                                     int64_t token,
                                                     int64_t version,
                                                     bool retired,
                                                     bool* duplicate) {
  *duplicate = false;
  TALLY_RETURN_IF_ERROR(
      members_->Check(meta.worker_id, meta.incarnation, version, retired));
  if (members_->at(meta.worker_id).pushed_step >= meta.step) {
    *duplicate = true;  // another stream of it finished it
    return nullptr;
  }
  // Another push of the step that replaced this one in the sum (a part
  // dropped before it added anything keeps the generation) is not this
  // push's: its blocks must not go into that part.
  auto it = parts_.find(meta.worker_id);
  if (token != generation_ || it == parts_.end() ||
      it->second.incarnation != meta.incarnation ||
      it->second.samples != meta.samples ||
      it->second.loss_sum != meta.loss_sum ||
      it->second.correct != meta.correct) {
    return PushAgain(version);
  }
  return &it->second;
}

absl::StatusOr<bool> StreamedSum::Add(const std::string& id, Part& part,
                                      int64_t local, int64_t n,
                                      const float* values,
                                      std::function<void()> wake,
                                      int64_t version, ReadyCalls* ready) {
  if (local < 0 || n < 0 || local > num_params_ - n) {
    return absl::InvalidArgumentError(
        absl::StrCat("values [", local, ", +", n, ") are outside the range"));
  }
  bool first = true;
  if (!Turn(id, local, local + n, version, &first)) {
    parked_.push_back(std::move(wake));
    return false;
  }
  // Only what is not in yet (a push sent again after a broken stream).
  for (const auto& [b, e] : part.added.Gaps(local, local + n))
    SumIn(part, b, e, values + (b - local), first);
  Progress(version, ready);
  return true;
}

absl::Status StreamedSum::Finish(Part& part) {
  if (part.added.covered() != num_params_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the push covers ", part.added.covered(), " of ",
                     num_params_, " gradient elements"));
  }
  part.complete = true;
  return absl::OkStatus();
}

void StreamedSum::Keep(const PushMeta& meta, float weight,
                       std::unique_ptr<std::vector<float>> grads,
                       int64_t version, ReadyCalls* ready) {
  DropPart(meta.worker_id, version, ready);
  RestartIfLate(meta.worker_id, version, ready);
  Part& part = parts_[meta.worker_id];
  part.incarnation = meta.incarnation;
  part.samples = meta.samples;
  part.loss_sum = meta.loss_sum;
  part.correct = meta.correct;
  part.weight = weight;
  part.complete = true;
  part.whole = std::move(grads);
}

void StreamedSum::RestartIfLate(const std::string& id, int64_t version,
                                ReadyCalls* ready) {
  // Ranks add each element in order, so a rank's blocks wait for lower
  // ones it knows nothing of yet; a lower rank beginning after a higher one
  // added something (a member set changed under the step) restarts the sum.
  const ShardMembers::Map& members = members_->all();
  auto self = members.find(id);
  if (self == members.end()) return;
  const auto key = std::make_pair(self->second.spec.rank, id);
  for (const auto& [qid, p] : parts_) {
    auto q = members.find(qid);
    if (q != members.end() && std::make_pair(q->second.spec.rank, qid) > key &&
        !p.added.empty()) {
      Reset("", version, ready);
      return;
    }
  }
}

bool StreamedSum::Turn(const std::string& id, int64_t b, int64_t e,
                       int64_t version, bool* first) const {
  *first = true;
  const ShardMembers::Map& members = members_->all();
  auto self = members.find(id);
  if (self == members.end()) return false;  // not a member: never its turn
  const auto key = std::make_pair(self->second.spec.rank, id);
  for (const auto& [qid, q] : members) {
    if (qid == id || !Required(q, version) ||
        !(std::make_pair(q.spec.rank, qid) < key)) {
      continue;
    }
    auto it = parts_.find(qid);
    if (it != parts_.end() && it->second.incarnation == q.spec.incarnation) {
      if (!it->second.added.Covers(b, e)) return false;
      *first = false;
      continue;
    }
    // Settled here as nothing (no samples, refused, committed without a
    // push here), or not begun: its push may still come first.
    if (q.pushed_step >= version || q.committed_step >= version) continue;
    return false;
  }
  return true;
}

void StreamedSum::SumIn(Part& part, int64_t b, int64_t e, const float* g,
                        bool first) {
  if (sum_ == nullptr) sum_ = pool_->Take();
  float* dst = sum_->data() + b;
  if (first) {
    internal::PutScaled(dst, g, part.weight, e - b);
  } else {
    internal::AddScaled(dst, g, part.weight, e - b);
  }
  part.added.Add(b, e);
}

void StreamedSum::Progress(int64_t version, ReadyCalls* ready) {
  if (on_) {
    // Whole pushes (Accept) whose turn came, lowest rank first.
    for (bool again = true; again;) {
      again = false;
      for (auto& [id, part] : parts_) {
        if (part.whole == nullptr) continue;
        bool first = true;
        if (!Turn(id, 0, num_params_, version, &first)) continue;
        SumIn(part, 0, num_params_, part.whole->data(), first);
        pool_->Release(std::move(part.whole), members_->size());
        again = true;
      }
    }
  }
  for (auto& wake : parked_) {
    ready->emplace_back([wake = std::move(wake)](absl::Status) { wake(); },
                        absl::OkStatus());
  }
  parked_.clear();
}

void StreamedSum::Reset(const std::string& keep_out, int64_t version,
                        ReadyCalls* ready) {
  ++resets_;
  ++generation_;
  std::set<std::string> again;
  ShardMembers::Map& members = members_->all();
  for (auto& [id, part] : parts_) {
    pool_->Release(std::move(part.whole), members.size());
    if (id == keep_out) continue;
    auto it = members.find(id);
    if (it == members.end() || it->second.spec.incarnation != part.incarnation)
      continue;
    ShardMember& m = it->second;
    m.pushed_step = std::min(m.pushed_step, version - 1);
    if (m.committed_step >= version) {
      m.committed_step = version - 1;
      m.last_refused = false;
    }
    m.push_again = version;
    again.insert(id);
  }
  parts_.clear();
  // Those waiting for the step's end push again first.
  waiters_->Fail(again, version, PushAgain(version), ready);
  Progress(version, ready);  // waiting blocks find their tokens stale
}

void StreamedSum::DropPart(const std::string& id, int64_t version,
                           ReadyCalls* ready) {
  auto it = parts_.find(id);
  if (it == parts_.end()) return;
  if (!it->second.added.empty()) {
    Reset(id, version, ready);
    return;
  }
  pool_->Release(std::move(it->second.whole), members_->size());
  parts_.erase(it);
  Progress(version, ready);
}

void StreamedSum::CheckParts(int64_t version, ReadyCalls* ready) {
  const ShardMembers::Map& members = members_->all();
  for (auto it = parts_.begin(); it != parts_.end();) {
    auto m = members.find(it->first);
    const bool gone = m == members.end() ||
                      m->second.spec.incarnation != it->second.incarnation ||
                      !Required(m->second, version);
    const bool refused =
        !gone && m->second.committed_step >= version && m->second.last_refused;
    if (!gone && !refused) {
      ++it;
      continue;
    }
    if (!it->second.added.empty()) {
      // In the sum, and cannot count: the others push again.
      Reset(refused ? it->first : "", version, ready);
      return;
    }
    pool_->Release(std::move(it->second.whole), members.size());
    it = parts_.erase(it);
  }
  Progress(version, ready);  // a member set changed: waiting blocks look again
}

bool StreamedSum::Tally(const std::vector<ShardMember*>& required,
                        int64_t version, StepTally* tally, ReadyCalls* ready) {
  // Every committed member's push is whole and in the sum (it is, unless a
  // member committed a push it had not finished here: then the sum goes).
  for (ShardMember* m : required) {
    auto it = parts_.find(m->spec.worker_id);
    if (it == parts_.end() || it->second.incarnation != m->spec.incarnation)
      continue;  // nothing from it here
    const Part& part = it->second;
    if (!part.complete || part.whole != nullptr ||
        part.added.covered() != num_params_) {
      Reset("", version, ready);
      return false;
    }
    // In rank order, as the staged sum.
    tally->samples += part.samples;
    tally->loss += part.loss_sum;
    tally->correct += part.correct;
  }
  parts_.clear();
  ++generation_;
  if (sum_ == nullptr) sum_ = pool_->Take();  // a range of no elements
  return true;
}

std::vector<std::function<void()>> StreamedSum::TakeParked() {
  std::vector<std::function<void()>> parked;
  parked.swap(parked_);
  return parked;
}

std::vector<std::function<void()>> StreamedSum::Retire() {
  for (auto& [id, part] : parts_)
    pool_->Release(std::move(part.whole), members_->size());
  parts_.clear();
  pool_->Release(std::move(sum_), members_->size());
  ++generation_;
  on_ = false;
  return TakeParked();
}

}  // namespace tally
