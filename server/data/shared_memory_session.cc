#include "server/data/shared_memory_session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tally {

SharedMemorySession::~SharedMemorySession() { Release(); }

void SharedMemorySession::Release() {
  if (region_ == nullptr) return;
  region_.reset();  // unmapped before it stops counting
  host_->ReleaseSharedRegion(owner_, count_);
}

bool SharedMemorySession::Offer(const v1::PullRequest& req, absl::Time now,
                                v1::ExchangeResponse* offer) {
  if (!req.offer_shared_memory() || state_ != State::kNotAsked) return false;
  state_ = State::kNotOffered;  // offered once a stream, at most
  if (!colocated_) return false;
  absl::StatusOr<Range> range = host_->Find(req.job_id(), req.map_version());
  const std::string owner = absl::StrCat(req.job_id(), "\n", req.worker_id());
  if (!range.ok() ||
      !range->shard->CheckMember(req.worker_id(), req.incarnation()).ok() ||
      !host_->ReserveSharedRegion(owner, range->count)) {
    return false;
  }
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create(range->count * 4, range->count * 4);
  if (!region.ok()) {
    host_->ReleaseSharedRegion(owner, range->count);
    return false;
  }
  region_ = *std::move(region);
  owner_ = owner;
  count_ = range->count;
  offered_at_ = now;
  state_ = State::kOffered;
  *offer->mutable_shared() = region_->Offer();
  return true;
}

absl::Status SharedMemorySession::Reply(const v1::SharedMemoryReply& reply) {
  switch (state_) {
    case State::kNotAsked:
      return absl::InvalidArgumentError("a SharedMemoryReply to no offer");
    case State::kMapped:
    case State::kDeclined:
      return absl::InvalidArgumentError("a second SharedMemoryReply");
    case State::kNotOffered:
      state_ = State::kDeclined;
      return absl::OkStatus();
    case State::kOffered:
      break;
  }
  if (reply.mapped()) {
    region_->CloseDescriptor();  // the worker's mapping holds it now
    state_ = State::kMapped;
  } else {
    Release();  // nothing used it
    state_ = State::kDeclined;
  }
  return absl::OkStatus();
}

void SharedMemorySession::CloseIfUnanswered(absl::Time now) {
  if (state_ == State::kOffered &&
      now - offered_at_ > host_->waits().offer_answer) {
    region_->CloseDescriptor();
  }
}

absl::Status SharedMemorySession::UsePushChunk(WireMessage* msg) {
  const WireChunk& c = msg->chunk();
  if (state_ != State::kMapped) {
    return absl::InvalidArgumentError(
        "a chunk in shared memory on a stream with no region mapped");
  }
  if (c.data_size != 0) {
    return absl::InvalidArgumentError(
        "a chunk with values both in data and in shared memory");
  }
  TALLY_ASSIGN_OR_RETURN(const int width, DTypeWidth(c.dtype));
  const char* at =
      region_->Values(SharedRegion::kPush, c.shared_offset, c.count, width);
  if (at == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a chunk's ", c.count, " values at byte ", c.shared_offset,
        " are outside the shared region's part for pushes [",
        region_->push_at(), ", ", region_->pull_at(), ")"));
  }
  msg->UseData(at, c.count * width);
  host_->CountShared(c.count * width, 0);
  return absl::OkStatus();
}

absl::StatusOr<SharedRegion*> SharedMemorySession::PullRegion() const {
  if (state_ != State::kMapped) {
    return absl::InvalidArgumentError(
        "a pull into shared memory on a stream with no region mapped");
  }
  return region_.get();
}

}  // namespace tally
