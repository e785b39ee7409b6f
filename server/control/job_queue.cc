#include "server/control/job_queue.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "proto/errors.h"

namespace tally {

int64_t JobQueue::Queued(const std::string* owner) const {
  int64_t n = 0;
  for (const auto& [id, job] : jobs_) {
    n += job.proto.state() == v1::PENDING &&
         (owner == nullptr || job.proto.owner() == *owner);
  }
  return n;
}

absl::Status JobQueue::Admit(const std::string& owner) const {
  if (Queued() >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_queued_jobs,
                     " jobs already wait for workers "
                     "(--max_queued_jobs); cancel some or try later"));
  }
  // Without tokens every caller is the same nobody: only named submitters
  // have shares.
  if (!owner.empty() &&
      Queued(&owner) >= options_.max_queued_jobs_per_submitter) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Quoted(owner), " has ", options_.max_queued_jobs_per_submitter,
        " jobs waiting for workers already "
        "(--max_queued_jobs_per_submitter); cancel some or try later"));
  }
  return absl::OkStatus();
}

JobEntry& JobQueue::Add(JobSpec spec, const std::string& spec_text,
                        const std::string& owner, absl::Time now) {
  const std::string id = absl::StrCat("job-", next_job_++);
  JobEntry& job = jobs_[id];
  job.spec = std::move(spec);
  job.schedule = MakeSchedule(job.spec, TrainSize(job.spec.dataset),
                              static_cast<int>(job.spec.training.World()));
  job.proto.set_id(id);
  job.proto.set_name(job.spec.name);
  job.proto.set_state(v1::PENDING);
  job.proto.set_spec(spec_text);
  job.proto.set_num_params(job.spec.layout.num_params);
  job.proto.set_workers_wanted(static_cast<int32_t>(job.spec.training.workers));
  job.proto.set_created_unix(UnixSeconds(now));
  job.proto.set_owner(owner);
  job.AddEvent(now, owner.empty() ? "submitted"
                                  : absl::StrCat("submitted by ", owner));
  job.slots.assign(job.spec.training.World(), "");
  order_.push_back(id);
  return job;
}

absl::StatusOr<JobEntry*> JobQueue::Find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJob(job_id);
  return &it->second;
}

absl::StatusOr<const JobEntry*> JobQueue::Find(
    const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJob(job_id);
  return &it->second;
}

absl::StatusOr<std::vector<const JobEntry*>> JobQueue::Page(
    const JobQuery& query, std::string* next_page_token) const {
  int64_t after = 0;
  if (!query.page_token.empty() &&
      (!absl::SimpleAtoi(query.page_token, &after) || after <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token ", Quoted(query.page_token),
                     " is not one this server gave"));
  }
  const int page_size = query.page_size > 0 ? query.page_size : 100;
  std::vector<const JobEntry*> page;
  next_page_token->clear();
  // order_ is sorted by job number.
  auto it = std::upper_bound(
      order_.begin(), order_.end(), after,
      [](int64_t n, const std::string& id) { return n < JobNumber(id); });
  for (; it != order_.end(); ++it) {
    const JobEntry& job = jobs_.at(*it);
    if (!query.owner.empty() && job.proto.owner() != query.owner) continue;
    if (static_cast<int>(page.size()) == page_size) {
      *next_page_token = absl::StrCat(JobNumber(page.back()->id()));
      break;
    }
    page.push_back(&job);
  }
  return page;
}

absl::Status JobQueue::Restore(std::map<std::string, JobEntry> jobs,
                               int64_t next_job) {
  if (!jobs_.empty()) {
    return absl::FailedPreconditionError(
        "Restore must run before any job is submitted");
  }
  std::vector<std::string> order;
  for (auto& [id, job] : jobs) {
    order.push_back(id);
    next_job_ = std::max(next_job_, JobNumber(id) + 1);
  }
  next_job_ = std::max(next_job_, next_job);
  std::sort(order.begin(), order.end(),
            [](const std::string& a, const std::string& b) {
              return JobNumber(a) < JobNumber(b);
            });
  jobs_ = std::move(jobs);
  order_ = std::move(order);
  return absl::OkStatus();
}

std::vector<DroppedJob> JobQueue::TakeDroppable(
    absl::Time now, const std::set<std::string>& busy) {
  std::vector<std::string> ended;  // oldest first (by job number)
  for (const std::string& id : order_) {
    const JobEntry& job = jobs_.at(id);
    // Only once the ranges are gone and the end is on disk.
    if (job.ended() && (job.retired || job.ranges.empty()) &&
        (!options_.durable || job.saved_state == job.proto.state()) &&
        !busy.count(id)) {
      ended.push_back(id);
    }
  }
  const int64_t excess =
      static_cast<int64_t>(ended.size()) - options_.max_finished_jobs;
  std::vector<DroppedJob> dropped;
  for (size_t i = 0; i < ended.size(); ++i) {
    const JobEntry& job = jobs_.at(ended[i]);
    const bool too_many = static_cast<int64_t>(i) < excess;
    const bool too_old = options_.finished_job_ttl > absl::ZeroDuration() &&
                         now - absl::FromUnixSeconds(static_cast<int64_t>(
                                   job.proto.finished_unix())) >
                             options_.finished_job_ttl;
    if (!too_many && !too_old) continue;
    DroppedJob d;
    d.id = ended[i];
    if (options_.keep_weights && job.final_weights != nullptr) {
      d.weights = job.final_weights;
      d.params = job.spec.layout.params;
      d.python = job.spec.python;
      d.buffers = job.final_buffers;
      d.name = job.spec.name;
      d.step = job.proto.metrics().step();
    }
    dropped.push_back(std::move(d));
  }
  for (const DroppedJob& d : dropped) {
    jobs_.erase(d.id);
    order_.erase(std::find(order_.begin(), order_.end(), d.id));
  }
  return dropped;
}

bool JobQueue::AskForWeights(JobEntry& job, const std::string& worker_id,
                             absl::Time now) {
  if (!job.spec.is_python || job.start != nullptr ||
      job.proto.state() != v1::RUNNING || job.LowestRank() != worker_id)
    return false;
  if (job.weights_asked_of != worker_id) {  // a new worker: a new clock
    job.weights_asked_of = worker_id;
    job.weights_asked_at = now;
  }
  return true;
}

std::vector<std::pair<JobEntry*, std::string>> JobQueue::WeightsOverdue(
    absl::Time now) {
  std::vector<std::pair<JobEntry*, std::string>> out;
  for (auto& [id, job] : jobs_) {
    if (!job.spec.is_python || job.start != nullptr ||
        job.proto.state() != v1::RUNNING || job.weights_asked_of.empty()) {
      continue;
    }
    // The asked worker left: the clock starts again with the next one.
    if (job.LowestRank() != job.weights_asked_of) {
      job.weights_asked_of.clear();
      continue;
    }
    if (now - job.weights_asked_at <= options_.initial_weights_timeout)
      continue;
    out.emplace_back(
        &job, absl::StrCat("no initial weights from ", job.weights_asked_of,
                           " within ",
                           absl::FormatDuration(
                               options_.initial_weights_timeout),
                           ": building the module did not end, or its "
                           "offers failed (see that worker's log)"));
  }
  return out;
}

// The job a Python model's, running, without its initial weights yet, and
// the worker the one asked for them (its lowest rank).
absl::StatusOr<JobEntry*> JobQueue::OfferWanted(const std::string& job_id,
                                                const std::string& worker_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NoJob(job_id);
  JobEntry& job = it->second;
  if (!job.spec.is_python) {
    return absl::InvalidArgumentError(
        absl::StrCat(job_id, " is not a Python model's: its initial weights "
                             "come from its spec"));
  }
  if (job.ended()) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            job_id, " has ended (",
            v1::JobState_Name(job.proto.state()), "): no initial weights "
            "are wanted")),
        v1::JOB_ENDED);
  }
  // Said, not taken again: a second offer would cost the coordinator a
  // model's memory for nothing.
  if (job.start != nullptr) {
    return WithReason(absl::AlreadyExistsError(absl::StrCat(
                          job_id, " has its initial weights already")),
                      v1::WEIGHTS_GIVEN);
  }
  if (job.LowestRank() != worker_id) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            Quoted(worker_id), " was not asked for ", job_id,
            "'s initial weights (the job's lowest rank gives them)")),
        v1::NOT_A_MEMBER);
  }
  return &job;
}

bool JobQueue::NoteStaleReport(JobEntry& job,
                               const v1::ReportResultRequest& req,
                               const std::string& who, absl::Time now) {
  if (req.ok() || req.reason() == v1::SCHEDULE_MISMATCH ||
      req.map_version() == 0 || req.map_version() >= job.map_version) {
    return false;
  }
  // A runner of a placement the job has left (a shard was lost, the job
  // rolled back): its step's answers came from shards that are no longer
  // the job's, and its runner on the new map goes on. Noted once a worker
  // and map, the message cut (reports can be repeated).
  const std::string key = absl::StrCat(req.worker_id(), "@", req.map_version());
  if (job.stale_reports.insert(key).second) {
    job.AddEvent(now, absl::StrCat(
                          who,
                          " stopped on an earlier placement of the job (map "
                          "version ",
                          req.map_version(), "): ",
                          absl::string_view(req.message()).substr(0, 1024)));
  }
  return true;
}

absl::Status JobQueue::TakeResult(JobEntry& job,
                                  const v1::ReportResultRequest& req,
                                  int64_t version) {
  if (req.steps() != job.schedule.total_steps) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "a result must evaluate the final weights (version ",
            job.schedule.total_steps, "), not version ", req.steps())),
        v1::NOT_FINISHED, job.schedule.total_steps);
  }
  if (version < job.schedule.total_steps) {
    return WithReason(absl::UnavailableError(absl::StrCat(
                          "the weights are at version ", version, " of ",
                          job.schedule.total_steps, ": not final yet")),
                      v1::NOT_FINISHED, version);
  }
  if (static_cast<int64_t>(req.buffers().size()) !=
      job.spec.python.buffer_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a report's buffers are ", req.buffers().size(), " bytes, the job's ",
        job.spec.python.buffer_bytes));
  }
  job.final_buffers = req.buffers();
  v1::JobMetrics* m = job.proto.mutable_metrics();
  m->set_test_accuracy(req.test_accuracy());
  m->set_test_loss(req.test_loss());
  m->set_test_auc(req.test_auc());
  m->set_no_test_split(req.no_test_split());
  return absl::OkStatus();
}

}  // namespace tally
