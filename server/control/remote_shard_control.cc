#include "server/control/remote_shard_control.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/tally.grpc.pb.h"

namespace tally {

namespace {

// The control plane's bound on one call to a shard.
constexpr absl::Duration kControlTimeout = absl::Seconds(3);

class RemoteShardControl final : public ShardControl {
 public:
  RemoteShardControl(const std::string& address,
                     const TransportOptions& transport)
      : address_(address),
        stub_(v1::ShardService::NewStub(Dial(address, transport))) {}

  absl::Status Install(const v1::InstallRangeRequest& req) override {
    v1::InstallRangeResponse resp;
    // The state's bytes take a while on a slow link: a minute more.
    auto ctx =
        Context(kControlTimeout +
                (req.has_state() ? absl::Minutes(1) : absl::ZeroDuration()));
    auto writer = stub_->InstallRange(ctx.get(), &resp);
    v1::InstallRangeChunk msg;
    *msg.mutable_request() = req;
    if (req.has_state()) {
      msg.mutable_request()->mutable_state()->clear_weights();
      msg.mutable_request()->mutable_state()->clear_optimizer_slots();
    }
    bool ok = writer->Write(msg);
    msg.clear_request();
    if (req.has_state()) {
      std::vector<const std::string*> parts = {&req.state().weights()};
      for (const std::string& slot : req.state().optimizer_slots())
        parts.push_back(&slot);
      constexpr size_t kPiece = 1 << 20;
      for (size_t p = 0; p < parts.size() && ok; ++p) {
        for (size_t at = 0; at < parts[p]->size() && ok; at += kPiece) {
          msg.set_part(static_cast<int32_t>(p));
          msg.set_data(parts[p]->data() + at,
                       std::min(kPiece, parts[p]->size() - at));
          ok = writer->Write(msg);
        }
      }
    }
    if (ok) writer->WritesDone();
    return Named(FromGrpc(writer->Finish()));
  }
  absl::StatusOr<HoldReport> Hold(const std::string& job_id,
                                  int64_t map_version, int64_t hold_id,
                                  absl::Duration hold) override {
    v1::HoldRangeRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    req.set_hold_id(hold_id);
    req.set_hold_ms(absl::ToInt64Milliseconds(hold));
    v1::HoldRangeResponse resp;
    auto ctx = Context(kControlTimeout);
    absl::Status s = FromGrpc(stub_->HoldRange(ctx.get(), req, &resp));
    if (!s.ok()) return Named(s);
    HoldReport r;
    r.version = resp.version();
    for (const v1::MemberProgress& m : resp.members())
      r.members.push_back(FromProto(m));
    return r;
  }
  absl::Status SetMembers(const std::string& job_id, int64_t map_version,
                          const std::vector<MemberSpec>& members,
                          int64_t hold_id, const PlanChange& plan) override {
    v1::SetRangeMembersRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    req.set_hold_id(hold_id);
    req.set_plan(plan.plan);
    req.set_total_steps(plan.total_steps);
    for (const MemberSpec& m : members) *req.add_members() = ToProto(m);
    v1::SetRangeMembersResponse resp;
    auto ctx = Context(kControlTimeout);
    return Named(FromGrpc(stub_->SetRangeMembers(ctx.get(), req, &resp)));
  }
  absl::Status Retire(const std::string& job_id, int64_t map_version) override {
    v1::RetireRangeRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    v1::RetireRangeResponse resp;
    auto ctx = Context(kControlTimeout);
    return Named(FromGrpc(stub_->RetireRange(ctx.get(), req, &resp)));
  }
  absl::StatusOr<int64_t> Promote(const std::string& job_id,
                                  int64_t map_version) override {
    v1::PromoteRangeRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    v1::PromoteRangeResponse resp;
    auto ctx = Context(kControlTimeout);
    TALLY_RETURN_IF_ERROR(
        Named(FromGrpc(stub_->PromoteRange(ctx.get(), req, &resp))));
    return resp.version();
  }
  absl::Status SetBackup(const std::string& job_id, int64_t map_version,
                         const std::string& backup_address,
                         int64_t from_version) override {
    v1::SetRangeBackupRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    req.set_backup_address(backup_address);
    req.set_from_version(from_version);
    v1::SetRangeBackupResponse resp;
    auto ctx = Context(kControlTimeout);
    return Named(FromGrpc(stub_->SetRangeBackup(ctx.get(), req, &resp)));
  }
  void Drop(const std::string&, bool) override {}
  absl::StatusOr<ShardState> Save(const std::string& job_id,
                                  int64_t map_version, int64_t version,
                                  int64_t count, absl::Duration wait,
                                  bool weights_only) override {
    v1::SaveRangeRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    req.set_version(version);
    req.set_max_wait_ms(absl::ToInt64Milliseconds(wait));
    req.set_weights_only(weights_only);
    return SaveOf(req, count, wait);
  }
  absl::StatusOr<ShardState> SeedBackup(const std::string& job_id,
                                        int64_t map_version,
                                        const std::string& backup_address,
                                        int64_t count) override {
    v1::SaveRangeRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    req.set_backup_address(backup_address);
    return SaveOf(req, count, absl::ZeroDuration());
  }
  absl::StatusOr<v1::ReadTableResponse> ReadTable(
      const std::string& job_id, int64_t map_version, int table,
      int64_t start, int64_t max_rows) override {
    v1::ReadTableRequest req;
    req.set_job_id(job_id);
    req.set_map_version(map_version);
    req.set_table(table);
    req.set_start_row(start);
    req.set_max_rows(max_rows);
    v1::ReadTableResponse resp;
    auto ctx = Context(kControlTimeout + absl::Seconds(10));
    absl::Status s = FromGrpc(stub_->ReadTable(ctx.get(), req, &resp));
    if (!s.ok()) return Named(s);
    return resp;
  }
  absl::StatusOr<std::vector<v1::RangeStatus>> Status() override {
    return absl::UnimplementedError("remote shards report by heartbeat");
  }
  bool local() const override { return false; }

 private:
  // A SaveRange call's state: at most `count` values in any part, the
  // bytes taken within `wait` and a minute more (a few GB).
  absl::StatusOr<ShardState> SaveOf(const v1::SaveRangeRequest& req,
                                    int64_t count, absl::Duration wait) {
    const bool weights_only = req.weights_only();
    auto ctx = Context(wait + absl::Minutes(1));
    auto reader = stub_->SaveRange(ctx.get(), req);
    v1::SaveRangeChunk chunk;
    ShardState st;
    std::vector<std::string> parts;
    bool first = true;
    while (reader->Read(&chunk)) {
      if (first) {
        DecodeRangeRecord(chunk.state(), &st);
        first = false;
      }
      // The weights (part 0) and, unless weights_only, at most every
      // optimizer slot (parts 1 ...), each the range's size: checked before
      // the bytes are kept, so nothing beyond that is ever held.
      const int max_part = weights_only ? 0 : OptimizerState::kMaxSlots;
      const bool malformed = chunk.part() < 0 || chunk.part() > max_part;
      if (!malformed && static_cast<size_t>(chunk.part()) >= parts.size())
        parts.resize(chunk.part() + 1);
      if (malformed || parts[chunk.part()].size() + chunk.data().size() >
                           static_cast<uint64_t>(count) * 4) {
        ctx->TryCancel();
        reader->Finish();
        return Named(absl::DataLossError(
            malformed ? "a malformed range from the shard"
                      : absl::StrCat("the shard sent more than the range's ",
                                     count, " values")));
      }
      parts[chunk.part()] += chunk.data();
    }
    absl::Status s = FromGrpc(reader->Finish());
    if (!s.ok()) return Named(s);
    if (parts.empty()) parts.resize(1);
    TALLY_RETURN_IF_ERROR(Named(CheckParts(parts, count)));
    auto weights = std::make_shared<std::vector<float>>(parts[0].size() / 4);
    std::memcpy(weights->data(), parts[0].data(), weights->size() * 4);
    st.weights = std::move(weights);
    for (size_t i = 1; i < parts.size(); ++i) {
      std::vector<float> slot(parts[i].size() / 4);
      std::memcpy(slot.data(), parts[i].data(), slot.size() * 4);
      st.optimizer.slots.push_back(std::move(slot));
    }
    return st;
  }
  static std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return ctx;
  }
  // Every part of a saved state is the range's size.
  static absl::Status CheckParts(const std::vector<std::string>& parts,
                                 int64_t count) {
    for (const std::string& part : parts) {
      if (part.size() != static_cast<uint64_t>(count) * 4) {
        return absl::DataLossError(absl::StrCat(
            "the shard sent ", part.size(),
            " bytes of a state part where the range has ", count, " values"));
      }
    }
    return absl::OkStatus();
  }
  // The shard's address in the message, keeping the code and reason.
  absl::Status Named(const absl::Status& s) const {
    if (s.ok()) return s;
    absl::Status out(s.code(),
                     absl::StrCat("shard ", address_, ": ", s.message()));
    s.ForEachPayload([&out](absl::string_view url, const absl::Cord& p) {
      out.SetPayload(url, p);
    });
    return out;
  }

  const std::string address_;
  std::unique_ptr<v1::ShardService::Stub> stub_;
};

}  // namespace

std::unique_ptr<ShardControl> MakeRemoteShardControl(
    const std::string& address, const TransportOptions& transport) {
  return std::make_unique<RemoteShardControl>(address, transport);
}

}  // namespace tally
