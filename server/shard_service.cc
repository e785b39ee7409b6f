#include "server/shard_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"
#include "server/internal/event_reactor.h"
#include "server/internal/finite.h"

namespace tally {

namespace {

using internal::EventWriteReactor;

// kInvalidArgument unless `c` is a well-formed chunk inside the range.
absl::Status CheckRangeChunk(const WireChunk& c, const Range& r) {
  TALLY_RETURN_IF_ERROR(CheckChunkFields(c.offset, c.count, c.dtype,
                                         c.data_size, r.offset + r.count));
  if (c.offset < r.offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk [", c.offset, ", +", c.count, ") is outside this shard's [",
        r.offset, ", +", r.count, ")"));
  }
  return absl::OkStatus();
}

// ----------------------------------------------------------------- push --

// Merged set of covered [begin, end) element ranges.
class Coverage {
 public:
  void Add(int64_t b, int64_t e) {
    auto it = ranges_.upper_bound(b);
    if (it != ranges_.begin() && std::prev(it)->second >= b) --it;
    while (it != ranges_.end() && it->first <= e) {
      b = std::min(b, it->first);
      e = std::max(e, it->second);
      covered_ -= it->second - it->first;
      it = ranges_.erase(it);
    }
    ranges_[b] = e;
    covered_ += e - b;
  }
  int64_t covered() const { return covered_; }

 private:
  std::map<int64_t, int64_t> ranges_;
  int64_t covered_ = 0;
};

// ----------------------------------------------------------------- push --

// Reads raw PushRequest bytes: the header with protobuf, each chunk's values
// from gRPC's slices straight into the staging buffer (checked for NaNs and
// infinities on the way).
class PushReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushReactor(ShardHost* host, DataPlaneMetrics* metrics,
              grpc::ByteBuffer* resp)
      : host_(host), metrics_(metrics), resp_bytes_(resp) {
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Complete();
      return;
    }
    absl::Status s = Consume();
    if (!s.ok()) {
      ReturnStaging();
      End(s);
      return;
    }
    if (done_early_) return;
    StartRead(&req_);
  }

  void OnDone() override {
    ReturnStaging();
    delete this;
  }

 private:
  // The staging buffer goes back as soon as the push is decided, not when
  // gRPC finally retires the call.
  void ReturnStaging() {
    if (shard_ != nullptr && staging_ != nullptr)
      shard_->ReleaseStaging(std::move(staging_));
  }

  absl::Status Consume() {
    // PushRequest: 1 header, 2 chunk.
    if (absl::Status s = msg_.Parse(req_, 2); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("push message: ", s.message()));
    }
    if (!has_header_) {
      if (!msg_.has(1)) {
        return absl::InvalidArgumentError(
            "the first push message must carry the header");
      }
      v1::PushHeader h;
      if (!h.ParseFromString(msg_.bytes(1))) {
        return absl::InvalidArgumentError("malformed push header");
      }
      meta_.worker_id = h.worker_id();
      meta_.incarnation = h.incarnation();
      meta_.step = h.step();
      meta_.base_version = h.base_version();
      meta_.samples = h.samples();
      meta_.loss_sum = h.loss_sum();
      meta_.correct = h.correct();
      self_commit_ = h.commit();
      has_header_ = true;
      TALLY_ASSIGN_OR_RETURN(range_, host_->Find(h.job_id()));
      shard_ = range_.shard;
      bool duplicate = false;
      if (absl::Status s = shard_->CheckPush(meta_, &duplicate); !s.ok())
        return s;
      if (!std::isfinite(meta_.loss_sum)) {
        RejectAndCommit();
        return WithReason(absl::InvalidArgumentError(
                              "non-finite loss_sum; push rejected and counted"),
                          v1::NON_FINITE);
      }
      if (duplicate) {
        // Already counted: acknowledge without reading the rest.
        resp_.set_duplicate(true);
        CommitIfAsked();
        resp_.set_version(shard_->version());
        done_early_ = true;
        End(absl::OkStatus());
        return absl::OkStatus();
      }
      if (meta_.samples > 0) {
        auto staging = shard_->AcquireStaging();
        if (!staging.ok()) return staging.status();
        staging_ = *std::move(staging);
      }
    } else if (msg_.has(1)) {
      return absl::InvalidArgumentError(
          "only the first push message may carry a header");
    }
    if (!msg_.has(2)) return absl::OkStatus();
    const WireChunk& c = msg_.chunk();
    bytes_ += static_cast<double>(c.data_size);
    TALLY_RETURN_IF_ERROR(CheckRangeChunk(c, range_));
    if (meta_.samples == 0) return absl::OkStatus();  // nothing to add
    const int64_t local = c.offset - range_.offset;
    float* dst = staging_->data() + local;
    const bool bf16 = c.dtype == v1::BFLOAT16;
    int64_t bad = -1;
    msg_.ForEachValues(bf16 ? 2 : 4, [&](const char* src, int64_t n,
                                         int64_t first) {
      if (bad >= 0) return;
      const int64_t b =
          bf16 ? internal::DecodeBfloat16AndFindNonFinite(dst + first, src, n)
               : internal::CopyAndFindNonFinite(dst + first, src, n);
      if (b >= 0) bad = first + b;
    });
    if (bad >= 0) {
      RejectAndCommit();
      return WithReason(
          absl::InvalidArgumentError(absl::StrCat(
              "non-finite gradient value (", dst[bad], ") at element ",
              c.offset + bad, "; push rejected and counted")),
          v1::NON_FINITE);
    }
    coverage_.Add(local, local + c.count);
    return absl::OkStatus();
  }

  void Complete() {
    if (!has_header_) {
      End(absl::InvalidArgumentError("empty push stream"));
      return;
    }
    if (meta_.samples > 0 && coverage_.covered() != shard_->num_params()) {
      ReturnStaging();
      End(absl::InvalidArgumentError(
          absl::StrCat("the push covers ", coverage_.covered(), " of ",
                       shard_->num_params(), " gradient elements")));
      return;
    }
    bool duplicate = false;
    absl::Status s = shard_->Accept(meta_, std::move(staging_), &duplicate);
    resp_.set_duplicate(duplicate);
    if (s.ok()) CommitIfAsked();
    resp_.set_version(shard_->version());
    End(s);
  }

  // A push that is its own commit (PushHeader.commit) is committed once it
  // is staged (or was already: a duplicate), ...
  void CommitIfAsked() {
    if (self_commit_) {
      resp_.set_committed(shard_->Commit(meta_.worker_id, meta_.incarnation,
                                         meta_.step, /*contributed=*/true));
    }
  }
  // ... and as nothing once it is refused. (The refusal is an error status,
  // which carries no response: the worker commits it as nothing again with
  // its next pull, which changes nothing if this commit was recorded.)
  void RejectAndCommit() {
    shard_->Reject(meta_);
    if (self_commit_) {
      shard_->Commit(meta_.worker_id, meta_.incarnation, meta_.step,
                     /*contributed=*/false);
    }
  }

  // Answers the push (once) and counts it.
  void End(const absl::Status& s) {
    if (metrics_ != nullptr) {
      metrics_->Pushed(s, resp_.duplicate(),
                       absl::ToDoubleSeconds(absl::Now() - started_), bytes_);
    }
    if (s.ok()) {
      grpc::Slice slice(resp_.SerializeAsString());
      grpc::ByteBuffer out(&slice, 1);
      resp_bytes_->Swap(&out);
    }
    Finish(ToGrpc(s));
  }

  ShardHost* host_;            // borrowed
  DataPlaneMetrics* metrics_;  // borrowed; may be null
  const absl::Time started_ = absl::Now();
  double bytes_ = 0;              // tensor bytes received
  grpc::ByteBuffer* resp_bytes_;  // gRPC's: the response, once encoded
  v1::PushResponse resp_;
  grpc::ByteBuffer req_;
  WireMessage msg_;
  bool has_header_ = false;
  bool self_commit_ = false;  // PushHeader.commit
  bool done_early_ = false;
  PushMeta meta_;
  Range range_;
  std::shared_ptr<ParameterShard> shard_;
  std::unique_ptr<std::vector<float>> staging_;  // from the shard's pool
  Coverage coverage_;
};

// ----------------------------------------------------------------- pull --

// Writes raw gRPC bytes: each PullResponse is encoded by EncodePullResponse
// over a slice of the weights snapshot (float32 values are not copied on
// their way to the transport). The wire is the .proto's.
class PullReactor final
    : public EventWriteReactor<PullReactor, grpc::ByteBuffer> {
 public:
  PullReactor(ShardHost* host, DataPlaneMetrics* metrics,
              const grpc::ByteBuffer* raw)
      : metrics_(metrics) {
    v1::PullRequest parsed;
    {
      grpc::ByteBuffer copy(*raw);  // Deserialize clears what it reads
      if (!grpc::SerializationTraits<v1::PullRequest>::Deserialize(&copy,
                                                                   &parsed)
               .ok()) {
        FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "malformed PullRequest"));
        return;
      }
    }
    const v1::PullRequest* req = &parsed;
    chunk_ =
        req->chunk_elements() > 0
            ? std::min<int64_t>(req->chunk_elements(), kDefaultChunkElements)
            : kDefaultChunkElements;
    absl::StatusOr<Range> range = host->Find(req->job_id());
    absl::Status s = range.status();
    if (s.ok()) s = DTypeWidth(req->dtype()).status();
    dtype_ = req->dtype();
    // Only the job's members read its weights on the data path (clients
    // fetch them through JobService).
    if (s.ok())
      s = range->shard->CheckMember(req->worker_id(), req->incarnation());
    if (s.ok() && req->total_steps() > 0) {
      s = range->shard->SetSchedule(req->total_steps(), req->steps_per_epoch());
    }
    if (s.ok() && req->has_commit() &&
        !range->shard->Commit(req->worker_id(), req->incarnation(),
                              req->commit().step(),
                              req->commit().contributed())) {
      s = absl::UnavailableError(
          "the job's membership is changing: pull again with the commit");
    }
    if (!s.ok()) {
      FinishOnce(ToGrpc(s));
      return;
    }
    range_ = *std::move(range);
    shard_ = range_.shard;
    const int64_t wait_ms = req->max_wait_ms() > 0
                                ? std::min<int64_t>(req->max_wait_ms(), 600000)
                                : 30000;
    auto ready =
        WhileLive([](PullReactor* r, const absl::Status& st) { r->Ready(st); });
    const absl::Time deadline = absl::Now() + absl::Milliseconds(wait_ms);
    if (req->has_clock()) {
      shard_->WhenClock(req->worker_id(), req->clock(), req->min_version(),
                        deadline, std::move(ready));
    } else {
      shard_->WhenVersion(req->min_version(), deadline, std::move(ready));
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (WriteDoneLocked(ok)) WriteNextLocked();
  }

 private:
  void Ready(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!s.ok()) {
      FinishOnceLocked(ToGrpc(s));
      return;
    }
    waited_ = absl::Now() - started_;
    weights_ = shard_->Snapshot(&version_, &total_steps_);
    values_ = dtype_ == v1::BFLOAT16
                  ? SnapshotSlice(shard_->Bfloat16Of(weights_, version_))
                  : SnapshotSlice(weights_);
    WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t n = static_cast<int64_t>(weights_->size());
    if (next_ >= n && next_ > 0) {
      if (metrics_ != nullptr) {
        metrics_->Pulled(absl::ToDoubleSeconds(waited_),
                         absl::ToDoubleSeconds(absl::Now() - started_),
                         static_cast<double>(bytes_));
      }
      FinishOnceLocked(grpc::Status::OK);
      return;
    }
    const int64_t count = std::min(chunk_, n - next_);
    EncodePullResponse(version_, total_steps_, range_.offset + next_, count,
                       dtype_, values_, next_, &resp_);
    next_ += std::max<int64_t>(count, 1);
    bytes_ += count * (dtype_ == v1::BFLOAT16 ? 2 : 4);
    StartWriteLocked(&resp_);
  }

  DataPlaneMetrics* metrics_;  // borrowed; may be null
  const absl::Time started_ = absl::Now();
  absl::Duration waited_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  Range range_;
  std::shared_ptr<ParameterShard> shard_;
  int64_t chunk_ = kDefaultChunkElements;
  v1::DType dtype_ = v1::FLOAT32;
  std::shared_ptr<const std::vector<float>> weights_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Slice values_ ABSL_GUARDED_BY(mu_);  // over weights_
  grpc::ByteBuffer resp_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------- save --

// A range's state at one version, in pieces of at most 1 MiB.
class SaveReactor final
    : public EventWriteReactor<SaveReactor, v1::SaveRangeChunk> {
 public:
  SaveReactor(ShardHost* host, const v1::SaveRangeRequest* req)
      : weights_only_(req->weights_only()) {
    const int64_t wait_ms = std::clamp<int64_t>(req->max_wait_ms(), 0, 600000);
    host->SaveAt(req->job_id(), req->map_version(), req->version(),
                 absl::Now() + absl::Milliseconds(wait_ms),
                 WhileLive([](SaveReactor* r, absl::StatusOr<ShardState> s) {
                   r->Ready(std::move(s));
                 }));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (WriteDoneLocked(ok)) WriteNextLocked();
  }

 private:
  void Ready(absl::StatusOr<ShardState> s) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!s.ok()) {
      FinishOnceLocked(ToGrpc(s.status()));
      return;
    }
    state_ = *std::move(s);
    parts_.push_back(state_.weights->data());
    sizes_.push_back(state_.weights->size());
    if (!weights_only_) {
      for (const auto& slot : state_.optimizer.slots) {
        parts_.push_back(slot.data());
        sizes_.push_back(slot.size());
      }
    }
    v1::RangeState* rs = msg_.mutable_state();
    rs->set_version(state_.metrics.version);
    rs->set_optimizer_step(state_.optimizer.step);
    rs->set_samples(state_.metrics.samples);
    rs->set_rejected_pushes(state_.metrics.rejected_pushes);
    rs->set_loss(state_.metrics.loss);
    rs->set_accuracy(state_.metrics.accuracy);
    rs->set_train_seconds(state_.metrics.train_seconds);
    WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (part_ < parts_.size() && next_ >= sizes_[part_]) {
      ++part_;
      next_ = 0;
    }
    if (part_ >= parts_.size()) {
      FinishOnceLocked(grpc::Status::OK);
      return;
    }
    constexpr size_t kPiece = 262144;  // floats: 1 MiB
    const size_t n = std::min(kPiece, sizes_[part_] - next_);
    if (sent_any_) msg_.clear_state();
    msg_.set_part(static_cast<int32_t>(part_));
    msg_.set_data(reinterpret_cast<const char*>(parts_[part_] + next_), n * 4);
    next_ += n;
    sent_any_ = true;
    StartWriteLocked(&msg_);
  }

  const bool weights_only_;
  ShardState state_ ABSL_GUARDED_BY(mu_);
  std::vector<const float*> parts_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> sizes_ ABSL_GUARDED_BY(mu_);
  size_t part_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  v1::SaveRangeChunk msg_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------- install --

// Gathers a range's state from its pieces, then installs it. The pieces
// may not add up to more than the range's size says.
class InstallReactor final
    : public grpc::ServerReadReactor<v1::InstallRangeChunk> {
 public:
  explicit InstallReactor(ShardHost* host) : host_(host) { StartRead(&msg_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(ToGrpc(Install()));
      return;
    }
    if (absl::Status s = Add(); !s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    StartRead(&msg_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Add() {
    if (first_) {
      if (!msg_.has_request()) {
        return absl::InvalidArgumentError(
            "the first install message must carry the request");
      }
      req_ = std::move(*msg_.mutable_request());
      first_ = false;
      // The state's bytes come in the pieces.
      if (req_.has_state()) {
        req_.mutable_state()->clear_weights();
        req_.mutable_state()->clear_optimizer_slots();
      }
    }
    if (msg_.data().empty()) return absl::OkStatus();
    if (!req_.has_state() || msg_.part() < 0 || msg_.part() > 16) {
      return absl::InvalidArgumentError("a piece of no state");
    }
    v1::RangeState* st = req_.mutable_state();
    std::string* part = nullptr;
    if (msg_.part() == 0) {
      part = st->mutable_weights();
    } else {
      while (st->optimizer_slots_size() < msg_.part())
        st->add_optimizer_slots();
      part = st->mutable_optimizer_slots(msg_.part() - 1);
    }
    if (req_.count() <= 0 || part->size() + msg_.data().size() >
                                 static_cast<size_t>(req_.count()) * 4) {
      return absl::InvalidArgumentError(
          "the state's pieces are larger than the range");
    }
    part->append(msg_.data());
    return absl::OkStatus();
  }
  absl::Status Install() {
    if (first_) return absl::InvalidArgumentError("an empty install stream");
    return host_->Install(req_);
  }

  ShardHost* host_;  // borrowed
  v1::InstallRangeChunk msg_;
  v1::InstallRangeRequest req_;
  bool first_ = true;
};

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* ParameterServiceImpl::PushGradients(
    grpc::CallbackServerContext*, grpc::ByteBuffer* resp) {
  return new PushReactor(host_, metrics_, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ParameterServiceImpl::PullWeights(
    grpc::CallbackServerContext*, const grpc::ByteBuffer* req) {
  return new PullReactor(host_, metrics_, req);
}

grpc::ServerReadReactor<v1::InstallRangeChunk>* ShardServiceImpl::InstallRange(
    grpc::CallbackServerContext*, v1::InstallRangeResponse*) {
  return new InstallReactor(host_);
}

grpc::ServerUnaryReactor* ShardServiceImpl::HoldRange(
    grpc::CallbackServerContext* ctx, const v1::HoldRangeRequest* req,
    v1::HoldRangeResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  absl::StatusOr<HoldReport> r = host_->Hold(
      req->job_id(), req->map_version(), req->hold_id(),
      absl::Milliseconds(std::clamp<int64_t>(req->hold_ms(), 0, 60000)));
  if (!r.ok()) return Reply(ctx, r.status());
  resp->set_version(r->version);
  for (const MemberProgress& m : r->members) {
    v1::MemberProgress* p = resp->add_members();
    p->set_worker_id(m.worker_id);
    p->set_incarnation(m.incarnation);
    p->set_pushed_step(m.pushed_step);
    p->set_committed_step(m.committed_step);
    p->set_last_refused(m.last_refused);
  }
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ShardServiceImpl::SetRangeMembers(
    grpc::CallbackServerContext* ctx, const v1::SetRangeMembersRequest* req,
    v1::SetRangeMembersResponse*) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  std::vector<MemberSpec> members;
  for (const v1::MemberSpec& m : req->members())
    members.push_back(FromProto(m));
  return Reply(ctx, host_->SetMembers(req->job_id(), req->map_version(),
                                      members, req->hold_id()));
}

grpc::ServerUnaryReactor* ShardServiceImpl::RetireRange(
    grpc::CallbackServerContext* ctx, const v1::RetireRangeRequest* req,
    v1::RetireRangeResponse*) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  return Reply(ctx, host_->Retire(req->job_id(), req->map_version()));
}

grpc::ServerWriteReactor<v1::SaveRangeChunk>* ShardServiceImpl::SaveRange(
    grpc::CallbackServerContext*, const v1::SaveRangeRequest* req) {
  return new SaveReactor(host_, req);
}

}  // namespace tally
