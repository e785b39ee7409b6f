#include "server/data/shard_stats.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace tally {

ShardStats::ShardStats(const Clock* clock, bool steps,
                       std::function<void(const PublishTimes&)> observer)
    : clock_(clock), steps_(steps), observer_(std::move(observer)) {}

void ShardStats::GoOnFrom(const ShardMetrics& m) {
  samples_total_ = m.samples;
  counts_.rejected = m.rejected_pushes;
  last_loss_ = m.loss;
  last_accuracy_ = m.accuracy;
  if (m.total_steps > 0) {
    // Training time goes on from where it was.
    const absl::Time now = clock_->Now();
    started_ = now - absl::Seconds(m.train_seconds);
    if (m.version >= m.total_steps) finished_ = now;
  }
}

void ShardStats::Start() {
  if (started_ == absl::InfinitePast()) started_ = clock_->Now();
}

void ShardStats::Arrived(int64_t step, int64_t version, bool commit) {
  if (!steps_ || step < version) return;
  LastArrivals& at = last_at_[step];
  (commit ? at.commit : at.push) = clock_->Now();
}

void ShardStats::Closed(const std::vector<ShardMember*>& required,
                        int64_t version, int64_t samples) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const ShardMember* m : required) {
    const std::string key =
        absl::StrCat(m->spec.worker_id, "/", m->spec.incarnation, "\n");
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  }
  const int n = static_cast<int>(required.size());
  if (!spans_.empty() && spans_.back().end_step == version &&
      spans_.back().members_hash == h && spans_.back().members == n) {
    spans_.back().end_step = version + 1;
    spans_.back().samples += samples;
    return;
  }
  spans_.push_back({version, version + 1, n, h, samples});
  if (spans_.size() > kMaxSpans) spans_.pop_front();
}

void ShardStats::Published(int64_t closed, ReadyCalls* ready) {
  auto it = last_at_.find(closed);
  if (it != last_at_.end() && observer_ != nullptr &&
      it->second.push != absl::InfinitePast()) {
    const absl::Time now = clock_->Now();
    PublishTimes t;
    t.since_push = absl::ToDoubleSeconds(now - it->second.push);
    t.since_commit = absl::ToDoubleSeconds(
        now - std::max(it->second.commit, it->second.push));
    ready->emplace_back(
        [observer = observer_, t](const absl::Status&) { observer(t); },
        absl::OkStatus());
  }
  last_at_.erase(last_at_.begin(), last_at_.upper_bound(closed));
}

void ShardStats::Advanced(const StepTally& tally, bool finished) {
  if (tally.samples > 0) {
    last_loss_ = tally.loss / tally.samples;
    last_accuracy_ = static_cast<double>(tally.correct) / tally.samples;
  }
  samples_total_ += tally.samples;
  const absl::Time now = clock_->Now();
  closes_.emplace_back(now, samples_total_);
  // Keep about five seconds of history for the throughput figure.
  while (closes_.size() > 2 && now - closes_.front().first > absl::Seconds(5)) {
    closes_.erase(closes_.begin());
  }
  if (finished) finished_ = now;
}

void ShardStats::Fill(ShardMetrics* m) const {
  m->loss = last_loss_;
  m->accuracy = last_accuracy_;
  m->samples = samples_total_;
  m->rejected_pushes = counts_.rejected;
  m->stale_pushes = counts_.stale;
  m->late_pushes = counts_.late;
  if (started_ != absl::InfinitePast()) {
    const absl::Time end =
        finished_ != absl::InfinitePast() ? finished_ : clock_->Now();
    m->train_seconds = absl::ToDoubleSeconds(end - started_);
  }
  if (closes_.size() >= 2) {
    const double dt =
        absl::ToDoubleSeconds(closes_.back().first - closes_.front().first);
    if (dt > 0) {
      m->samples_per_sec =
          (closes_.back().second - closes_.front().second) / dt;
    }
  }
}

}  // namespace tally
