#include "worker/param_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bfloat16.h"
#include "proto/errors.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"

namespace tally {

// ----------------------------------------------------------------- Work --

Work::Work(int parts) : pending_(parts), results_(parts) {}

Work::~Work() = default;

void Work::Started(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  live_.push_back(ctx);
  if (cancelled_) ctx->TryCancel();
}

void Work::Finished(int part, grpc::ClientContext* ctx,
                    const absl::Status& status, int64_t version,
                    bool cancel_others, bool committed) {
  absl::MutexLock lock(&mu_);
  live_.erase(std::find(live_.begin(), live_.end(), ctx));
  results_[part] = status;
  if (status.ok() && committed) ++committed_;
  if (!status.ok()) {
    if (status_.ok()) {
      status_ = status;
      if (cancel_others) {
        for (grpc::ClientContext* c : live_) c->TryCancel();
      }
    }
  } else if (version_ < 0) {
    version_ = version;
  } else if (version_ != version) {
    mixed_versions_ = true;
    version_ = std::min(version_, version);
  }
  --pending_;
}

void Work::Lend() {
  absl::MutexLock lock(&lent_mu_);
  ++lent_;
}

void Work::Returned() {
  absl::MutexLock lock(&lent_mu_);
  --lent_;
}

absl::Status Work::Wait(absl::Time deadline) {
  {
    absl::MutexLock lock(&lent_mu_);
    auto returned = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lent_mu_) {
      return lent_ == 0;
    };
    if (!lent_mu_.AwaitWithDeadline(absl::Condition(&returned), deadline)) {
      return absl::DeadlineExceededError(
          "gRPC did not let go of the pushed gradient in time");
    }
  }
  absl::MutexLock lock(&mu_);
  auto done = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError("the shards did not answer in time");
  }
  if (!status_.ok()) return status_;
  if (mixed_versions_ && !mixed_ok_) {
    return absl::AbortedError(
        "the shards answered different versions: pull again");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Work::WaitVersion(absl::Time deadline) {
  if (absl::Status s = Wait(deadline); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return version_;
}

void Work::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : live_) c->TryCancel();
}

bool Work::Done() const {
  {
    absl::MutexLock lock(&lent_mu_);
    if (lent_ != 0) return false;
  }
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

std::vector<absl::Status> Work::Results() const {
  absl::MutexLock lock(&mu_);
  return results_;
}

bool Work::Committed() const {
  absl::MutexLock lock(&mu_);
  return pending_ == 0 && committed_ == static_cast<int>(results_.size());
}

// ------------------------------------------------------------ the calls --

namespace {

constexpr char kPushMethod[] = "/tally.v1.ParameterService/PushGradients";
constexpr char kPullMethod[] = "/tally.v1.ParameterService/PullWeights";

grpc::ByteBuffer Serialized(const google::protobuf::Message& m) {
  grpc::Slice slice(m.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// One shard's part of a push: the header, then the shard's range in chunks,
// each written when the previous one is on its way. Float32 values are not
// copied: each message's data is a slice of the caller's gradient. Ranges
// are sent as they are offered (all at once, or through a PushFeed as the
// backward pass produces them); a fed call holds itself open (AddHold)
// until its feed has offered its whole range or closed.
class PushCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushCall(std::shared_ptr<Work> work, int part,
           std::shared_ptr<ParameterClient::InFlight> in_flight,
           ParameterClient::RawStub* stub, const ParamClientOptions& o,
           const PushInfo& info, bool commit, const float* grads,
           int64_t offset, int64_t count, bool fed)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        grads_(grads),
        offset_(offset),
        total_(info.samples == 0 ? 0 : count),
        chunk_(std::max<int64_t>(1, o.chunk_elements)),
        dtype_(o.dtype) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + o.rpc_timeout));
    header_.set_job_id(o.job_id);
    header_.set_worker_id(o.worker_id);
    header_.set_incarnation(o.incarnation);
    header_.set_step(info.step);
    header_.set_base_version(info.base_version >= 0 ? info.base_version
                                                    : info.step);
    header_.set_samples(info.samples);
    header_.set_loss_sum(info.loss_sum);
    header_.set_correct(info.correct);
    header_.set_commit(commit);
    if (total_ > 0 && dtype_ == v1::BFLOAT16) {
      // Encoded as offered, into one buffer; the messages are slices of it.
      auto encoded = std::make_shared<std::vector<uint16_t>>(total_);
      encoded_ = reinterpret_cast<char*>(encoded->data());
      values_ = SnapshotSlice(std::move(encoded));
    } else if (total_ > 0) {
      values_ =
          LendSlice(work_, in_flight_, grads + offset, sizeof(float) * total_);
    }
    work_->Started(&ctx_);
    stub->PrepareBidiStreamingCall(&ctx_, kPushMethod, grpc::StubOptions(),
                                   this);
    fed_ = fed && total_ > 0;
    if (fed_) {
      AddHold();  // released by the feed (Release)
    } else {
      if (total_ > 0) Queue(offset_, offset_ + total_);
      absl::MutexLock lock(&mu_);
      PrepareLocked();  // the header (and the first chunk, if any)
    }
    if (!fed_) StartWrite(&msg_);
    StartRead(&resp_bytes_);
    StartCall();
  }

  int64_t begin() const { return offset_; }
  int64_t end() const { return offset_ + total_; }

  // grads[b, e) (within this part's range) is final: sends it. Called by
  // the feed while this call is held.
  void Offer(int64_t b, int64_t e) {
    Queue(b, e);
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (!writing_) write = PrepareLocked();
    }
    if (write) StartWrite(&msg_);
  }
  // The feed's last word to this call: it lets the call end (cancelled
  // first unless the whole range was offered). The call may be gone when
  // this returns.
  void Release(bool complete) {
    if (!complete) ctx_.TryCancel();
    RemoveHold();
  }

  void OnWriteDone(bool ok) override {
    // A failed write ends the call; OnDone reports why.
    if (!ok) return;
    bool write = false, last = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ready_.empty()) {
        write = PrepareLocked();
      } else if (queued_ == total_) {
        last = true;
        msg_.Clear();
        values_ = grpc::Slice();
      }
    }
    if (write) StartWrite(&msg_);
    if (last) StartWritesDone();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // no response: the status says why
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (resp_bytes_.Dump(&slices).ok()) {
      for (const grpc::Slice& sl : slices)
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    if (!resp_.ParseFromString(bytes)) {
      error_ = absl::DataLossError("malformed push response from the shard");
    }
    answered_ = true;
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status s = FromGrpc(status);
    if (s.ok() && !error_.ok()) s = error_;
    if (s.ok() && !answered_) {
      s = absl::DataLossError("the shard ended the push without an answer");
    }
    work_->Finished(part_, &ctx_, s, resp_.version(),
                    /*cancel_others=*/false, resp_.committed());
    std::shared_ptr<ParameterClient::InFlight> in_flight =
        std::move(in_flight_);
    delete this;  // lets go of the lent slices: the work may end now
    in_flight->Done();
  }

 private:
  // A slice over `n` bytes of the caller's buffer at `p`, lent to gRPC:
  // `work` is not done, and the client not destroyed, until gRPC has let
  // go of it.
  struct Loan {
    std::shared_ptr<Work> work;
    std::shared_ptr<ParameterClient::InFlight> in_flight;
  };
  static grpc::Slice LendSlice(
      std::shared_ptr<Work> work,
      std::shared_ptr<ParameterClient::InFlight> in_flight, const void* p,
      size_t n) {
    auto* loan = new Loan{std::move(work), std::move(in_flight)};
    loan->work->Lend();
    loan->in_flight->Add();
    return grpc::Slice(
        const_cast<void*>(p), n,
        [](void* u) {
          auto* l = static_cast<Loan*>(u);
          l->work->Returned();
          std::shared_ptr<ParameterClient::InFlight> in_flight =
              std::move(l->in_flight);
          delete l;
          in_flight->Done();
        },
        loan);
  }

  // Readies [b, e) for sending (bfloat16: encodes it; its part of the
  // buffer is this caller's alone until queued).
  void Queue(int64_t b, int64_t e) {
    if (e <= b) return;
    if (dtype_ == v1::BFLOAT16) {
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

  // Encodes the next message into msg_ (the header goes with the first):
  // true when there is one to write; the caller then writes it, after
  // unlocking (a write may complete, and OnWriteDone run, inside it).
  // Like DDP's gradient buckets, a message waits until a whole chunk is
  // ready or the range is complete: small layers go together, and a model
  // smaller than a chunk goes in one message, as without a feed.
  bool PrepareLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
    } else if (!first) {
      return false;  // the header alone, sent
    }
    EncodePushRequest(first ? &header_ : nullptr, at, n, dtype_, values_,
                      at - offset_, &msg_);
    header_sent_ = true;
    writing_ = true;
    return true;
  }

  std::shared_ptr<Work> work_;
  std::shared_ptr<ParameterClient::InFlight> in_flight_;
  const int part_;
  const float* grads_;  // borrowed: the whole flat gradient
  const int64_t offset_;
  const int64_t total_;  // elements to send: the range, or 0 (header only)
  const int64_t chunk_;
  const v1::DType dtype_;
  bool fed_ = false;
  grpc::ClientContext ctx_;
  v1::PushHeader header_;
  grpc::Slice values_;       // the range's values, in the wire dtype
  char* encoded_ = nullptr;  // bfloat16: the buffer values_ holds
  absl::Mutex mu_;
  std::deque<std::pair<int64_t, int64_t>> ready_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool header_sent_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer msg_;  // written by one writer at a time (writing_)
  grpc::ByteBuffer resp_bytes_;
  v1::PushResponse resp_;
  bool answered_ = false;
  absl::Status error_;
};

// ------------------------------------------------------------- PushFeed --

PushFeed::~PushFeed() { Close(); }

void PushFeed::Offer(int64_t begin, int64_t end) {
  absl::MutexLock lock(&mu_);
  for (Part& p : parts_) {
    const int64_t b = std::max(begin, p.begin), e = std::min(end, p.end);
    if (p.remaining <= 0 || e <= b) continue;
    p.call->Offer(b, e);
    p.remaining -= e - b;
    if (p.remaining <= 0) p.call->Release(/*complete=*/true);
  }
}

void PushFeed::Close() {
  absl::MutexLock lock(&mu_);
  for (Part& p : parts_) {
    if (p.remaining > 0) p.call->Release(/*complete=*/false);
    p.remaining = 0;
  }
}

// One shard's part of a pull: chunks of its range, each checked to lie in
// that range and its values decoded from gRPC's slices straight into the
// flat vector.
class PullCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PullCall(std::shared_ptr<Work> work, int part,
           std::shared_ptr<ParameterClient::InFlight> in_flight,
           ParameterClient::RawStub* stub, const ParamClientOptions& o,
           int64_t min_version, const v1::StepCommit* commit, int64_t clock,
           float* params, int64_t num_params, int64_t offset, int64_t count)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        params_(params),
        num_params_(num_params),
        offset_(offset),
        count_(count) {
    ctx_.set_deadline(
        absl::ToChronoTime(absl::Now() + o.pull_wait + o.rpc_timeout));
    v1::PullRequest req;
    req.set_job_id(o.job_id);
    req.set_worker_id(o.worker_id);
    req.set_incarnation(o.incarnation);
    req.set_min_version(min_version);
    req.set_max_wait_ms(absl::ToInt64Milliseconds(o.pull_wait));
    req.set_total_steps(o.total_steps);
    req.set_steps_per_epoch(o.steps_per_epoch);
    req.set_dtype(o.dtype);
    if (commit != nullptr) *req.mutable_commit() = *commit;
    if (clock >= 0) req.set_clock(clock);
    req_bytes_ = Serialized(req);
    work_->Started(&ctx_);
    stub->PrepareBidiStreamingCall(&ctx_, kPullMethod, grpc::StubOptions(),
                                   this);
    StartWriteLast(&req_bytes_, grpc::WriteOptions());
    StartRead(&resp_bytes_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    // PullResponse: 1 version, 2 total_steps, 3 chunk.
    absl::Status bad = msg_.Parse(resp_bytes_, 3);
    const WireChunk& c = msg_.chunk();
    if (bad.ok()) {
      bad = CheckChunkFields(c.offset, c.count, c.dtype, c.data_size,
                             num_params_);
    }
    if (bad.ok() &&
        (c.offset < offset_ || c.offset + c.count > offset_ + count_)) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "chunk [", c.offset, ", +", c.count, ") is outside the shard's [",
          offset_, ", +", count_, ")"));
    }
    const int64_t version = msg_.varint(1);
    if (bad.ok() && version_ >= 0 && version != version_) {
      bad = absl::InvalidArgumentError("the version changed within a pull");
    }
    if (!bad.ok()) {
      error_ = absl::DataLossError(
          absl::StrCat("malformed weights from the shard: ", bad.message()));
      ctx_.TryCancel();
      return;
    }
    float* dst = params_ + c.offset;
    if (c.dtype == v1::BFLOAT16) {
      msg_.ForEachValues(2, [dst](const char* src, int64_t n, int64_t first) {
        Bfloat16ToFloat(src, dst + first, n);
      });
    } else {
      msg_.ForEachValues(4, [dst](const char* src, int64_t n, int64_t first) {
        std::memcpy(dst + first, src, 4 * n);
      });
    }
    received_ += c.count;
    version_ = version;
    StartRead(&resp_bytes_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status s = !error_.ok() ? error_ : FromGrpc(status);
    if (s.ok() && received_ != count_) {
      s = absl::DataLossError(absl::StrCat("pulled ", received_, " of the ",
                                           count_, " weights of a shard"));
    }
    work_->Finished(part_, &ctx_, s, version_, /*cancel_others=*/true);
    std::shared_ptr<ParameterClient::InFlight> in_flight =
        std::move(in_flight_);
    delete this;
    in_flight->Done();
  }

 private:
  std::shared_ptr<Work> work_;
  std::shared_ptr<ParameterClient::InFlight> in_flight_;
  const int part_;
  float* params_;  // borrowed: the whole flat vector
  const int64_t num_params_, offset_, count_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_bytes_;
  grpc::ByteBuffer resp_bytes_;
  WireMessage msg_;
  absl::Status error_;
  int64_t received_ = 0;
  int64_t version_ = -1;
};

// ------------------------------------------------------ ParameterClient --

absl::StatusOr<std::unique_ptr<ParameterClient>> ParameterClient::Create(
    const v1::ShardMap& map, int64_t num_params, const std::string& coordinator,
    const ParamClientOptions& options) {
  if (map.shards().empty()) {
    return absl::InvalidArgumentError("the shard map has no shards");
  }
  std::unique_ptr<ParameterClient> client(
      new ParameterClient(num_params, options));
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
    s.address = e.address().empty() ? coordinator : e.address();
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
  absl::MutexLock lock(&in_flight_->mu);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_flight_->mu) {
    return in_flight_->calls == 0;
  };
  // Every call has a deadline, so this ends; the bound is for a stuck library.
  in_flight_->mu.AwaitWithTimeout(absl::Condition(&idle), absl::Minutes(5));
}

std::shared_ptr<Work> ParameterClient::Pull(int64_t min_version, float* params,
                                            const v1::StepCommit* commit,
                                            int64_t clock) {
  std::shared_ptr<Work> work(new Work(num_shards()));
  work->mixed_ok_ = options_.mixed_versions;
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    in_flight_->Add();
    new PullCall(work, i, in_flight_, s.stub.get(), options_, min_version,
                 commit, clock, params, num_params_, s.offset, s.count);
  }
  return work;
}

std::shared_ptr<Work> ParameterClient::Push(const PushInfo& info,
                                            const float* grads,
                                            std::unique_ptr<PushFeed>* feed) {
  std::shared_ptr<Work> work(new Work(num_shards()));
  const bool commit = info.commit && num_shards() == 1;
  std::vector<PushFeed::Part> parts;
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    in_flight_->Add();
    auto* call = new PushCall(work, i, in_flight_, s.stub.get(), options_,
                              info, commit, grads, s.offset, s.count,
                              feed != nullptr);
    // A call with nothing to send (the header alone) holds nothing.
    if (feed != nullptr && call->end() > call->begin()) {
      parts.push_back(
          {call, call->begin(), call->end(), call->end() - call->begin()});
    }
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
