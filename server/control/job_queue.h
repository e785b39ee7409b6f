// The coordinator's jobs and their queue: every job's record (JobEntry,
// job_entry.h) by id and in submission order, the next job number, and
// the rules that belong to jobs alone: admission (max_queued_jobs, a
// submitter's share), pages of the list, which ended jobs are dropped,
// who is asked for a Python model's initial weights, and what a worker's
// report may set.
//
// Job numbers are never given twice: they grow from 1, and a restored
// queue goes on past every number it was restored with.
//
// Not thread-safe: guarded by its owner (the Coordinator's mu_).
#ifndef TALLY_SERVER_CONTROL_JOB_QUEUE_H_
#define TALLY_SERVER_CONTROL_JOB_QUEUE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/control/job_entry.h"

namespace tally {

struct JobQuery {
  int page_size = 100;     // 0 or less: 100
  std::string page_token;  // empty: from the first job
  bool omit_spec = false;
  std::string owner;  // non-empty: only this submitter's jobs
};

// An ended job dropped from the queue; with its final weights (and what
// encodes them) when they are to be kept.
struct DroppedJob {
  std::string id;
  std::shared_ptr<const std::vector<float>> weights;  // null: not kept
  std::vector<ParamInfo> params;
  PythonModelSpec python;
  std::string buffers;
  std::string name;
  int64_t step = 0;
};

class JobQueue {
 public:
  struct Options {
    // PENDING jobs beyond this: Admit answers kResourceExhausted; and a
    // named submitter's share of them.
    int64_t max_queued_jobs = 1000;
    int64_t max_queued_jobs_per_submitter = 100;
    // Ended jobs beyond this many, oldest first, and ended longer ago than
    // finished_job_ttl (zero: no age limit), are dropped.
    int64_t max_finished_jobs = 1000;
    absl::Duration finished_job_ttl = absl::ZeroDuration();
    // Jobs are kept on disk: an ended job goes only once its end is.
    bool durable = false;
    // A dropped job's final weights are handed out (DroppedJob::weights).
    bool keep_weights = false;
    // How long the worker asked for a Python model's initial weights may
    // take (WeightsOverdue).
    absl::Duration initial_weights_timeout = absl::Minutes(10);
  };

  explicit JobQueue(const Options& options) : options_(options) {}
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  // kResourceExhausted when the queue, or `owner`'s share of it, is full.
  absl::Status Admit(const std::string& owner) const;
  // Jobs PENDING (of `owner` alone when given).
  int64_t Queued(const std::string* owner = nullptr) const;
  // A new PENDING job, numbered next, last in the queue; its schedule is
  // the spec's (the plan is not recorded yet: Planner::RecordPlan).
  JobEntry& Add(JobSpec spec, const std::string& spec_text,
                const std::string& owner, absl::Time now);

  // kNotFound (NoJob) for an unknown job.
  absl::StatusOr<JobEntry*> Find(const std::string& job_id);
  absl::StatusOr<const JobEntry*> Find(const std::string& job_id) const;
  JobEntry& at(const std::string& job_id) { return jobs_.at(job_id); }
  const JobEntry& at(const std::string& job_id) const {
    return jobs_.at(job_id);
  }
  bool empty() const { return jobs_.empty(); }
  // Ids in submission order (by job number).
  const std::vector<std::string>& order() const { return order_; }
  // Every job, by id.
  std::map<std::string, JobEntry>& entries() { return jobs_; }
  const std::map<std::string, JobEntry>& entries() const { return jobs_; }
  int64_t next_job() const { return next_job_; }

  // The jobs of a page, in submission order, and the token of the next
  // (empty: no more); kInvalidArgument for a token this queue did not give.
  absl::StatusOr<std::vector<const JobEntry*>> Page(
      const JobQuery& query, std::string* next_page_token) const;

  // Replaces an empty queue with restored jobs; numbering goes on past
  // theirs and `next_job` (the number kept on disk).
  // kFailedPrecondition once a job was added.
  absl::Status Restore(std::map<std::string, JobEntry> jobs, int64_t next_job);

  // Takes out the ended jobs past max_finished_jobs or finished_job_ttl:
  // those whose ranges are gone, whose end is on disk (durable) and that
  // no worker in `busy` (job ids) is still leaving.
  std::vector<DroppedJob> TakeDroppable(absl::Time now,
                                        const std::set<std::string>& busy);

  // Whether `worker_id` is to build a Python model's initial weights (its
  // lowest rank, the job running without them); notes when it was first
  // asked.
  static bool AskForWeights(JobEntry& job, const std::string& worker_id,
                            absl::Time now);
  // The Python jobs whose asked worker has not sent their initial weights
  // within initial_weights_timeout, each with the message it fails with.
  // A job whose asked worker left is asked again (of the next).
  std::vector<std::pair<JobEntry*, std::string>> WeightsOverdue(
      absl::Time now);
  // The job whose initial weights `worker_id` may offer (the lease is the
  // caller's to check): kNotFound, kInvalidArgument (not a Python
  // model's), kFailedPrecondition + JOB_ENDED or NOT_A_MEMBER,
  // kAlreadyExists + WEIGHTS_GIVEN.
  absl::StatusOr<JobEntry*> OfferWanted(const std::string& job_id,
                                        const std::string& worker_id);

  // A failed report from a placement the job has left (a runner of an
  // earlier map): true, noted in the events once a worker and map.
  static bool NoteStaleReport(JobEntry& job, const v1::ReportResultRequest& req,
                              const std::string& who, absl::Time now);
  // A member's result on the final weights (the job at `version`): its test
  // figures and buffers become the job's. kFailedPrecondition + NOT_FINISHED
  // for a result of other weights, kUnavailable + NOT_FINISHED before the
  // weights are final, kInvalidArgument for buffers of another size.
  static absl::Status TakeResult(JobEntry& job,
                                 const v1::ReportResultRequest& req,
                                 int64_t version);

 private:
  const Options options_;
  int64_t next_job_ = 1;
  std::map<std::string, JobEntry> jobs_;
  std::vector<std::string> order_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_JOB_QUEUE_H_
