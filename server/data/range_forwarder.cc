#include "server/data/range_forwarder.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "proto/errors.h"
#include "proto/tally.grpc.pb.h"
#include "server/data/shard.h"

namespace tally {

namespace {

constexpr size_t kPieceFloats = 262144;  // 1 MiB of float32 a message

std::atomic<int64_t> next_id{1};

}  // namespace

RangeForwarder::RangeForwarder(Options options,
                               std::weak_ptr<ParameterShard> shard)
    : options_(std::move(options)),
      id_(next_id.fetch_add(1)),
      shard_(std::move(shard)),
      thread_([this] { Loop(); }) {}

RangeForwarder::~RangeForwarder() {
  Stop();
  thread_.join();
}

void RangeForwarder::Send(ClosedStep step) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(step));
}

std::function<void(ClosedStep)> RangeForwarder::SendTo(
    const std::shared_ptr<RangeForwarder>& forwarder) {
  return [weak = std::weak_ptr<RangeForwarder>(forwarder)](ClosedStep step) {
    if (auto f = weak.lock(); f != nullptr) f->Send(std::move(step));
  };
}

void RangeForwarder::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  queue_.clear();
  if (call_ != nullptr) call_->TryCancel();
}

void RangeForwarder::Loop() {
  absl::Duration backoff = options_.min_backoff;
  while (true) {
    ClosedStep step;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      step = queue_.front();
    }
    absl::StatusOr<int64_t> version = SendOne(step);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (!version.ok()) {
        // Again after a backoff: the coordinator stops this forwarder if
        // the backup is gone for good.
        auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&stopped), backoff);
        backoff = std::min(backoff * 2, options_.max_backoff);
        continue;
      }
      backoff = options_.min_backoff;
      if (!queue_.empty() && queue_.front().step == step.step)
        queue_.pop_front();
    }
    if (auto shard = shard_.lock(); shard != nullptr)
      shard->Acknowledge(*version, id_);
  }
}

absl::StatusOr<int64_t> RangeForwarder::SendOne(const ClosedStep& step) {
  if (stub_ == nullptr) {
    stub_ = v1::ShardService::NewStub(
        Dial(options_.backup_address, options_.transport));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("stopped");
    call_ = &ctx;
  }
  v1::ApplyClosedStepsResponse resp;
  auto writer = stub_->ApplyClosedSteps(&ctx, &resp);
  v1::ClosedStepChunk chunk;
  v1::ClosedStepChunk::Header* h = chunk.mutable_header();
  h->set_job_id(options_.job_id);
  h->set_map_version(options_.map_version);
  h->set_step(step.step);
  h->set_samples(step.samples);
  h->set_loss_sum(step.loss_sum);
  h->set_correct(step.correct);
  if (step.buffers != nullptr) h->set_buffers(*step.buffers);
  bool ok = writer->Write(chunk);
  const size_t n = step.mean != nullptr ? step.mean->size() : 0;
  for (size_t at = 0; ok && at < n; at += kPieceFloats) {
    const size_t m = std::min(kPieceFloats, n - at);
    v1::ClosedStepChunk piece;
    piece.mutable_data()->assign(
        reinterpret_cast<const char*>(step.mean->data() + at),
        m * sizeof(float));
    ok = writer->Write(piece);
  }
  writer->WritesDone();
  const absl::Status st = FromGrpc(writer->Finish());
  {
    absl::MutexLock lock(&mu_);
    call_ = nullptr;
  }
  if (!st.ok()) return st;
  return resp.version();
}

}  // namespace tally
