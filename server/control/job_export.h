// A job's weights as a .safetensors file (tally fetch): the parameters
// under their state_dict names, a Python model's buffers (the file says in
// its metadata when it has none: load_state_dict(strict=True) would refuse
// it), tied weights' aliases, and an ended job's embedding tables, read
// from the shards that kept them as the file is sent (table_export.h).
//
// The weights are the ended job's final ones, a running job's ranges read
// at one version (range_reads.h), or a placed-again job's start. What the
// file is made of is taken from the job under the coordinator's lock
// (Take); the file is made without it (Make), since reading the ranges
// waits on the shards.
#ifndef TALLY_SERVER_CONTROL_JOB_EXPORT_H_
#define TALLY_SERVER_CONTROL_JOB_EXPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/control/job_entry.h"
#include "server/control/range_reads.h"
#include "server/control/registry.h"
#include "server/control/table_export.h"

namespace tally {

class JobExport {
 public:
  // kFailedPrecondition + JOB_NOT_STARTED for a job with no weights yet.
  static absl::StatusOr<JobExport> Take(const JobEntry& job,
                                        const Registry& registry);

  // The file, but for its tables' bytes, which `*tables` (null: none)
  // reads afterwards; `*buffers_note` says why a Python model's buffers
  // are missing (empty: complete). Reads a running job's ranges first.
  absl::Status Make(std::string* head, std::unique_ptr<TableExport>* tables,
                    std::string* buffers_note);

  // The file of `weights` at `version` (a dropped job's, kept), with
  // `tables` (null: none) and the note of why it has none.
  static std::string File(const std::vector<ParamInfo>& params,
                          const std::vector<float>& weights,
                          const PythonModelSpec& py, const std::string& buffers,
                          const std::string& job_id, const std::string& name,
                          int64_t version, const TableExport* tables = nullptr,
                          const std::string& tables_note = "");
  // Why a Python model's file has none of its buffers ("" when it has
  // them or the model has none).
  static std::string BuffersNote(const PythonModelSpec& py,
                                 const std::string& buffers);

 private:
  JobExport() = default;

  std::string job_id_;
  ModelLayout layout_;
  std::string name_;
  PythonModelSpec python_;
  std::string buffers_;
  std::shared_ptr<const std::vector<float>> weights_;  // null: read ranges_
  int64_t version_ = 0;
  int64_t total_steps_ = 0;
  int64_t map_version_ = 0;
  std::vector<RangeRef> ranges_;
  std::unique_ptr<TableExport> tables_;
  std::string tables_note_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_JOB_EXPORT_H_
