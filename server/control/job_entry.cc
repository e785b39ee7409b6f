#include "server/control/job_entry.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/errors.h"
#include "proto/schedule.h"

namespace tally {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

int64_t JobNumber(const std::string& id) {
  absl::string_view rest = id;
  int64_t n = 0;
  if (!absl::ConsumePrefix(&rest, "job-") || !absl::SimpleAtoi(rest, &n))
    return 0;
  return n;
}

absl::Status NoJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
}

bool JobEntry::ended() const { return Terminal(proto.state()); }

std::string JobEntry::LowestRank() const {
  for (const std::string& id : slots) {
    if (!id.empty()) return id;
  }
  return "";
}

std::string JobEntry::MemberOf(size_t rank) const {
  if (slots[rank].empty() || !fixed_ranks()) return slots[rank];
  return RankMember(slots[rank], static_cast<int>(rank),
                    rank < slot_terms.size() ? slot_terms[rank] : 0);
}

std::vector<int> JobEntry::RanksOf(const std::string& worker_id) const {
  std::vector<int> out;
  for (size_t r = 0; r < slots.size(); ++r) {
    if (slots[r] == worker_id) out.push_back(static_cast<int>(r));
  }
  return out;
}

void JobEntry::AddEvent(absl::Time now, std::string text) {
  constexpr int kMaxEvents = 200;
  auto* events = history.mutable_events();
  if (events->size() >= kMaxEvents) events->DeleteSubrange(0, 1);
  v1::JobEvent* e = events->Add();
  e->set_unix_time(UnixSeconds(now));
  e->set_text(std::move(text));
}

void JobEntry::AddCurvePoint(absl::Time now, const v1::JobMetrics& m) {
  constexpr int kMaxPoints = 1000;
  auto* curve = history.mutable_curve();
  if (m.step() == 0) return;  // no step closed: no loss to show
  if (!curve->empty() && curve->rbegin()->step() == m.step()) return;
  if (curve->size() >= kMaxPoints) {
    // Keep the whole run at half the resolution.
    int kept = 0;
    for (int i = 0; i < curve->size(); i += 2) curve->SwapElements(kept++, i);
    curve->DeleteSubrange(kept, curve->size() - kept);
    point_every *= 2;
  }
  v1::CurvePoint* p = curve->Add();
  p->set_step(m.step());
  p->set_unix_time(UnixSeconds(now));
  p->set_loss(m.loss());
  p->set_accuracy(m.accuracy());
  p->set_samples_per_sec(m.samples_per_sec());
  last_point = now;
}

}  // namespace tally
