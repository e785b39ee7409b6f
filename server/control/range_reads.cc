#include "server/control/range_reads.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "proto/errors.h"

namespace tally {

namespace {

// How long a checkpoint or a fetch waits for every range to reach one
// version.
constexpr absl::Duration kSaveWait = absl::Seconds(10);

// One StoredJob from every range's state at one version.
absl::StatusOr<StoredJob> GatherRanges(
    const std::vector<RangeRef>& ranges,
    const std::vector<absl::StatusOr<ShardState>>& states, int64_t num_params,
    bool weights_only) {
  StoredJob out;
  auto weights = std::make_shared<std::vector<float>>(num_params);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const RangeRef& r = ranges[i];
    const ShardState& st = *states[i];
    if (static_cast<int64_t>(st.weights->size()) != r.count) {
      return absl::DataLossError("a range came back with another size");
    }
    std::copy(st.weights->begin(), st.weights->end(),
              weights->begin() + r.offset);
    ShardState& job = out.state;
    if (r.offset == 0) job.buffers = st.buffers;
    if (i == 0) {
      job.metrics = st.metrics;
      job.metrics.rejected_pushes = 0;  // summed over the ranges below
      job.optimizer.step = st.optimizer.step;
      job.optimizer.slots.assign(weights_only ? 0 : st.optimizer.slots.size(),
                                 std::vector<float>(num_params));
    }
    job.metrics.rejected_pushes += st.metrics.rejected_pushes;
    if (weights_only) continue;
    job.table_files.insert(job.table_files.end(), st.table_files.begin(),
                           st.table_files.end());
    if (st.optimizer.slots.size() != job.optimizer.slots.size()) {
      return absl::DataLossError("ranges with different optimizers");
    }
    for (const auto& slot : st.optimizer.slots) {
      if (static_cast<int64_t>(slot.size()) != r.count) {
        return absl::DataLossError(
            "a range's optimizer state came back with another size");
      }
    }
    for (size_t k = 0; k < st.optimizer.slots.size(); ++k) {
      std::copy(st.optimizer.slots[k].begin(), st.optimizer.slots[k].end(),
                job.optimizer.slots[k].begin() + r.offset);
    }
  }
  out.has_state = true;
  out.state.weights = std::move(weights);
  return out;
}

}  // namespace

absl::StatusOr<StoredJob> SaveRanges(const std::string& job_id,
                                     int64_t map_version,
                                     const std::vector<RangeRef>& ranges,
                                     int64_t version, int64_t last_version,
                                     int64_t num_params, bool weights_only) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    version = std::min(version, last_version);
    std::vector<absl::StatusOr<ShardState>> states(
        ranges.size(), absl::UnknownError("not saved"));
    {
      std::vector<std::thread> threads;
      for (size_t i = 0; i < ranges.size(); ++i) {
        threads.emplace_back([&, i] {
          states[i] =
              ranges[i].control->Save(job_id, map_version, version,
                                      ranges[i].count, kSaveWait, weights_only);
        });
      }
      for (std::thread& t : threads) t.join();
    }
    int64_t past = -1;
    absl::Status failed;
    for (const auto& st : states) {
      if (st.ok()) continue;
      if (ReasonOf(st.status()) == v1::STEP_CLOSED) {
        past = std::max(past, ReasonStep(st.status()));
      } else if (failed.ok()) {
        failed = st.status();
      }
    }
    if (!failed.ok()) return failed;
    if (past >= 0) {
      version = past + 2;  // ahead of where the fastest range was
      continue;
    }
    return GatherRanges(ranges, states, num_params, weights_only);
  }
  return absl::AbortedError(
      "the job's ranges kept moving past the version to save");
}

RetiredState RetiredWeights(const std::string& job_id, int64_t map_version,
                            int64_t hold_id, int64_t num_params,
                            const std::vector<RangeRef>& refs) {
  auto weights = std::make_shared<std::vector<float>>(num_params);
  std::string buffers;
  for (const RangeRef& r : refs) {
    absl::StatusOr<HoldReport> h =
        r.control->Hold(job_id, map_version, hold_id, absl::Milliseconds(1));
    absl::StatusOr<ShardState> st =
        h.ok() ? r.control->Save(job_id, map_version, h->version, r.count,
                                 absl::Seconds(1),
                                 /*weights_only=*/true)
               : absl::StatusOr<ShardState>(h.status());
    if (!st.ok() || static_cast<int64_t>(st->weights->size()) != r.count)
      return {};
    std::copy(st->weights->begin(), st->weights->end(),
              weights->begin() + r.offset);
    if (r.offset == 0 && st->buffers != nullptr) buffers = *st->buffers;
  }
  return {std::move(weights), std::move(buffers)};
}

}  // namespace tally
