// The route of a job's embedding rows through one range: pulls of rows
// (checked whole before they wait, read as of the range's version), and
// members' row gradients of a step, checked, copied and staged by piece
// (ShardMember::rows) until the step closes, when those of the members
// whose push counted are summed in rank order, weighted by samples,
// divided by the step's samples and stepped by each table's optimizer
// (SparseTables); with tables: async, each piece is stepped as it comes
// instead.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock.
// CheckPull reads only what the tables were made with, and so may run
// outside it.
#ifndef TALLY_SERVER_DATA_ROW_STAGING_H_
#define TALLY_SERVER_DATA_ROW_STAGING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/data/shard_member.h"
#include "server/data/sparse_table.h"
#include "server/shard_control.h"

namespace tally {

struct PushCounts;

class RowStaging {
 public:
  // The pieces of one member's rows of a step (PushRowsRequest.piece):
  // with SparseTables::kMaxValuesPerMessage values each, 64 MiB at most.
  static constexpr int kMaxRowPieces = 64;

  // `tables`: the job's (null: it has none).
  explicit RowStaging(std::shared_ptr<SparseTables> tables)
      : tables_(std::move(tables)) {}
  RowStaging(const RowStaging&) = delete;
  RowStaging& operator=(const RowStaging&) = delete;

  const std::shared_ptr<SparseTables>& tables() const { return tables_; }
  // kInvalidArgument: job `job_id` has no tables here.
  static absl::Status NoTables(const std::string& job_id);
  // A pull's rows: kInvalidArgument unless the job has tables here
  // (`tables` not null) and SparseTables::CheckRequest lets them in.
  static absl::Status CheckPull(const SparseTables* tables,
                                const v1::PullRowsRequest& req);
  // The rows of a checked member's pull as of `version`, made where
  // missing (CheckPull's codes; kResourceExhausted past the budget).
  absl::Status Read(const v1::PullRowsRequest& req, int64_t version,
                    v1::PullRowsResponse* resp);
  // Member m's rows `req`, the member and its step checked: piece 0 first
  // (it replaces what was staged for the step: *replaced), then up to
  // kMaxRowPieces - 1 more in any order. `now` (tables: async, or an
  // async job): stepped at once, each piece once. kInvalidArgument for a
  // request CheckRequest refuses, values of another size, and + NON_FINITE
  // for a NaN or infinity (counted).
  absl::Status Stage(ShardMember& m, const v1::PushRowsRequest& req, bool now,
                     int64_t version, PushCounts* counts, bool* replaced);
  // Step `version` closes with `required` (rank order) and `samples`: the
  // row gradients of those whose push counted, summed, divided by
  // `samples` and stepped (none when `stepped_already`: tables: async); a
  // table whose mean overflowed is counted and left as it is.
  void Apply(const std::vector<ShardMember*>& required, int64_t version,
             int64_t samples, bool stepped_already, PushCounts* counts);
  // A version was made: a step for the tables' eviction.
  void EndStep(int64_t version) {
    if (tables_ != nullptr) tables_->EndStep(version);
  }
  // The job ended: the rows are frozen for export.
  void Freeze() {
    if (tables_ != nullptr) tables_->Freeze();
  }
  std::vector<TableMetrics> Metrics() const {
    return tables_ != nullptr ? tables_->Metrics()
                              : std::vector<TableMetrics>{};
  }

 private:
  // Each piece stepped once, with the member's own mean gradients.
  absl::Status StepNow(ShardMember& m, const v1::PushRowsRequest& req,
                       int64_t version, PushCounts* counts);
  // The request's row gradients, checked, copied and counted.
  absl::Status Decode(const v1::PushRowsRequest& req,
                      std::vector<RowGrads>* blocks, PushCounts* counts);

  std::shared_ptr<SparseTables> tables_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_ROW_STAGING_H_
