#include "server/data/push_session.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "server/data/internal/finite.h"

namespace tally {

namespace {

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

}  // namespace

PushSession::PushSession(ShardHost* host, std::function<void()> wake)
    : host_(host), wake_(std::move(wake)) {}

PushSession::~PushSession() { Abort(); }

absl::Status PushSession::Take(const WireMessage& msg) {
  absl::Status s = Consume(msg);
  if (!s.ok()) Abort();
  return s;
}

absl::Status PushSession::Resume(const WireMessage& msg) {
  waiting_ = false;
  return AddBlocks(msg);
}

absl::StatusOr<v1::PushResponse> PushSession::Finish() {
  if (answered_) return resp_;
  if (!has_header_) return absl::InvalidArgumentError("empty push stream");
  if (meta_.samples > 0 && coverage_.covered() != shard_->num_params()) {
    Abort();
    return absl::InvalidArgumentError(
        absl::StrCat("the push covers ", coverage_.covered(), " of ",
                     shard_->num_params(), " gradient elements"));
  }
  bool duplicate = false;
  absl::Status s = streamed_
                       ? shard_->FinishStreamed(meta_, token_, &duplicate)
                       : shard_->Accept(meta_, std::move(staging_), &duplicate);
  resp_.set_duplicate(duplicate);
  if (s.ok()) CommitIfAsked();
  resp_.set_version(shard_->version());
  if (!s.ok()) return s;
  return resp_;
}

void PushSession::Abort() {
  if (shard_ != nullptr && staging_ != nullptr)
    shard_->ReleaseStaging(std::move(staging_));
}

absl::Status PushSession::Consume(const WireMessage& msg) {
  if (answered_) return absl::OkStatus();  // a duplicate's rest
  if (!has_header_) {
    if (!msg.has(1)) {
      return absl::InvalidArgumentError(
          "the first push message must carry the header");
    }
    v1::PushHeader h;
    if (!h.ParseFromString(msg.bytes(1))) {
      return absl::InvalidArgumentError("malformed push header");
    }
    TALLY_RETURN_IF_ERROR(Begin(h));
    if (answered_) return absl::OkStatus();
  } else if (msg.has(1)) {
    return absl::InvalidArgumentError(
        "only the first push message may carry a header");
  }
  return msg.has(2) ? AddChunk(msg) : absl::OkStatus();
}

absl::Status PushSession::Begin(const v1::PushHeader& h) {
  meta_.worker_id = h.worker_id();
  meta_.incarnation = h.incarnation();
  meta_.step = h.step();
  meta_.base_version = h.base_version();
  meta_.samples = h.samples();
  meta_.loss_sum = h.loss_sum();
  meta_.correct = h.correct();
  if (!h.buffers().empty())
    meta_.buffers = std::make_shared<const std::string>(h.buffers());
  self_commit_ = h.commit();
  has_header_ = true;
  // Of the placement the worker routed it by: another placement's range
  // may have rolled back past the step.
  TALLY_ASSIGN_OR_RETURN(range_, host_->Find(h.job_id(), h.map_version()));
  shard_ = range_.shard;
  bool duplicate = false;
  TALLY_RETURN_IF_ERROR(shard_->CheckPush(meta_, &duplicate));
  if (!std::isfinite(meta_.loss_sum)) {
    RejectAndCommit();
    return WithReason(absl::InvalidArgumentError(
                          "non-finite loss_sum; push rejected and counted"),
                      v1::NON_FINITE);
  }
  if (duplicate) {
    // Already counted: acknowledged without reading the rest.
    resp_.set_duplicate(true);
    CommitIfAsked();
    resp_.set_version(shard_->version());
    answered_ = true;
    return absl::OkStatus();
  }
  if (meta_.samples > 0 && shard_->StreamsPushes()) {
    TALLY_ASSIGN_OR_RETURN(token_, shard_->BeginStreamed(meta_));
    streamed_ = true;
  } else if (meta_.samples > 0) {
    TALLY_ASSIGN_OR_RETURN(staging_, shard_->AcquireStaging());
  }
  return absl::OkStatus();
}

absl::Status PushSession::AddChunk(const WireMessage& msg) {
  const WireChunk& c = msg.chunk();
  bytes_ += static_cast<double>(c.data_size);
  TALLY_RETURN_IF_ERROR(CheckRangeChunk(c, range_));
  if (meta_.samples == 0) return absl::OkStatus();  // nothing to add
  if (streamed_) {
    chunk_next_ = 0;
    block_from_ = -1;
    return AddBlocks(msg);
  }
  const int64_t local = c.offset - range_.offset;
  float* dst = staging_->data() + local;
  const bool bf16 = c.dtype == v1::BFLOAT16;
  int64_t bad = -1;
  msg.ForEachValues(
      bf16 ? 2 : 4, [&](const char* src, int64_t n, int64_t first) {
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

absl::Status PushSession::AddBlocks(const WireMessage& msg) {
  const WireChunk& c = msg.chunk();
  const int64_t local = c.offset - range_.offset;
  while (chunk_next_ < c.count) {
    if (block_from_ != chunk_next_) {
      const int64_t n = std::min(kBlock, c.count - chunk_next_);
      block_.resize(n);
      const int64_t bad = Decode(msg, chunk_next_, n, block_.data());
      if (bad >= 0) {
        RejectAndCommit();
        return WithReason(absl::InvalidArgumentError(absl::StrCat(
                              "non-finite gradient value (",
                              block_[bad - chunk_next_], ") at element ",
                              c.offset + bad, "; push rejected and counted")),
                          v1::NON_FINITE);
      }
      block_from_ = chunk_next_;
    }
    const int64_t n = static_cast<int64_t>(block_.size());
    absl::StatusOr<bool> added = shard_->AddStreamed(
        meta_, token_, local + block_from_, n, block_.data(), wake_);
    if (!added.ok()) return added.status();
    if (!*added) {
      waiting_ = true;
      return absl::OkStatus();
    }
    chunk_next_ += n;
  }
  coverage_.Add(local, local + c.count);
  return absl::OkStatus();
}

int64_t PushSession::Decode(const WireMessage& msg, int64_t from, int64_t n,
                            float* dst) {
  const bool bf16 = msg.chunk().dtype == v1::BFLOAT16;
  const int width = bf16 ? 2 : 4;
  int64_t bad = -1;
  msg.ForEachValues(width, [&](const char* src, int64_t count, int64_t first) {
    const int64_t b = std::max(first, from);
    const int64_t e = std::min(first + count, from + n);
    if (bad >= 0 || b >= e) return;
    const char* at = src + (b - first) * width;
    const int64_t k =
        bf16 ? internal::DecodeBfloat16AndFindNonFinite(dst + (b - from), at,
                                                        e - b)
             : internal::CopyAndFindNonFinite(dst + (b - from), at, e - b);
    if (k >= 0) bad = b + k;
  });
  return bad;
}

void PushSession::CommitIfAsked() {
  if (self_commit_) {
    resp_.set_committed(shard_->Commit(meta_.worker_id, meta_.incarnation,
                                       meta_.step, /*contributed=*/true));
  }
}

void PushSession::RejectAndCommit() {
  shard_->Reject(meta_);
  if (self_commit_) {
    shard_->Commit(meta_.worker_id, meta_.incarnation, meta_.step,
                   /*contributed=*/false);
  }
}

}  // namespace tally
