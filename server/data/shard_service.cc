#include "server/data/shard_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/shared_memory.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"
#include "server/data/push_session.h"
#include "server/data/shared_memory_session.h"
#include "server/internal/event_reactor.h"

namespace tally {

namespace {

using internal::EventWriteReactor;

// Whether a call's peer (grpc::ServerContext::peer) reached this process
// over loopback or a Unix socket: only such a worker is offered shared
// memory. One on another host could not map it; one in another network
// namespace on this host could, but is taken to stand for another host.
// gRPC writes peers as URIs: "ipv4:127.0.0.1:5000", "ipv6:%5B::1%5D:5000"
// (percent-encoded since 1.48; "[::1]" before), "unix:/path".
bool LoopbackPeer(const std::string& peer) {
  return absl::StartsWith(peer, "ipv4:127.") ||
         absl::StartsWith(peer, "ipv6:%5B::1%5D:") ||
         absl::StartsWith(peer, "ipv6:[::1]:") ||
         absl::StartsWith(peer, "unix:");
}

// ----------------------------------------------------------------- push --

// Runs a push's wake. A wake that comes while this thread is already in
// one (a resumed push's block let another in) waits until that one is
// done, so no thread holds two readers' locks, whatever their order.
//
// The queue is the thread's (thread_local), not a reader's: the wake that
// must wait is another reader's, called by the shard from inside the first
// one's (ParameterShard runs the wakes of the pushes a block lets in on
// the thread that added it), and nothing but the thread links the two. A
// reader's own flag cannot tell that its thread is inside another
// reader's wake, and the wake's signature (PushSession's) carries nothing
// that could.
void RunWake(std::function<void()> wake) {
  thread_local std::deque<std::function<void()>>* later = nullptr;
  if (later != nullptr) {
    later->push_back(std::move(wake));
    return;
  }
  std::deque<std::function<void()>> queue;
  later = &queue;
  wake();
  while (!queue.empty()) {
    std::function<void()> next = std::move(queue.front());
    queue.pop_front();
    next();
  }
  later = nullptr;
}

// A reader that stops reading while its push waits for its turn, and goes
// on, on the thread that wakes it. Try runs an attempt (PushSession::Add or
// Resume) once, and again if a wake came during it; a wake that finds it
// parked tells the caller to resume the reader. Thread-safe.
class Parking {
 public:
  // Runs `attempt` until it fails, is done, or parks (*parked; then a Wake
  // resumes it).
  absl::Status Try(PushSession& push, absl::FunctionRef<absl::Status()> attempt,
                   const WireMessage& msg, bool* parked) {
    *parked = false;
    Set(kRunning);
    absl::Status s = attempt();
    while (s.ok() && push.waiting()) {
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) {  // nobody would end it while it waits
          state_ = kIdle;
          return absl::CancelledError("cancelled");
        }
        if (state_ != kWoken) {
          state_ = kParked;
          *parked = true;
          return absl::OkStatus();
        }
        state_ = kRunning;
      }
      s = push.Resume(msg);
    }
    Set(kIdle);
    return s;
  }
  // True when the reader was parked: the caller resumes it now.
  bool Wake() {
    absl::MutexLock lock(&mu_);
    if (state_ == kParked) {
      state_ = kRunning;
      return true;
    }
    if (state_ == kRunning) state_ = kWoken;
    return false;
  }
  // True when the reader was parked: nobody resumes it any more. Otherwise
  // it does not park again (Try says kCancelled instead).
  bool Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (state_ != kParked) return false;
    state_ = kIdle;
    return true;
  }

 private:
  enum State { kIdle, kRunning, kWoken, kParked };
  void Set(State s) {
    absl::MutexLock lock(&mu_);
    state_ = s;
  }
  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = kIdle;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// PushGradients: one push a call, read as raw PushRequest bytes.
class PushReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushReactor(ShardHost* host, DataPlaneMetrics* metrics,
              grpc::ByteBuffer* resp)
      : handle_(std::make_shared<Handle>()),
        intake_(host,
                [weak = std::weak_ptr<Handle>(handle_)] {
                  RunWake([weak] {
                    std::shared_ptr<Handle> h = weak.lock();
                    if (h == nullptr) return;
                    absl::MutexLock lock(&h->mu);
                    if (h->reactor != nullptr && h->reactor->parking_.Wake())
                      h->reactor->Go(/*resume=*/true);
                  });
                }),
        metrics_(metrics),
        resp_bytes_(resp) {
    handle_->reactor = this;
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      End(intake_.Finish());
      return;
    }
    // PushRequest: 1 header, 2 chunk.
    absl::Status s = msg_.Parse(req_, 2);
    if (s.ok() && msg_.has(2) && msg_.chunk().shared) {
      s = absl::InvalidArgumentError(
          "a chunk in shared memory outside an Exchange stream");
    }
    if (!s.ok()) {
      intake_.Abort();
      End(absl::InvalidArgumentError(
          absl::StrCat("push message: ", s.message())));
      return;
    }
    Go(/*resume=*/false);
  }

  // A push waiting for its turn reads nothing, so nothing else ends it.
  void OnCancel() override {
    if (parking_.Cancel()) End(absl::CancelledError("cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&handle_->mu);
      handle_->reactor = nullptr;
    }
    intake_.Abort();
    delete this;
  }

 private:
  struct Handle {
    absl::Mutex mu;
    PushReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  // The message read last (or its waiting block, on the waking thread).
  void Go(bool resume) {
    bool parked = false;
    absl::Status s = parking_.Try(
        intake_,
        [&] { return resume ? intake_.Resume(msg_) : intake_.Take(msg_); },
        msg_, &parked);
    if (!s.ok()) {
      End(s);
      return;
    }
    if (parked) return;  // a wake goes on
    // A duplicate is answered without reading the rest.
    if (intake_.answered()) {
      End(intake_.Finish());
      return;
    }
    StartRead(&req_);
  }

  // Answers the push (once) and counts it.
  void End(const absl::StatusOr<v1::PushResponse>& r) {
    if (metrics_ != nullptr) {
      metrics_->Pushed(r.status(), intake_.duplicate(),
                       absl::ToDoubleSeconds(absl::Now() - intake_.started()),
                       intake_.bytes());
    }
    if (r.ok()) {
      grpc::Slice slice(r->SerializeAsString());
      grpc::ByteBuffer out(&slice, 1);
      resp_bytes_->Swap(&out);
    }
    Finish(ToGrpc(r.status()));
  }

  std::shared_ptr<Handle> handle_;  // the intake's wake holds it weakly
  PushSession intake_;
  Parking parking_;
  DataPlaneMetrics* metrics_;     // borrowed; may be null
  grpc::ByteBuffer* resp_bytes_;  // gRPC's: the response, once encoded
  grpc::ByteBuffer req_;
  WireMessage msg_;
};

// ----------------------------------------------------------------- pull --

// One pull, from its request to its last message: checks the caller,
// records the commit it carries, waits (bounded) as the job's rule says,
// then encodes the weights of one version chunk by chunk as slices of the
// published weights (float32 values are not copied on their way to the
// transport; the wire is the .proto's). PullWeights has one per call, an
// Exchange stream one per pull on it. Not thread-safe (its reactor's).
class PullServing {
 public:
  // kOk once the shard was asked to call `ready` when the pull may be
  // served (perhaps already, on this thread); otherwise why not.
  absl::Status Begin(ShardHost* host, const v1::PullRequest& req,
                     std::function<void(const absl::Status&)> ready) {
    chunk_ = req.chunk_elements() > 0 ? std::min<int64_t>(req.chunk_elements(),
                                                          kDefaultChunkElements)
                                      : kDefaultChunkElements;
    host_ = host;
    TALLY_ASSIGN_OR_RETURN(Range range,
                           host->Find(req.job_id(), req.map_version()));
    TALLY_RETURN_IF_ERROR(DTypeWidth(req.dtype()).status());
    dtype_ = req.dtype();
    // Only the job's members read its weights on the data path (clients
    // fetch them through JobService).
    TALLY_RETURN_IF_ERROR(
        range.shard->CheckMember(req.worker_id(), req.incarnation()));
    if (req.total_steps() > 0) {
      TALLY_RETURN_IF_ERROR(
          range.shard->SetSchedule(req.total_steps(), req.steps_per_epoch(),
                                   req.data_fingerprint(), req.plan()));
    }
    if (req.has_commit() &&
        !range.shard->Commit(req.worker_id(), req.incarnation(),
                             req.commit().step(), req.commit().contributed())) {
      return absl::UnavailableError(
          "the job's membership is changing: pull again with the commit");
    }
    range_ = std::move(range);
    shard_ = range_.shard;
    const absl::Time deadline =
        absl::Now() + host->waits().For(req.max_wait_ms());
    if (req.has_clock()) {
      shard_->WhenClock(req.worker_id(), req.clock(), req.min_version(),
                        deadline, std::move(ready));
    } else {
      shard_->WhenVersion(req.min_version(), deadline, std::move(ready));
    }
    return absl::OkStatus();
  }

  // Exchange: answer in the stream's region (mapped by the worker; the
  // pull asked for it), in one message, where the range's values fit.
  void ShareInto(SharedRegion* region) { shared_ = region; }

  // The pull may be served now: the weights it sends are fixed.
  void Ready() {
    waited_ = absl::Now() - started_;
    weights_ = shard_->Snapshot(&version_, &total_steps_, &buffers_);
    values_ = dtype_ == v1::BFLOAT16
                  ? SnapshotSlice(shard_->Bfloat16Of(weights_, version_))
                  : SnapshotSlice(weights_);
  }
  bool ready() const { return weights_ != nullptr; }
  // Every message was made.
  bool exhausted() const {
    return next_ > 0 && next_ >= static_cast<int64_t>(weights_->size());
  }

  // The next message into `out` (a range of none gets one, for the
  // version); false once all were made.
  bool Next(grpc::ByteBuffer* out) {
    const int64_t n = static_cast<int64_t>(weights_->size());
    if (next_ >= n && next_ > 0) return false;
    const int width = dtype_ == v1::BFLOAT16 ? 2 : 4;
    char* dst =
        shared_ != nullptr && n > 0
            ? shared_->Values(SharedRegion::kPull, shared_->pull_at(), n, width)
            : nullptr;
    if (dst != nullptr) {
      // The worker reads it once this message reaches it, before it asks
      // its next pull (proto/tally.proto, SharedMemoryOffer).
      std::memcpy(dst, values_.begin(), static_cast<size_t>(n * width));
      host_->CountShared(0, n * width);
      v1::PullResponse r;
      r.set_version(version_);
      r.set_total_steps(total_steps_);
      v1::TensorChunk* c = r.mutable_chunk();
      c->set_offset(range_.offset);
      c->set_count(n);
      c->set_dtype(dtype_);
      c->set_shared_offset(shared_->pull_at());
      if (buffers_ != nullptr) r.set_buffers(*buffers_);
      grpc::Slice slice(r.SerializeAsString());
      *out = grpc::ByteBuffer(&slice, 1);
      next_ = n;
      bytes_ += n * width;
      return true;
    }
    const int64_t count = std::min(chunk_, n - next_);
    // The buffer region goes with the first message.
    EncodePullResponse(version_, total_steps_, range_.offset + next_, count,
                       dtype_, values_, next_, out,
                       next_ == 0 && buffers_ != nullptr ? *buffers_
                                                         : std::string());
    next_ += std::max<int64_t>(count, 1);
    bytes_ += count * (dtype_ == v1::BFLOAT16 ? 2 : 4);
    return true;
  }

  void Count(DataPlaneMetrics* metrics) const {
    if (metrics == nullptr) return;
    metrics->Pulled(absl::ToDoubleSeconds(waited_),
                    absl::ToDoubleSeconds(absl::Now() - started_),
                    static_cast<double>(bytes_));
  }

 private:
  const absl::Time started_ = absl::Now();
  absl::Duration waited_;
  int64_t bytes_ = 0;
  ShardHost* host_ = nullptr;  // borrowed, from Begin
  Range range_;
  std::shared_ptr<ParameterShard> shard_;
  int64_t chunk_ = kDefaultChunkElements;
  v1::DType dtype_ = v1::FLOAT32;
  std::shared_ptr<const std::vector<float>> weights_;
  std::shared_ptr<const std::string> buffers_;  // of version_; may be null
  int64_t version_ = 0;
  int64_t total_steps_ = 0;
  int64_t next_ = 0;
  grpc::Slice values_;              // over weights_
  SharedRegion* shared_ = nullptr;  // the stream's (Exchange), borrowed
};

// PullWeights: one pull a call, written as raw PullResponse bytes.
class PullReactor final
    : public EventWriteReactor<PullReactor, grpc::ByteBuffer> {
 public:
  PullReactor(ShardHost* host, DataPlaneMetrics* metrics,
              const grpc::ByteBuffer* raw)
      : metrics_(metrics) {
    v1::PullRequest req;
    {
      grpc::ByteBuffer copy(*raw);  // Deserialize clears what it reads
      if (!grpc::SerializationTraits<v1::PullRequest>::Deserialize(&copy, &req)
               .ok()) {
        FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                "malformed PullRequest"));
        return;
      }
    }
    // The wait may end at once, on this thread: not under mu_.
    absl::Status s = pull_.Begin(
        host, req, WhileLive([](PullReactor* r, const absl::Status& st) {
          r->Ready(st);
        }));
    if (!s.ok()) FinishOnce(ToGrpc(s));
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
    pull_.Ready();
    WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!pull_.Next(&resp_)) {
      pull_.Count(metrics_);
      FinishOnceLocked(grpc::Status::OK);
      return;
    }
    StartWriteLocked(&resp_);
  }

  DataPlaneMetrics* metrics_;  // borrowed; may be null
  // Begun in the constructor (before any event can reach Ready), then
  // used under mu_.
  PullServing pull_;
  grpc::ByteBuffer resp_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------- exchange --

// Exchange: pushes and pulls on one long-lived stream, answered in order
// (proto/tally.proto). Reads are handled one at a time, as they come; the
// answers (push responses, then the chunks of the pull being served) are
// written one at a time from a queue. Any error ends the stream with its
// status; an unfinished push is dropped with it (nothing of it staged).
class ExchangeReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Push answers written to nobody before the stream is ended.
  static constexpr size_t kMaxUnreadAnswers = 64;

  // `colocated`: the worker is on this host (LoopbackPeer), and may be
  // offered shared memory.
  ExchangeReactor(ShardHost* host, DataPlaneMetrics* metrics, bool colocated)
      : host_(host),
        metrics_(metrics),
        handle_(std::make_shared<Handle>()),
        shared_memory_(host, colocated) {
    handle_->reactor = this;
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (!ok) {
        // The worker is done writing: whatever is answered goes, then the
        // stream ends. A push left open is dropped.
        reads_done_ = true;
        push_.reset();
        MaybeFinishLocked();
        return;
      }
    }
    bool parked = false;
    absl::Status s = TakePush(&parked);
    if (s.ok() && parked) return;  // a wake goes on (Continue)
    if (s.ok()) s = TakeRest();
    AfterTake(s);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    // The written message lets go of the weights it held: a buffer no
    // reader holds is stepped in place, without a copy (shard.h).
    cur_.Clear();
    if (!ok)
      EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    // Ended while this write was out (a cancel, an error): finish now.
    if (finished_) {
      if (!final_sent_) SendFinishLocked();
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    parking_.Cancel();  // a waiting push is not resumed
    absl::MutexLock lock(&mu_);
    EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&handle_->mu);
      handle_->reactor = nullptr;
    }
    // An open push returns its staging buffer; the shared memory session
    // its region.
    delete this;
  }

 private:
  struct Handle {
    absl::Mutex mu;
    ExchangeReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    // The thread that holds mu while it resumes the reader (Waker): a pull
    // begun there may be ready at once, on that thread, which must not
    // take mu again. Written by that thread alone, under mu.
    std::atomic<std::thread::id> resuming{};
  };

  // A push's wake: the reader goes on where its push waited.
  std::function<void()> Waker() {
    return [weak = std::weak_ptr<Handle>(handle_)] {
      RunWake([weak] {
        std::shared_ptr<Handle> h = weak.lock();
        if (h == nullptr) return;
        absl::MutexLock lock(&h->mu);
        if (h->reactor != nullptr && h->reactor->parking_.Wake()) {
          h->resuming.store(std::this_thread::get_id());
          h->reactor->Continue();
          h->resuming.store(std::thread::id());
        }
      });
    };
  }
  void Continue() {
    bool parked = false;
    absl::Status s = parking_.Try(
        *push_, [&] { return push_->Resume(msg_); }, msg_, &parked);
    if (!s.ok()) CountPush(s);
    if (s.ok() && parked) return;
    if (s.ok()) s = TakeRest();
    AfterTake(s);
  }
  // The end of a message: the next read, or the end of the stream.
  void AfterTake(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      push_.reset();
      EndLocked(ToGrpc(s));
      return;
    }
    if (!finished_) StartRead(&req_);
  }

  // One request message, in its fields' order: header and chunk here
  // (*parked: the push waits for its turn), then push_done and pull
  // (TakeRest). Runs on the reading side, one message at a time.
  absl::Status TakePush(bool* parked) {
    *parked = false;
    // ExchangeRequest: 1 header, 2 chunk, 3 push_done, 4 pull.
    if (absl::Status s = msg_.Parse(req_, 2); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("exchange message: ", s.message()));
    }
    shared_memory_.CloseIfUnanswered(absl::Now());
    if (msg_.has(2) && msg_.chunk().shared) {
      TALLY_RETURN_IF_ERROR(shared_memory_.UsePushChunk(&msg_));
    }
    if (msg_.has(1) || msg_.has(2)) {
      if (msg_.has(1) && push_ != nullptr) {
        return absl::InvalidArgumentError(
            "a push began before the last one ended");
      }
      if (msg_.has(1)) {
        // Answers go in order: a push's answer may not pass the chunks of
        // the pull before it.
        absl::MutexLock lock(&mu_);
        if (pull_ != nullptr) {
          return absl::InvalidArgumentError(
              "a push while a pull is being answered");
        }
      }
      if (!msg_.has(1) && push_ == nullptr) {
        return absl::InvalidArgumentError("a chunk of no push");
      }
      if (push_ == nullptr)
        push_ = std::make_unique<PushSession>(host_, Waker());
      absl::Status s = parking_.Try(
          *push_, [&] { return push_->Take(msg_); }, msg_, parked);
      if (!s.ok()) {
        CountPush(s);
        return s;
      }
    }
    return absl::OkStatus();
  }

  // The rest of a message, in its fields' order: push_done (3), a pull
  // (4), the answer to a shared-memory offer (5).
  absl::Status TakeRest() {
    if (msg_.varint(3) != 0) TALLY_RETURN_IF_ERROR(TakePushDone());
    if (msg_.has(4)) TALLY_RETURN_IF_ERROR(TakePull());
    if (msg_.has(5)) TALLY_RETURN_IF_ERROR(TakeSharedReply());
    return absl::OkStatus();
  }

  // The push ends: its answer is queued.
  absl::Status TakePushDone() {
    if (push_ == nullptr) {
      return absl::InvalidArgumentError("push_done with no push begun");
    }
    absl::StatusOr<v1::PushResponse> r = push_->Finish();
    CountPush(r.status());
    push_.reset();
    if (!r.ok()) return r.status();
    // ExchangeResponse: 4 push.
    grpc::Slice slice(LengthDelimitedField(4, r->SerializeAsString()));
    absl::MutexLock lock(&mu_);
    // A worker that asks and never reads would make the shard keep its
    // answers.
    if (out_.size() >= kMaxUnreadAnswers) {
      return absl::ResourceExhaustedError(
          "too many answers not read: read the stream");
    }
    out_.emplace_back(&slice, 1);
    WriteNextLocked();
    return absl::OkStatus();
  }

  absl::Status TakePull() {
    if (push_ != nullptr) {
      return absl::InvalidArgumentError("a pull inside an open push");
    }
    v1::PullRequest req;
    if (!req.ParseFromString(msg_.bytes(4))) {
      return absl::InvalidArgumentError("malformed PullRequest");
    }
    auto pull = std::make_unique<PullServing>();
    PullServing* p = pull.get();
    if (req.into_shared_memory()) {
      TALLY_ASSIGN_OR_RETURN(SharedRegion * region,
                             shared_memory_.PullRegion());
      p->ShareInto(region);
    }
    {
      absl::MutexLock lock(&mu_);
      if (pull_ != nullptr) {
        return absl::InvalidArgumentError(
            "a pull while the last one is being answered");
      }
    }
    // The offer goes before the pull's answer (nothing else is being
    // answered now), ...
    if (v1::ExchangeResponse offer;
        shared_memory_.Offer(req, absl::Now(), &offer)) {
      // ExchangeResponse: 5 shared.
      grpc::Slice slice(offer.SerializeAsString());
      absl::MutexLock lock(&mu_);
      out_.emplace_back(&slice, 1);
      WriteNextLocked();
    }
    {
      absl::MutexLock lock(&mu_);
      pull_ = std::move(pull);
    }
    // Ready may run at once, on this thread: not under mu_. Until then
    // nothing else touches the pull.
    absl::Status s = p->Begin(
        host_, req,
        [weak = std::weak_ptr<Handle>(handle_)](const absl::Status& st) {
          std::shared_ptr<Handle> h = weak.lock();
          if (h == nullptr) return;
          if (h->resuming.load() == std::this_thread::get_id()) {
            h->mu.AssertHeld();  // by this thread, in Waker
            h->reactor->Ready(st);
            return;
          }
          absl::MutexLock lock(&h->mu);
          if (h->reactor != nullptr) h->reactor->Ready(st);
        });
    if (!s.ok()) return s;
    return absl::OkStatus();
  }

  // The worker's answer to the offer (the session checks it was made).
  absl::Status TakeSharedReply() {
    v1::SharedMemoryReply reply;
    if (!reply.ParseFromString(msg_.bytes(5))) {
      return absl::InvalidArgumentError("malformed SharedMemoryReply");
    }
    const bool offered =
        shared_memory_.state() == SharedMemorySession::State::kOffered;
    TALLY_RETURN_IF_ERROR(shared_memory_.Reply(reply));
    if (metrics_ != nullptr && offered) metrics_->SharedMemory(reply.mapped());
    return absl::OkStatus();
  }

  void Ready(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (finished_ || pull_ == nullptr) return;
    if (!s.ok()) {
      EndLocked(ToGrpc(s));
      return;
    }
    pull_->Ready();
    WriteNextLocked();
  }

  // Writes the next answer, if nothing is being written: a push's answer
  // first, then the pull's chunks in order.
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!out_.empty()) {
      cur_ = std::move(out_.front());
      out_.pop_front();
      writing_ = true;
      StartWrite(&cur_);
      return;
    }
    if (pull_ != nullptr && pull_->ready()) {
      pull_->Next(&cur_);
      // The worker may ask its next pull as soon as this last message
      // reaches it (before this write is done): this pull is over now.
      if (pull_->exhausted()) {
        pull_->Count(metrics_);
        pull_.reset();
      }
      writing_ = true;
      StartWrite(&cur_);
      return;
    }
    MaybeFinishLocked();
  }

  // The worker is done writing and everything is answered: the end.
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_ && !writing_ && out_.empty() && pull_ == nullptr)
      EndLocked(grpc::Status::OK);
  }

  // Ends the stream with `s` (once; after the write in progress, if any).
  void EndLocked(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    final_ = s;
    if (!writing_) SendFinishLocked();
  }
  void SendFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    final_sent_ = true;
    Finish(final_);
  }

  void CountPush(const absl::Status& s) {
    if (metrics_ == nullptr || push_ == nullptr) return;
    metrics_->Pushed(s, push_->duplicate(),
                     absl::ToDoubleSeconds(absl::Now() - push_->started()),
                     push_->bytes());
  }

  ShardHost* host_;            // borrowed
  DataPlaneMetrics* metrics_;  // borrowed; may be null
  std::shared_ptr<Handle> handle_;
  // The reading side's (one read at a time).
  grpc::ByteBuffer req_;
  WireMessage msg_;
  // The push being read, if any. Touched by the reading side and, once it
  // is done (reads_done_ or an error), under mu_.
  std::unique_ptr<PushSession> push_;
  Parking parking_;  // the reading side's, while its push waits
  // Memory shared with the worker: the reading side's; a pull being served
  // borrows its region while mapped (declared before pull_, it outlives
  // it).
  SharedMemorySession shared_memory_;

  absl::Mutex mu_;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool final_sent_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> out_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer cur_ ABSL_GUARDED_BY(mu_);  // being written
  std::unique_ptr<PullServing> pull_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------- save --

// A range's state at one version, in pieces of at most 1 MiB.
class SaveReactor final
    : public EventWriteReactor<SaveReactor, v1::SaveRangeChunk> {
 public:
  SaveReactor(ShardHost* host, const v1::SaveRangeRequest* req)
      : weights_only_(req->weights_only()) {
    if (!req->backup_address().empty()) {
      // A new backup's state, as it is.
      Ready(host->SeedBackup(req->job_id(), req->map_version(),
                             req->backup_address()));
      return;
    }
    host->SaveAt(req->job_id(), req->map_version(), req->version(),
                 absl::Now() + host->waits().For(req->max_wait_ms()),
                 WhileLive([](SaveReactor* r, absl::StatusOr<ShardState> s) {
                   r->Ready(std::move(s));
                 }),
                 weights_only_);
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
    EncodeRangeRecord(state_, msg_.mutable_state());
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

// A client stream gathered message by message (Add), then acted on once
// the client is done writing (Done): the answer is Done's status, or that
// of the first Add that refused. A subclass calls Start when constructed.
template <typename Message>
class GatherReactor : public grpc::ServerReadReactor<Message> {
 public:
  void OnReadDone(bool ok) override {
    if (!ok) {
      this->Finish(ToGrpc(Done()));
      return;
    }
    if (absl::Status s = Add(); !s.ok()) {
      this->Finish(ToGrpc(s));
      return;
    }
    this->StartRead(&msg_);
  }
  void OnDone() override { delete this; }

 protected:
  void Start() { this->StartRead(&msg_); }
  virtual absl::Status Add() = 0;
  virtual absl::Status Done() = 0;
  Message msg_;
};

// Gathers a range's state from its pieces, then installs it. The pieces
// may not add up to more than the range's size says.
class InstallReactor final : public GatherReactor<v1::InstallRangeChunk> {
 public:
  explicit InstallReactor(ShardHost* host) : host_(host) { Start(); }

 private:
  absl::Status Add() override {
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
  absl::Status Done() override {
    if (first_) return absl::InvalidArgumentError("an empty install stream");
    return host_->Install(req_);
  }

  ShardHost* host_;  // borrowed
  v1::InstallRangeRequest req_;
  bool first_ = true;
};

// ---------------------------------------------------------- closed steps --

// A primary's closed step, gathered from its pieces (no more values than
// the backup's range holds), then made on the backup copy.
class ClosedStepReactor final : public GatherReactor<v1::ClosedStepChunk> {
 public:
  ClosedStepReactor(ShardHost* host, v1::ApplyClosedStepsResponse* resp)
      : host_(host), resp_(resp) {
    Start();
  }

 private:
  absl::Status Add() override {
    if (first_) {
      if (!msg_.has_header()) {
        return absl::InvalidArgumentError(
            "the first message of a closed step must carry its header");
      }
      header_ = std::move(*msg_.mutable_header());
      first_ = false;
      TALLY_ASSIGN_OR_RETURN(
          Range r, host_->Find(header_.job_id(), header_.map_version()));
      count_ = r.count;
    }
    const std::string& data = msg_.data();
    if (data.empty()) return absl::OkStatus();
    if (data.size() % sizeof(float) != 0 ||
        static_cast<int64_t>(mean_.size() + data.size() / sizeof(float)) >
            count_) {
      return absl::InvalidArgumentError(
          "a closed step's mean is larger than the range");
    }
    const size_t at = mean_.size();
    mean_.resize(at + data.size() / sizeof(float));
    std::memcpy(mean_.data() + at, data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status Done() override {
    if (first_) return absl::InvalidArgumentError("an empty closed step");
    ClosedStep step;
    step.step = header_.step();
    step.samples = header_.samples();
    step.loss_sum = header_.loss_sum();
    step.correct = header_.correct();
    if (step.samples > 0)
      step.mean = std::make_shared<const std::vector<float>>(std::move(mean_));
    if (!header_.buffers().empty())
      step.buffers = std::make_shared<const std::string>(header_.buffers());
    TALLY_ASSIGN_OR_RETURN(
        int64_t version,
        host_->ApplyClosed(header_.job_id(), header_.map_version(), step));
    resp_->set_version(version);
    return absl::OkStatus();
  }

  ShardHost* host_;                        // borrowed
  v1::ApplyClosedStepsResponse* resp_;     // gRPC's
  v1::ClosedStepChunk::Header header_;
  std::vector<float> mean_;
  int64_t count_ = 0;
  bool first_ = true;
};

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

// A pull of rows counted in its shard's bound on waiting pulls
// (ShardHost::ReserveWaitingRows) until it is answered, or until its wait
// is dropped unanswered: given back when the last copy of its callback
// lets go of it.
class WaitingRows {
 public:
  WaitingRows(ShardHost* host, std::string owner, int64_t bytes)
      : host_(host), owner_(std::move(owner)), bytes_(bytes) {}
  WaitingRows(const WaitingRows&) = delete;
  WaitingRows& operator=(const WaitingRows&) = delete;
  ~WaitingRows() { host_->ReleaseWaitingRows(owner_, bytes_); }

 private:
  ShardHost* host_;  // borrowed
  const std::string owner_;
  const int64_t bytes_;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* ParameterServiceImpl::PushGradients(
    grpc::CallbackServerContext*, grpc::ByteBuffer* resp) {
  return new PushReactor(host_, metrics_, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ParameterServiceImpl::PullWeights(
    grpc::CallbackServerContext*, const grpc::ByteBuffer* req) {
  return new PullReactor(host_, metrics_, req);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ParameterServiceImpl::Exchange(grpc::CallbackServerContext* ctx) {
  return new ExchangeReactor(host_, metrics_, LoopbackPeer(ctx->peer()));
}

grpc::ServerUnaryReactor* ParameterServiceImpl::PullRows(
    grpc::CallbackServerContext* ctx, const v1::PullRowsRequest* req,
    v1::PullRowsResponse* resp) {
  // Rows go by their slot in the caller's map: a range of another
  // placement owns other rows, or the same rows at another step.
  absl::StatusOr<Range> range =
      host_->Find(req->job_id(), req->map_version());
  if (!range.ok()) return Reply(ctx, range.status());
  std::shared_ptr<ParameterShard> shard = range->shard;
  // Checked whole before it waits, since a waiting pull holds its request
  // (a request of millions of rows would otherwise be held for the wait
  // and refused only after it); then counted while it waits.
  if (absl::Status s = shard->CheckPullRows(*req); !s.ok())
    return Reply(ctx, s);
  const int64_t bytes = static_cast<int64_t>(req->SpaceUsedLong());
  std::string owner = absl::StrCat(req->job_id(), "\n", req->worker_id());
  if (absl::Status s = host_->ReserveWaitingRows(owner, bytes); !s.ok())
    return Reply(ctx, s);
  auto counted =
      std::make_shared<WaitingRows>(host_, std::move(owner), bytes);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // Answered once the version is there (perhaps at once, on this thread).
  shard->WhenVersion(
      req->min_version(), absl::Now() + host_->waits().For(req->max_wait_ms()),
      [reactor, shard, req, resp,
       counted = std::move(counted)](absl::Status s) mutable {
        counted.reset();  // it waits no more
        if (s.ok()) s = shard->ReadRows(*req, resp);
        reactor->Finish(ToGrpc(s));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServiceImpl::PushRows(
    grpc::CallbackServerContext* ctx, const v1::PushRowsRequest* req,
    v1::PushRowsResponse* resp) {
  absl::StatusOr<Range> range =
      host_->Find(req->job_id(), req->map_version());
  if (!range.ok()) return Reply(ctx, range.status());
  bool replaced = false;
  absl::Status s = range->shard->StageRows(*req, &replaced);
  resp->set_replaced(replaced);
  return Reply(ctx, s);
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
      host_->waits().Hold(req->hold_ms()));
  if (!r.ok()) return Reply(ctx, r.status());
  resp->set_version(r->version);
  for (const MemberProgress& m : r->members) *resp->add_members() = ToProto(m);
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
                                      members, req->hold_id(),
                                      {req->plan(), req->total_steps()}));
}

grpc::ServerUnaryReactor* ShardServiceImpl::RetireRange(
    grpc::CallbackServerContext* ctx, const v1::RetireRangeRequest* req,
    v1::RetireRangeResponse*) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  return Reply(ctx, host_->Retire(req->job_id(), req->map_version()));
}

grpc::ServerUnaryReactor* ShardServiceImpl::PromoteRange(
    grpc::CallbackServerContext* ctx, const v1::PromoteRangeRequest* req,
    v1::PromoteRangeResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  absl::StatusOr<int64_t> v = host_->Promote(req->job_id(), req->map_version());
  if (v.ok()) resp->set_version(*v);
  return Reply(ctx, v.status());
}

grpc::ServerUnaryReactor* ShardServiceImpl::SetRangeBackup(
    grpc::CallbackServerContext* ctx, const v1::SetRangeBackupRequest* req,
    v1::SetRangeBackupResponse*) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  return Reply(ctx, host_->SetBackup(req->job_id(), req->map_version(),
                                     req->backup_address(),
                                     req->from_version()));
}

grpc::ServerReadReactor<v1::ClosedStepChunk>*
ShardServiceImpl::ApplyClosedSteps(grpc::CallbackServerContext*,
                                   v1::ApplyClosedStepsResponse* resp) {
  return new ClosedStepReactor(host_, resp);
}

grpc::ServerWriteReactor<v1::SaveRangeChunk>* ShardServiceImpl::SaveRange(
    grpc::CallbackServerContext*, const v1::SaveRangeRequest* req) {
  return new SaveReactor(host_, req);
}

grpc::ServerUnaryReactor* ShardServiceImpl::ReadTable(
    grpc::CallbackServerContext* ctx, const v1::ReadTableRequest* req,
    v1::ReadTableResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  std::vector<int64_t> rows;
  int64_t total = 0;
  absl::Status s = host_->ReadTable(req->job_id(), req->map_version(),
                                    req->table(), req->start_row(),
                                    req->max_rows(), &rows,
                                    resp->mutable_values(), &total);
  resp->mutable_rows()->Assign(rows.begin(), rows.end());
  resp->set_total_rows(total);
  return Reply(ctx, s);
}

}  // namespace tally
