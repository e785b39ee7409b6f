#include "worker/internal/codec.h"

#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/bfloat16.h"
#include "worker/internal/shard_work.h"

namespace tally {
namespace internal {

namespace {

// A slice lent to gRPC: what must outlive it.
struct Loan {
  std::shared_ptr<ShardWork> work;
  std::shared_ptr<InFlightCalls> in_flight;
};

}  // namespace

const std::string& PushDone() {
  static const std::string* done = new std::string("\x18\x01", 2);
  return *done;
}

v1::PullRequest MakePullRequest(const ParamClientOptions& o,
                                int64_t min_version,
                                const v1::StepCommit* commit, int64_t clock) {
  v1::PullRequest req;
  req.set_job_id(o.job_id);
  req.set_worker_id(o.worker_id);
  req.set_incarnation(o.incarnation);
  req.set_map_version(o.map_version);
  req.set_min_version(min_version);
  req.set_max_wait_ms(absl::ToInt64Milliseconds(o.pull_wait));
  req.set_total_steps(o.total_steps);
  req.set_plan(o.plan);
  req.set_steps_per_epoch(o.steps_per_epoch);
  req.set_data_fingerprint(o.data_fingerprint);
  req.set_dtype(o.dtype);
  if (commit != nullptr) *req.mutable_commit() = *commit;
  if (clock >= 0) req.set_clock(clock);
  return req;
}

// ---------------------------------------------------------- the encoder --

PushMessages::PushMessages(const std::shared_ptr<ShardWork>& work,
                           const std::shared_ptr<InFlightCalls>& in_flight,
                           const ParamClientOptions& o, const PushInfo& info,
                           bool commit, const float* grads, int64_t offset,
                           int64_t count, std::string last_suffix,
                           std::shared_ptr<SharedRegion> shared)
    : grads_(grads),
      offset_(offset),
      total_(info.samples == 0 ? 0 : count),
      chunk_(std::max<int64_t>(1, o.chunk_elements)),
      dtype_(o.dtype),
      last_suffix_(std::move(last_suffix)),
      shared_(std::move(shared)) {
  header_.set_job_id(o.job_id);
  header_.set_worker_id(o.worker_id);
  header_.set_incarnation(o.incarnation);
  header_.set_map_version(o.map_version);
  header_.set_step(info.step);
  header_.set_base_version(info.base_version >= 0 ? info.base_version
                                                  : info.step);
  header_.set_samples(info.samples);
  header_.set_loss_sum(info.loss_sum);
  header_.set_correct(info.correct);
  header_.set_commit(commit);
  // The buffer region is the first range's.
  if (info.buffers != nullptr && offset == 0)
    header_.set_buffers(*info.buffers);
  if (shared_ != nullptr) {
    // The region's push part holds the range in float32 (ParameterShard
    // made it so): in either dtype it fits.
    shared_values_ = shared_->data() + shared_->push_at();
  } else if (total_ > 0 && dtype_ == v1::BFLOAT16) {
    // Encoded as offered, into one buffer; the messages are slices of it.
    // Kept here too: an offer may still encode into it after the push
    // failed and let go of its slices.
    encoded_holder_ = std::make_shared<std::vector<uint16_t>>(total_);
    encoded_ = reinterpret_cast<char*>(encoded_holder_->data());
    values_ = SnapshotSlice(encoded_holder_);
  } else if (total_ > 0) {
    values_ = Lend(work, in_flight, grads + offset, sizeof(float) * total_);
  }
}

void PushMessages::Queue(int64_t b, int64_t e) {
  if (e <= b) return;
  if (shared_values_ != nullptr) {
    char* dst = shared_values_ + width() * (b - offset_);
    if (dtype_ == v1::BFLOAT16) {
      FloatToBfloat16(grads_ + b, dst, e - b);
    } else {
      std::memcpy(dst, grads_ + b, sizeof(float) * (e - b));
    }
  } else if (dtype_ == v1::BFLOAT16) {
    FloatToBfloat16(grads_ + b, encoded_ + 2 * (b - offset_), e - b);
  }
  absl::MutexLock lock(&mu_);
  queued_ += e - b;
  // Adjacent ranges (the layers before and after) make one bucket.
  for (auto& r : ready_) {
    if (r.first == e) {
      r.first = b;
      return;
    }
    if (r.second == b) {
      r.second = e;
      return;
    }
  }
  ready_.push_back({b, e});
}

bool PushMessages::Next(grpc::ByteBuffer* out) {
  absl::MutexLock lock(&mu_);
  if (done_) return false;
  const bool first = !header_sent_;
  int64_t at = offset_, n = 0;
  if (total_ > 0) {
    auto it = std::find_if(ready_.begin(), ready_.end(), [&](const auto& r) {
      return r.second - r.first >= chunk_;
    });
    if (it == ready_.end() && queued_ == total_ && !ready_.empty())
      it = ready_.begin();
    if (it == ready_.end()) return false;
    auto& [b, e] = *it;
    at = b;
    n = std::min(chunk_, e - b);
    b += n;
    if (b == e) ready_.erase(it);
  }
  done_ = queued_ == total_ && ready_.empty();
  if (shared_values_ != nullptr) {
    // PushRequest (ExchangeRequest's first fields): 1 header, 2 chunk.
    v1::PushRequest m;
    if (first) *m.mutable_header() = header_;
    if (n > 0) {
      v1::TensorChunk* c = m.mutable_chunk();
      c->set_offset(at);
      c->set_count(n);
      c->set_dtype(dtype_);
      c->set_shared_offset(shared_->push_at() + width() * (at - offset_));
    }
    grpc::Slice slice(m.SerializeAsString() +
                      (done_ ? last_suffix_ : std::string()));
    *out = grpc::ByteBuffer(&slice, 1);
    header_sent_ = true;
    return true;
  }
  EncodePushRequest(first ? &header_ : nullptr, at, n, dtype_, values_,
                    at - offset_, out, done_ ? last_suffix_ : std::string());
  header_sent_ = true;
  if (done_) values_ = grpc::Slice();  // the messages hold what they need
  return true;
}

void PushMessages::Drop() {
  absl::MutexLock lock(&mu_);
  done_ = true;
  ready_.clear();
  values_ = grpc::Slice();
}

bool PushMessages::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

grpc::Slice PushMessages::Lend(std::shared_ptr<ShardWork> work,
                               std::shared_ptr<InFlightCalls> in_flight,
                               const void* p, size_t n) {
  auto* loan = new Loan{std::move(work), std::move(in_flight)};
  loan->work->Lend();
  loan->in_flight->Add();
  return grpc::Slice(
      const_cast<void*>(p), n,
      [](void* u) {
        auto* l = static_cast<Loan*>(u);
        l->work->Returned();
        std::shared_ptr<InFlightCalls> in_flight = std::move(l->in_flight);
        delete l;
        in_flight->Done();
      },
      loan);
}

// ---------------------------------------------------------- the decoder --

absl::Status PullDecoder::Take(const WireMessage& msg) {
  const WireChunk& c = msg.chunk();
  absl::Status bad = CheckChunkFields(c.offset, c.count, c.dtype,
                                      c.data_size, num_params_);
  if (bad.ok() &&
      (c.offset < offset_ || c.offset + c.count > offset_ + count_)) {
    bad = absl::InvalidArgumentError(absl::StrCat(
        "chunk [", c.offset, ", +", c.count, ") is outside the shard's [",
        offset_, ", +", count_, ")"));
  }
  const int64_t version = msg.varint(1);
  if (bad.ok() && version_ >= 0 && version != version_) {
    bad = absl::InvalidArgumentError("the version changed within a pull");
  }
  if (!bad.ok()) {
    return absl::DataLossError(
        absl::StrCat("malformed weights from the shard: ", bad.message()));
  }
  // PullResponse (and ExchangeResponse): 6 buffers.
  if (buffers_ != nullptr && msg.has(6)) *buffers_ = msg.bytes(6);
  float* dst = params_ + c.offset;
  if (c.dtype == v1::BFLOAT16) {
    msg.ForEachValues(2, [dst](const char* src, int64_t n, int64_t first) {
      Bfloat16ToFloat(src, dst + first, n);
    });
  } else {
    msg.ForEachValues(4, [dst](const char* src, int64_t n, int64_t first) {
      std::memcpy(dst + first, src, 4 * n);
    });
  }
  received_ += c.count;
  version_ = version;
  if (c.offset == contiguous_) contiguous_ += c.count;
  return absl::OkStatus();
}

absl::Status PullDecoder::Result() const {
  if (received_ == count_) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("pulled ", received_, " of the ",
                                          count_, " weights of a shard"));
}

}  // namespace internal
}  // namespace tally
