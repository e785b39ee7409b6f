#include "server/data/local_shard_control.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "server/data/shard_host.h"

namespace tally {

namespace {

class LocalShardControl final : public ShardControl {
 public:
  explicit LocalShardControl(ShardHost* host) : host_(host) {}

  absl::Status Install(const v1::InstallRangeRequest& req) override {
    return host_->Install(req);
  }
  absl::StatusOr<HoldReport> Hold(const std::string& job_id,
                                  int64_t map_version, int64_t hold_id,
                                  absl::Duration hold) override {
    return host_->Hold(job_id, map_version, hold_id, hold);
  }
  absl::Status SetMembers(const std::string& job_id, int64_t map_version,
                          const std::vector<MemberSpec>& members,
                          int64_t hold_id, const PlanChange& plan) override {
    return host_->SetMembers(job_id, map_version, members, hold_id, plan);
  }
  absl::StatusOr<int64_t> Promote(const std::string& job_id,
                                  int64_t map_version) override {
    return host_->Promote(job_id, map_version);
  }
  absl::Status SetBackup(const std::string& job_id, int64_t map_version,
                         const std::string& backup_address,
                         int64_t from_version) override {
    return host_->SetBackup(job_id, map_version, backup_address,
                            from_version);
  }
  absl::StatusOr<ShardState> SeedBackup(const std::string& job_id,
                                        int64_t map_version,
                                        const std::string& backup_address,
                                        int64_t /*count*/) override {
    return host_->SeedBackup(job_id, map_version, backup_address);
  }
  absl::Status Retire(const std::string& job_id, int64_t map_version) override {
    return host_->Retire(job_id, map_version);
  }
  void Drop(const std::string& job_id, bool ended) override {
    host_->Drop(job_id, ended);
  }
  absl::StatusOr<ShardState> Save(const std::string& job_id,
                                  int64_t map_version, int64_t version,
                                  int64_t /*count*/, absl::Duration wait,
                                  bool weights_only) override {
    struct Result {
      absl::Notification done;
      absl::StatusOr<ShardState> state = absl::UnknownError("not saved");
    };
    auto result = std::make_shared<Result>();
    host_->SaveAt(job_id, map_version, version, absl::Now() + wait,
                  [result](absl::StatusOr<ShardState> s) {
                    result->state = std::move(s);
                    result->done.Notify();
                  },
                  weights_only);
    // The host releases the wait at its deadline (its Tick); a margin
    // covers the tick.
    if (!result->done.WaitForNotificationWithTimeout(wait + absl::Seconds(1))) {
      return absl::DeadlineExceededError(
          absl::StrCat("version ", version, " not reached in time"));
    }
    return result->state;
  }
  absl::StatusOr<v1::ReadTableResponse> ReadTable(
      const std::string& job_id, int64_t map_version, int table,
      int64_t start, int64_t max_rows) override {
    std::vector<int64_t> rows;
    v1::ReadTableResponse out;
    int64_t total = 0;
    TALLY_RETURN_IF_ERROR(host_->ReadTable(job_id, map_version, table, start,
                                           max_rows, &rows,
                                           out.mutable_values(), &total));
    out.mutable_rows()->Assign(rows.begin(), rows.end());
    out.set_total_rows(total);
    return out;
  }
  absl::StatusOr<std::vector<v1::RangeStatus>> Status() override {
    return host_->Status();
  }
  bool local() const override { return true; }

 private:
  ShardHost* host_;  // borrowed
};

}  // namespace

std::unique_ptr<ShardControl> MakeLocalShardControl(ShardHost* host) {
  return std::make_unique<LocalShardControl>(host);
}

}  // namespace tally
