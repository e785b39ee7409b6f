// Schedule: the steps and versions of a cluster job, world by world.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/spec/job_spec.h"

namespace tally {

namespace {

constexpr int64_t kNoEnd = std::numeric_limits<int64_t>::max();

int64_t SatMul(int64_t a, int64_t b) {
  return b != 0 && a > kNoEnd / b ? kNoEnd : a * b;
}
int64_t SatAdd(int64_t a, int64_t b) { return a > kNoEnd - b ? kNoEnd : a + b; }

// Epochs of world period i of `s` (the last runs to the end).
int64_t PeriodEpochs(const Schedule& s, size_t i) {
  const int64_t end = std::min(
      s.epochs, i + 1 < s.worlds.size() ? s.worlds[i + 1].first_epoch : s.epochs);
  return std::max<int64_t>(0, end - s.worlds[i].first_epoch);
}

// Steps (or versions) from the start to the first epoch of period i's
// epoch `epoch` (within it), summed over the periods before.
template <typename PerEpoch>
int64_t StartOf(const Schedule& s, int64_t epoch, PerEpoch per_epoch) {
  int64_t at = 0;
  for (size_t i = 0; i < s.worlds.size(); ++i) {
    const int64_t first = s.worlds[i].first_epoch;
    const int64_t last = i + 1 < s.worlds.size() ? s.worlds[i + 1].first_epoch
                                                 : kNoEnd;
    const int64_t n = std::min(epoch, last) - first;
    if (n <= 0) break;
    at = SatAdd(at, SatMul(n, per_epoch(s.worlds[i].world)));
    if (epoch <= last) break;
  }
  return at;
}

void Total(Schedule& s, int64_t max_steps) {
  s.total_steps = 0;
  for (size_t i = 0; i < s.worlds.size(); ++i) {
    s.total_steps = SatAdd(
        s.total_steps,
        SatMul(PeriodEpochs(s, i), s.VersionsPerEpoch(s.worlds[i].world)));
  }
  if (max_steps > 0) s.total_steps = std::min(s.total_steps, max_steps);
}

}  // namespace

int64_t Schedule::StepsPerEpoch(int world) const {
  world = std::max(1, world);
  const int64_t largest_shard = (train_size + world - 1) / world;
  return std::max<int64_t>(1, (largest_shard + batch_size - 1) / batch_size);
}

int64_t Schedule::VersionsPerEpoch(int world) const {
  return StepsPerEpoch(world) * (async ? std::max(1, world) : 1);
}

Schedule::Place Schedule::Locate(int64_t step) const {
  Place p;
  int64_t first = 0;  // the period's first step
  for (size_t i = 0; i < worlds.size(); ++i) {
    const int64_t spe = StepsPerEpoch(worlds[i].world);
    const bool last = i + 1 == worlds.size();
    const int64_t steps =
        last ? kNoEnd
             : SatMul(worlds[i + 1].first_epoch - worlds[i].first_epoch, spe);
    if (last || step - first < steps) {
      p.world = worlds[i].world;
      p.steps_per_epoch = spe;
      p.epoch = worlds[i].first_epoch + (step - first) / spe;
      p.index = (step - first) % spe;
      p.period_end = last ? kNoEnd : first + steps;
      return p;
    }
    first = SatAdd(first, steps);
  }
  return p;
}

int64_t Schedule::EpochStart(int64_t epoch) const {
  return StartOf(*this, epoch, [this](int w) { return StepsPerEpoch(w); });
}

int64_t Schedule::EpochStartVersion(int64_t epoch) const {
  return StartOf(*this, epoch, [this](int w) { return VersionsPerEpoch(w); });
}

int64_t Schedule::EpochOfVersion(int64_t v) const {
  int64_t first = 0;
  for (size_t i = 0; i < worlds.size(); ++i) {
    const int64_t vpe = VersionsPerEpoch(worlds[i].world);
    const int64_t span = SatMul(PeriodEpochs(*this, i), vpe);
    if (v - first < span || i + 1 == worlds.size()) {
      return std::min(epochs - 1, worlds[i].first_epoch + (v - first) / vpe);
    }
    first = SatAdd(first, span);
  }
  return 0;
}

int64_t Schedule::ClockOfVersion(int64_t v) const {
  const int64_t e = EpochOfVersion(v);
  const int64_t start = EpochStart(e);
  const int world = Locate(start).world;
  const int64_t per_step = async ? std::max(1, world) : 1;
  return SatAdd(start, std::max<int64_t>(0, v - EpochStartVersion(e)) /
                           per_step);
}

int64_t Schedule::FirstStepOfRank(int rank) const {
  for (const WorldPeriod& p : worlds) {
    if (rank < p.world) return EpochStart(p.first_epoch);
  }
  return EpochStart(epochs);
}

Schedule MakeSchedule(const JobSpec& spec, int64_t train_size, int world) {
  Schedule s;
  s.train_size = train_size;
  s.batch_size = std::max<int64_t>(1, spec.training.batch_size);
  s.epochs = std::max<int64_t>(1, spec.training.epochs);
  s.async = spec.training.consistency.mode == ConsistencyMode::kAsync;
  s.worlds = {WorldPeriod{0, std::max(1, world)}};
  s.steps_per_epoch = s.StepsPerEpoch(world);
  // Saturating: a schedule longer than any run could be is still a bound.
  s.versions_per_epoch = s.VersionsPerEpoch(world);  // at most 1024 * 2^20
  Total(s, spec.training.max_steps);
  return s;
}

Schedule GrowSchedule(const Schedule& s, int64_t epoch, int world,
                      int64_t max_steps) {
  Schedule g = s;
  while (!g.worlds.empty() && g.worlds.back().first_epoch >= epoch)
    g.worlds.pop_back();
  g.worlds.push_back(WorldPeriod{epoch, std::max(1, world)});
  g.steps_per_epoch = g.StepsPerEpoch(g.worlds.front().world);
  g.versions_per_epoch = g.VersionsPerEpoch(g.worlds.front().world);
  ++g.plan;
  Total(g, max_steps);
  return g;
}

Schedule ScheduleOf(const JobSpec& spec, int64_t train_size,
                    const std::vector<WorldPeriod>& worlds, int64_t plan) {
  Schedule s = MakeSchedule(
      spec, train_size,
      worlds.empty() ? 1 : std::clamp(worlds.front().world, 1, 1024));
  // As GrowSchedule made them; whatever a peer sent, a later period
  // replaces those at or past its epoch, and no world is below one.
  for (size_t i = 1; i < worlds.size(); ++i) {
    if (worlds[i].first_epoch >= s.epochs) break;  // past the end: nothing
    s = GrowSchedule(s, std::max<int64_t>(1, worlds[i].first_epoch),
                     std::clamp(worlds[i].world, 1, 1024),
                     spec.training.max_steps);
  }
  s.plan = plan;
  return s;
}

}  // namespace tally
