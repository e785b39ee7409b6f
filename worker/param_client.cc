#include "worker/param_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/shared_memory.h"
#include "proto/transport.h"
#include "worker/internal/codec.h"
#include "worker/internal/exchange_stream.h"
#include "worker/internal/shard_work.h"
#include "worker/internal/unary_calls.h"

namespace tally {

using internal::PullOp;
using internal::PushOp;
using internal::ShardStream;
using internal::ShardStreamSlot;

// ------------------------------------------------------------- PushFeed --

PushFeed::~PushFeed() { Close(); }

void PushFeed::Offer(int64_t begin, int64_t end) {
  absl::MutexLock lock(&mu_);
  for (Part& p : parts_) {
    const int64_t b = std::max(begin, p.begin), e = std::min(end, p.end);
    if (p.remaining <= 0 || e <= b) continue;
    p.part->Offer(b, e);
    p.remaining -= e - b;
    if (p.remaining <= 0) {
      p.part->Release(/*complete=*/true);
      p.keep = nullptr;
    }
  }
}

void PushFeed::Close() {
  absl::MutexLock lock(&mu_);
  for (Part& p : parts_) {
    if (p.remaining > 0) p.part->Release(/*complete=*/false);
    p.remaining = 0;
    p.keep = nullptr;  // a part that failed lets go of the gradient
  }
}

// ------------------------------------------------------ ParameterClient --

absl::StatusOr<std::unique_ptr<ParameterClient>> ParameterClient::Create(
    const v1::ShardMap& map, int64_t num_params, const std::string& coordinator,
    const ParamClientOptions& options) {
  if (map.shards().empty()) {
    return absl::InvalidArgumentError("the shard map has no shards");
  }
  ParamClientOptions placed = options;
  placed.map_version = map.version();
  std::unique_ptr<ParameterClient> client(
      new ParameterClient(num_params, placed));
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels;
  int64_t expect = 0;
  for (const v1::ShardMap::Entry& e : map.shards()) {
    if (e.offset() != expect || e.count() <= 0 ||
        e.count() > num_params - expect) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shard map does not cover the ", num_params,
                       " parameters once, in order: entry [", e.offset(), ", +",
                       e.count(), ") after ", expect));
    }
    expect += e.count();
    Shard s;
    s.address = ResolveShardAddress(coordinator, e.address());
    s.offset = e.offset();
    s.count = e.count();
    std::shared_ptr<grpc::Channel>& ch = channels[s.address];
    if (ch == nullptr) ch = Dial(s.address, options.transport);
    s.stub = std::make_unique<RawStub>(ch);
    client->shards_.push_back(std::move(s));
  }
  if (expect != num_params) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shard map covers ", expect, " of ", num_params, " parameters"));
  }
  return client;
}

ParameterClient::ParameterClient(int64_t num_params,
                                 const ParamClientOptions& options)
    : num_params_(num_params),
      options_(options),
      in_flight_(std::make_shared<InFlight>()) {}

ParameterClient::~ParameterClient() {
  {
    absl::MutexLock lock(&streams_mu_);
    for (Shard& s : shards_) {
      if (s.slot != nullptr) Retire(s.slot);
      s.slot = nullptr;
    }
  }
  absl::MutexLock lock(&in_flight_->mu);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_flight_->mu) {
    return in_flight_->calls == 0;
  };
  // Every call has a deadline, so this ends; the bound is for a stuck library.
  in_flight_->mu.AwaitWithTimeout(absl::Condition(&idle),
                                  options_.close_wait);
}

void ParameterClient::Retire(const std::shared_ptr<ShardStreamSlot>& slot) {
  // What was asked on it is still answered; then the shard ends it.
  if (ShardStream* st = slot->Use()) {
    st->CloseWrites();
    slot->Unuse();
  }
  slot->Shut();
}

ShardStream* ParameterClient::UseStream(
    Shard& s, std::shared_ptr<ShardStreamSlot>* slot) {
  absl::MutexLock lock(&streams_mu_);
  if (s.slot != nullptr) {
    // A stream lives for a bounded time (its deadline): an old one is
    // retired before that, between exchanges, and a new one opened.
    ShardStream* st = s.slot->Use();
    // An old stream is retired, unless an op on it is still being written
    // (a push being fed): the new op queues behind it.
    if (st != nullptr &&
        (absl::Now() - s.slot->opened <= options_.stream_lifetime / 2 ||
         st->writing())) {
      *slot = s.slot;
      return st;
    }
    if (st != nullptr) {
      s.slot->Unuse();
      Retire(s.slot);
    }
    s.slot = nullptr;  // over: a new one
  }
  s.slot = std::make_shared<ShardStreamSlot>();
  in_flight_->Add();
  new ShardStream(s.stub.get(), in_flight_, options_.stream_lifetime, s.slot,
                  options_.shared_memory);
  *slot = s.slot;
  return s.slot->Use();  // null if it ended at once: then the op fails
}

void ParameterClient::OnStream(Shard& s, internal::ShardWork* work, int part,
                               const MakeOp& make) {
  std::shared_ptr<ShardStreamSlot> slot;
  ShardStream* st = UseStream(s, &slot);
  if (st == nullptr) {
    work->Failed(part, absl::UnavailableError("the stream to the shard ended"));
    return;
  }
  work->Started(st->context());
  st->Add(make(st, slot));
  slot->Unuse();
}

std::shared_ptr<Work> ParameterClient::Pull(int64_t min_version, float* params,
                                            const v1::StepCommit* commit,
                                            int64_t clock,
                                            std::shared_ptr<std::string> buffers) {
  auto work = std::make_shared<internal::ShardWork>(num_shards(),
                                                    options_.mixed_versions);
  const v1::PullRequest req =
      internal::MakePullRequest(options_, min_version, commit, clock);
  for (int i = 0; i < num_shards(); ++i) {
    work->SetRange(i, shards_[i].offset, shards_[i].offset + shards_[i].count);
  }
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    std::shared_ptr<std::string> region = s.offset == 0 ? buffers : nullptr;
    if (!options_.exchange) {
      internal::StartPullCall(work, i, in_flight_, s.stub.get(), options_, req,
                              params, num_params_, s.offset, s.count, region);
      continue;
    }
    OnStream(s, work.get(), i,
             [&](ShardStream* st, const std::shared_ptr<ShardStreamSlot>&) {
               return std::make_shared<PullOp>(
                   work, i, req, params, num_params_, s.offset, s.count,
                   region, st->context(), st->TakeShared(SharedRegion::kPull, s.count),
                   st->AskOffer());
             });
  }
  return work;
}

std::shared_ptr<Work> ParameterClient::Push(const PushInfo& info,
                                            const float* grads,
                                            std::unique_ptr<PushFeed>* feed) {
  auto work = std::make_shared<internal::ShardWork>(num_shards());
  const bool commit = info.commit && num_shards() == 1;
  std::vector<PushFeed::Part> parts;
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    if (!options_.exchange) {
      // A call with nothing to send (the header alone) is fed nothing.
      if (internal::FedPart* call = internal::StartPushCall(
              work, i, in_flight_, s.stub.get(), options_, info, commit,
              grads, s.offset, s.count, feed != nullptr)) {
        parts.push_back(
            {call, nullptr, s.offset, s.offset + s.count, s.count});
      }
      continue;
    }
    OnStream(s, work.get(), i,
             [&](ShardStream* st, const std::shared_ptr<ShardStreamSlot>& slot) {
               auto op = std::make_shared<PushOp>(
                   work, i, in_flight_, options_, info, commit, grads,
                   s.offset, s.count, feed != nullptr, slot, st->context(),
                   st->TakeShared(SharedRegion::kPush, s.count));
               if (feed != nullptr && op->end() > op->begin()) {
                 parts.push_back({op.get(), op, op->begin(), op->end(),
                                  op->end() - op->begin()});
               }
               return op;
             });
  }
  if (feed != nullptr) {
    std::unique_ptr<PushFeed> f(new PushFeed);
    absl::MutexLock lock(&f->mu_);
    f->parts_ = std::move(parts);
    *feed = std::move(f);
  }
  return work;
}

}  // namespace tally
