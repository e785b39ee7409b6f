#include "worker/internal/shared_memory.h"

#include <string>
#include <utility>

#include "proto/tally.pb.h"

namespace tally {
namespace internal {

bool StreamSharing::Ask() {
  if (state_ != State::kNotAsked) return false;
  state_ = State::kAsked;
  return true;
}

absl::Status StreamSharing::Offered() {
  if (state_ != State::kAsked) {
    return absl::DataLossError("a shared memory offer nobody asked for");
  }
  state_ = State::kAnswered;
  return absl::OkStatus();
}

void StreamSharing::Answer(
    absl::StatusOr<std::unique_ptr<SharedRegion>> mapped) {
  v1::SharedMemoryReply reply;
  std::shared_ptr<SharedRegion> region;
  if (mapped.ok()) {
    region = *std::move(mapped);
    reply.set_mapped(true);
  } else {
    reply.set_error(std::string(mapped.status().message()));
  }
  // ExchangeRequest: 5 shared.
  grpc::Slice slice(LengthDelimitedField(5, reply.SerializeAsString()));
  region_ = std::move(region);
  reply_ = grpc::ByteBuffer(&slice, 1);
  reply_pending_ = true;
}

bool StreamSharing::TakeReply(grpc::ByteBuffer* out) {
  if (!reply_pending_) return false;
  reply_pending_ = false;
  *out = std::move(reply_);
  return true;
}

std::unique_ptr<SharedPart> StreamSharing::Take(SharedRegion::Part part,
                                                int64_t values) {
  if (region_ == nullptr || region_->part_bytes(part) / 4 < values ||
      !region_->TryTake(part)) {
    return nullptr;
  }
  return std::make_unique<SharedPart>(region_, part);
}

absl::Status UseSharedPull(const SharedRegion* region, WireMessage* in) {
  const WireChunk& c = in->chunk();
  absl::StatusOr<int> width = DTypeWidth(c.dtype);
  const char* at = region != nullptr && width.ok() && c.data_size == 0
                       ? region->Values(SharedRegion::kPull, c.shared_offset,
                                        c.count, *width)
                       : nullptr;
  if (at == nullptr) {
    return absl::DataLossError(
        "weights in shared memory outside the stream's region");
  }
  in->UseData(at, c.count * *width);
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace tally
