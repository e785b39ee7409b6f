#include "server/control/job_archive.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/safetensors.h"
#include "common/status_macros.h"
#include "server/control/job_export.h"
#include "server/control/job_render.h"
#include "server/control/planner.h"

namespace tally {

absl::Status JobArchive::Open() {
  if (store_ != nullptr) return absl::OkStatus();
  auto store =
      std::make_unique<JobStore>(options_.state_dir, options_.spec_limits);
  TALLY_RETURN_IF_ERROR(store->Open());
  store_ = std::move(store);
  return absl::OkStatus();
}

absl::StatusOr<JobArchive::Restored> JobArchive::LoadAll(absl::Time now) {
  TALLY_RETURN_IF_ERROR(Open());
  // Everything is read and checked before anything is installed.
  TALLY_ASSIGN_OR_RETURN(std::vector<StoredJob> stored, store_->LoadAll());
  Restored out;
  for (StoredJob& s : stored) {
    const std::string id = s.job.id();
    if (out.jobs.count(id)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint of job ", id, " is in two files"));
    }
    out.jobs.emplace(id, FromStored(std::move(s), options_.spec_limits, now));
  }
  out.next_job = store_->LoadNextJob();
  return out;
}

JobEntry JobArchive::FromStored(StoredJob stored, const SpecLimits& limits,
                                absl::Time now) {
  JobEntry job;
  job.proto = stored.job;
  job.history = stored.history;
  const bool was_running = stored.job.state() == v1::RUNNING;
  // The spec was checked when the file was read (with the default limits;
  // a spec a larger --max_params admitted is read with that).
  job.spec = *ParseJobSpec(job.proto.spec(), limits);
  if (was_running && !stored.has_state && job.proto.membership_size() > 1) {
    // It starts again from its first step (below): with the workers it
    // was submitted with, not those it had grown to.
    job.proto.clear_membership();
    job.proto.set_plan(job.proto.plan() + 1);
  }
  Planner::RestorePlan(job);
  v1::JobMetrics* m = job.proto.mutable_metrics();
  m->set_samples_per_sec(0.0);
  m->set_workers(0);
  if (stored.has_state) {
    FiguresToJob(stored.state.metrics, m);
    job.saved_version = stored.state.metrics.version;
  }
  if (job.ended()) {
    job.retired = true;
    job.dirty = false;
    if (stored.has_state) job.final_weights = stored.state.weights;
    if (stored.state.buffers != nullptr)
      job.final_buffers = *stored.state.buffers;
    job.table_home_addresses = stored.table_homes;
  } else if (job.proto.state() == v1::RUNNING) {
    if (stored.has_state) {
      job.start = std::make_shared<const StoredJob>(std::move(stored));
    } else {
      job.proto.set_state(v1::PENDING);  // started without weights: again
    }
  }
  if (job.proto.state() == v1::RUNNING) {
    const std::string from =
        job.start != nullptr
            ? absl::StrCat("the checkpoint of step ", job.start->state.metrics.version)
            : "the initial weights";
    job.AddEvent(now, absl::StrCat(
                          "the coordinator restarted; the job resumes from ",
                          from));
    job.condition = absl::StrCat("the coordinator restarted; resuming from ",
                                 from, " once its ranges are placed");
  } else if (job.proto.state() == v1::PENDING && was_running) {
    job.AddEvent(now,
                 "the coordinator restarted; the job had no checkpoint and "
                 "waits to start again");
  }
  job.saved_state = job.proto.state();
  job.saved_at = now;
  return job;
}

std::shared_ptr<const StoredJob> JobArchive::LastState(
    const std::string& job_id) const {
  if (store_ == nullptr) return nullptr;
  absl::StatusOr<StoredJob> s = store_->Load(job_id);
  if (!s.ok() || !s->has_state) return nullptr;
  return std::make_shared<const StoredJob>(*std::move(s));
}

std::vector<CheckpointDue> JobArchive::Due(const JobQueue& jobs,
                                           const Registry& registry, bool force,
                                           absl::Time now) const {
  std::vector<CheckpointDue> due;
  for (const std::string& id : jobs.order()) {
    const JobEntry& job = jobs.at(id);
    const bool placed = !job.ranges.empty() && job.installed;
    const int64_t version = placed ? registry.Version(job) : job.saved_version;
    const bool state_changed = job.proto.state() != job.saved_state;
    const bool progressed = version != job.saved_version;
    const bool interval_passed =
        now - job.saved_at >= options_.checkpoint_interval;
    if (!(state_changed || (progressed && (force || interval_passed))))
      continue;
    if (job.ended() && !job.retired && !job.ranges.empty()) continue;
    CheckpointDue d;
    d.job = RenderJob(job, registry, now);
    // The record keeps what outlives this process: not the conditions
    // and workers of the moment.
    d.job.set_message(job.proto.message());
    if (!job.ended()) {
      d.job.mutable_metrics()->clear_progress();
      d.job.mutable_metrics()->clear_waiting_on();
      d.job.mutable_metrics()->clear_stalled_seconds();
    }
    d.history = job.history;
    d.num_params = job.spec.layout.num_params;
    d.total_steps = job.schedule.total_steps;
    d.map_version = job.map_version;
    d.final_weights = job.final_weights;
    d.final_buffers = job.final_buffers;
    d.table_homes = job.table_home_addresses;
    d.start = job.start;
    if (placed && !job.ended()) {
      for (const v1::RangeStatus& r : registry.RangeStatuses(job))
        d.version = std::max(d.version, r.version());
      for (const Placement& p : job.ranges) {
        d.ranges.push_back(
            {registry.shard(p.shard_id).control, p.offset, p.count});
      }
    }
    due.push_back(std::move(d));
  }
  return due;
}

absl::StatusOr<bool> JobArchive::Write(CheckpointDue& d) {
  StoredJob stored;
  if (!d.ranges.empty()) {
    absl::StatusOr<StoredJob> saved =
        SaveRanges(d.job.id(), d.map_version, d.ranges, d.version,
                   d.total_steps, d.num_params, /*weights_only=*/false);
    if (!saved.ok()) return false;
    stored = *std::move(saved);
  } else if (d.final_weights != nullptr) {
    const v1::JobMetrics& m = d.job.metrics();
    stored.has_state = true;
    stored.state.metrics = FiguresOfJob(m);
    stored.state.weights = d.final_weights;
    if (!d.final_buffers.empty()) {
      stored.state.buffers =
          std::make_shared<const std::string>(d.final_buffers);
    }
  } else if (d.start != nullptr) {
    stored = *d.start;  // restored, not placed yet: as it was
  }
  stored.job = d.job;
  stored.history = std::move(d.history);
  stored.table_homes = std::move(d.table_homes);
  if (stored.has_state)
    stored.job.mutable_metrics()->set_step(stored.state.metrics.version);
  TALLY_RETURN_IF_ERROR(store_->Save(stored));
  d.saved_version = stored.has_state ? stored.state.metrics.version : -1;
  return true;
}

void JobArchive::NoteWritten(const CheckpointDue& d, JobEntry& job,
                             absl::Time now) {
  job.saved_state = d.job.state();
  job.saved_version = d.saved_version;
  job.saved_at = now;
  if (d.saved_version >= 0 && !Terminal(d.job.state())) {
    job.AddEvent(now, absl::StrCat("checkpoint at step ", d.saved_version));
  }
}

void JobArchive::SaveNextJob(int64_t next) {
  if (store_ == nullptr) return;
  if (absl::Status s = store_->SaveNextJob(next); !s.ok()) {
    std::fprintf(stderr, "tally-server: %s\n",
                 std::string(s.message()).c_str());
  }
}

void JobArchive::Forget(const DroppedJob& d) {
  if (d.weights != nullptr) {
    const std::string path =
        absl::StrCat(options_.keep_weights_dir, "/", d.id, ".safetensors");
    absl::Status s = WriteFileAtomic(
        path, JobExport::File(d.params, *d.weights, d.python, d.buffers, d.id,
                              d.name, d.step));
    if (!s.ok()) {
      // The checkpoint stays: the weights are not lost (the job comes back
      // at the next restart, and is dropped again then).
      std::fprintf(stderr, "tally-server: keeping %s's weights: %s\n",
                   d.id.c_str(), std::string(s.message()).c_str());
      return;
    }
  }
  if (store_ != nullptr) {
    if (absl::Status s = store_->Remove(d.id); !s.ok()) {
      std::fprintf(stderr, "tally-server: dropping %s: %s\n", d.id.c_str(),
                   std::string(s.message()).c_str());
    }
  }
}

}  // namespace tally

