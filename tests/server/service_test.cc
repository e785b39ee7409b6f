// The gRPC surface of tally-server, in process over a real socket: every
// kind of bad input gets its specific status and the server keeps serving.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "common/bfloat16.h"
#include "common/io/safetensors.h"
#include "common/random.h"
#include "gtest/gtest.h"
#include "proto/errors.h"
#include "proto/shared_memory.h"
#include "common/status_macros.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"
#include "server/tally_server.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::HasReason;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"(
name: tiny
model: {layers: [{linear: {in_features: 4, out_features: 2}}]}
dataset: {name: synthetic, features: 4, classes: 2}
training: {workers: 1}
optimizer: {type: sgd, lr: 1.0}
)";
constexpr int kParams = 10;

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(ServerOptions()); }

  // The server started afresh (no jobs) with `o` and a 30 s lease.
  void StartServer(ServerOptions o) {
    server_.reset();
    o.coordinator.lease_timeout = absl::Seconds(30);
    auto s = TallyServer::Start(absl::StrCat(host_, ":0"), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    // Tally's own settings (no send limit: the tests send oversized
    // messages on purpose).
    channel_ = Dial(absl::StrCat(host_, ":", server_->port()));
    jobs_ = v1::JobService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
    params_ = v1::ParameterService::NewStub(
        Dial(absl::StrCat(host_, ":", server_->data_port())));
  }

  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return c;
  }

  // Submits kSpec and registers one worker, so the job is RUNNING.
  void StartJob() {
    v1::SubmitJobRequest req;
    req.set_spec(kSpec);
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(jobs_->SubmitJob(Ctx().get(), req, &resp).ok());
    job_ = resp.job().id();
    v1::RegisterWorkerRequest reg;
    reg.set_name("t");
    reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    ASSERT_TRUE(workers_->RegisterWorker(Ctx().get(), reg, &worker_).ok());
    v1::Job j;
    v1::GetJobRequest g;
    g.set_job_id(job_);
    ASSERT_TRUE(jobs_->GetJob(Ctx().get(), g, &j).ok());
    ASSERT_EQ(j.state(), v1::RUNNING);
  }

  v1::PushRequest Header(int64_t step, int64_t samples = 4) {
    v1::PushRequest m;
    v1::PushHeader* h = m.mutable_header();
    h->set_job_id(job_);
    h->set_worker_id(worker_.worker_id());
    h->set_incarnation(worker_.incarnation());
    h->set_step(step);
    h->set_base_version(step);
    h->set_samples(samples);
    return m;
  }

  static v1::TensorChunk Chunk(int64_t offset, std::vector<float> values) {
    v1::TensorChunk c;
    c.set_offset(offset);
    c.set_count(static_cast<int64_t>(values.size()));
    c.set_data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    return c;
  }

  // Sends `messages` as one push stream.
  absl::StatusOr<v1::PushResponse> Push(std::vector<v1::PushRequest> messages) {
    auto ctx = Ctx();
    v1::PushResponse resp;
    auto w = params_->PushGradients(ctx.get(), &resp);
    for (auto& m : messages) {
      if (!w->Write(m)) break;
    }
    w->WritesDone();
    absl::Status s = FromGrpc(w->Finish());
    if (!s.ok()) return s;
    return resp;
  }

  std::vector<v1::PushRequest> FullPush(int64_t step, float value) {
    std::vector<v1::PushRequest> msgs = {Header(step)};
    *msgs[0].mutable_chunk() = Chunk(0, std::vector<float>(6, value));
    v1::PushRequest rest;
    *rest.mutable_chunk() = Chunk(6, std::vector<float>(4, value));
    msgs.push_back(rest);
    return msgs;
  }

  // A pull of the job's weights as this test's worker.
  v1::PullRequest PullRequest(int64_t min_version) {
    v1::PullRequest req;
    req.set_job_id(job_);
    req.set_worker_id(worker_.worker_id());
    req.set_incarnation(worker_.incarnation());
    req.set_min_version(min_version);
    return req;
  }

  // A pull of min_version, which (as a worker's would) commits the push of
  // the step before it.
  // With send_commit = false the pull commits nothing (the push was its own
  // commit).
  absl::StatusOr<std::pair<int64_t, std::vector<float>>> Pull(
      int64_t min_version, int64_t wait_ms = 2000, bool send_commit = true) {
    auto ctx = Ctx();
    v1::PullRequest req = PullRequest(min_version);
    if (min_version > 0 && send_commit) {
      req.mutable_commit()->set_step(min_version - 1);
      req.mutable_commit()->set_contributed(true);
    }
    req.set_max_wait_ms(wait_ms);
    req.set_chunk_elements(3);
    auto r = params_->PullWeights(ctx.get(), req);
    v1::PullResponse resp;
    std::vector<float> w(kParams);
    int64_t version = -1;
    while (r->Read(&resp)) {
      std::memcpy(w.data() + resp.chunk().offset(), resp.chunk().data().data(),
                  resp.chunk().data().size());
      version = resp.version();
    }
    absl::Status s = FromGrpc(r->Finish());
    if (!s.ok()) return s;
    return std::make_pair(version, w);
  }

  v1::Job Job() {
    v1::Job j;
    v1::GetJobRequest g;
    g.set_job_id(job_);
    EXPECT_TRUE(jobs_->GetJob(Ctx().get(), g, &j).ok());
    return j;
  }

  std::string host_ = "127.0.0.1";  // listened on and dialled
  std::unique_ptr<TallyServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::ParameterService::Stub> params_;
  std::string job_;
  v1::RegisterWorkerResponse worker_;
};

TEST_F(ServiceTest, ASecondServerOnTheSamePortIsRefused) {
  CoordinatorOptions o;
  auto second =
      TallyServer::Start(absl::StrCat("127.0.0.1:", server_->port()), o);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("cannot listen")));
  // The first one serves on.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  EXPECT_TRUE(jobs_->ListJobs(&ctx, req, &resp).ok());
}

// An older worker (no protocol_version) is refused over the wire with the
// reason it can read from the status trailer; a current one is registered.
TEST_F(ServiceTest, AWorkerWithoutAProtocolVersionIsRefusedWithItsReason) {
  v1::RegisterWorkerRequest reg;
  reg.set_name("old");
  v1::RegisterWorkerResponse resp;
  EXPECT_THAT(FromGrpc(workers_->RegisterWorker(Ctx().get(), reg, &resp)),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::PROTOCOL_TOO_OLD));
  EXPECT_TRUE(resp.worker_id().empty());
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  EXPECT_TRUE(FromGrpc(workers_->RegisterWorker(Ctx().get(), reg, &resp)).ok());
  EXPECT_FALSE(resp.worker_id().empty());
}

TEST_F(ServiceTest, MalformedSpecAndUnknownJobs) {
  v1::SubmitJobRequest req;
  req.set_spec("model: {layers: [bogus]}\ndataset: {name: synthetic}\n");
  v1::SubmitJobResponse resp;
  EXPECT_THAT(
      FromGrpc(jobs_->SubmitJob(Ctx().get(), req, &resp)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("model.layers[0]: unknown layer type 'bogus'")));
  v1::GetJobRequest g;
  g.set_job_id("job-42");
  v1::Job j;
  EXPECT_THAT(FromGrpc(jobs_->GetJob(Ctx().get(), g, &j)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-42")));
  // Models no server could hold are refused at submission, naming the
  // limit, and the server serves on (it used to die scheduling them).
  for (const char* absurd :
       {"model: {layers: [{linear: {in_features: 32, out_features: 1000000}}, "
        "{linear: {in_features: 1000000, out_features: 1000000}}, {linear: "
        "{in_features: 1000000, out_features: 4}}]}\n"
        "dataset: {name: synthetic, features: 32, classes: 4}\n",
        "model: {layers: [flatten, {linear: {in_features: 16777216, "
        "out_features: 4}}]}\ndataset: {name: synthetic, features: 16777216, "
        "classes: 4, teacher_hidden: 4096, train_size: 1, test_size: 0}\n"}) {
    req.set_spec(absurd);
    EXPECT_THAT(FromGrpc(jobs_->SubmitJob(Ctx().get(), req, &resp)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("max_")));
  }
  v1::ListJobsResponse listed;
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), {}, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);  // nothing was stored
  // A 100 KiB job id: NOT_FOUND with a short message (it used to be echoed
  // whole, and the reply outgrew gRPC's limit).
  g.set_job_id(std::string(100 << 10, 'x'));
  absl::Status huge = FromGrpc(jobs_->GetJob(Ctx().get(), g, &j));
  EXPECT_THAT(huge, StatusIs(absl::StatusCode::kNotFound,
                             HasSubstr("(102400 bytes)")));
  EXPECT_LT(huge.message().size(), 200u);
  // A 1 MiB one is over the control-message limit, said briefly too.
  g.set_job_id(std::string(1 << 20, 'x'));
  huge = FromGrpc(jobs_->GetJob(Ctx().get(), g, &j));
  EXPECT_THAT(huge, StatusIs(absl::StatusCode::kResourceExhausted,
                             HasSubstr("limit of control messages")));
  EXPECT_LT(huge.message().size(), 200u);
  // Over the transport's limit: refused before any handler, and the
  // server serves on.
  v1::RegisterWorkerRequest big;
  big.set_name(std::string(5 << 20, 'n'));
  v1::RegisterWorkerResponse reg;
  EXPECT_THAT(FromGrpc(workers_->RegisterWorker(Ctx().get(), big, &reg)),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  EXPECT_TRUE(jobs_->ListJobs(Ctx().get(), {}, &listed).ok());
  // A shard address is host:port: nothing a page could run.
  auto coordination = v1::CoordinatorService::NewStub(channel_);
  v1::RegisterShardRequest shard;
  shard.set_address("a\"}],\"job\":{\"x\":\"<img src=x onerror=alert(1)>:1");
  v1::RegisterShardResponse registered;
  EXPECT_THAT(
      FromGrpc(coordination->RegisterShard(Ctx().get(), shard, &registered)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host:port")));
  job_ = "job-42";
  EXPECT_THAT(Push({Header(0)}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-42")));
  EXPECT_THAT(Pull(0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-42")));
}

// More jobs than one reply could carry (3,000 specs of 3 KB: 9 MB, over
// the client's 8 MiB limit) are listed page by page, every job once.
TEST(ServiceListTest, ManyJobsArePaged) {
  CoordinatorOptions o;
  o.max_queued_jobs = 5000;
  auto server = TallyServer::Start("127.0.0.1:0", o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto jobs = v1::JobService::NewStub(
      Dial(absl::StrCat("127.0.0.1:", (*server)->port())));
  v1::SubmitJobRequest req;
  req.set_spec(std::string(kSpec) + "# " + std::string(3000, 'c') + "\n");
  constexpr int kJobs = 3000;
  for (int i = 0; i < kJobs; ++i) {
    grpc::ClientContext ctx;
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(jobs->SubmitJob(&ctx, req, &resp).ok()) << i;
  }
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  std::set<std::string> seen;
  int pages = 0;
  do {
    grpc::ClientContext ctx;
    v1::ListJobsResponse resp;
    ASSERT_TRUE(jobs->ListJobs(&ctx, list, &resp).ok()) << "page " << pages;
    ++pages;
    for (const v1::Job& j : resp.jobs()) {
      EXPECT_FALSE(j.spec().empty());
      seen.insert(j.id());
    }
    list.set_page_token(resp.next_page_token());
  } while (!list.page_token().empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen.size(), static_cast<size_t>(kJobs));
  // A token the server never gave.
  list.set_page_token("not-a-token");
  grpc::ClientContext ctx;
  v1::ListJobsResponse resp;
  EXPECT_THAT(FromGrpc(jobs->ListJobs(&ctx, list, &resp)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("page_token")));
}

// A Python model's job: only a Python worker gets it; the lowest rank is
// asked for the initial weights, and a bad offer (another worker's, not
// finite, short) is refused by its code and changes nothing; the first good
// one is installed and the assignment follows; a second is refused as not
// needed (ALREADY_EXISTS + WEIGHTS_GIVEN) before the coordinator reads it.
TEST_F(ServiceTest, APythonModelsInitialWeightsComeFromItsWorker) {
  v1::SubmitJobRequest sub;
  sub.set_spec(
      "name: py\nmodel: {python: {file: m.py, code: 'import torch', params: "
      "[{name: fc.weight, shape: [2, 4]}, {name: fc.bias, shape: [2]}]}}\n"
      "dataset: {name: synthetic, features: 4, classes: 2}\n"
      "training: {workers: 1}\noptimizer: {type: sgd, lr: 1.0}\n");
  v1::SubmitJobResponse job;
  ASSERT_TRUE(jobs_->SubmitJob(Ctx().get(), sub, &job).ok());
  auto heartbeat = [&](const v1::RegisterWorkerResponse& w) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(w.worker_id());
    hb.set_incarnation(w.incarnation());
    v1::HeartbeatResponse resp;
    EXPECT_TRUE(workers_->Heartbeat(Ctx().get(), hb, &resp).ok());
    return resp;
  };
  auto register_worker = [&](const std::string& python) {
    v1::RegisterWorkerRequest reg;
    reg.set_name(python.empty() ? "cpp" : "py");
    reg.set_python(python);
    reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    v1::RegisterWorkerResponse w;
    EXPECT_TRUE(workers_->RegisterWorker(Ctx().get(), reg, &w).ok());
    return w;
  };
  // A C++ worker is never given it; a Python worker not on it may not offer.
  const v1::RegisterWorkerResponse cpp = register_worker("");
  v1::HeartbeatResponse r = heartbeat(cpp);
  EXPECT_FALSE(r.has_assignment() || r.has_initial_weights());
  const v1::RegisterWorkerResponse py = register_worker("Python 3, PyTorch");
  r = heartbeat(py);
  ASSERT_TRUE(r.has_initial_weights());
  EXPECT_FALSE(r.has_assignment());  // not before the weights are in
  EXPECT_EQ(r.initial_weights().job_id(), job.job().id());
  auto offer = [&](const v1::RegisterWorkerResponse& w,
                   std::vector<float> values) -> absl::StatusOr<bool> {
    auto ctx = Ctx();
    v1::OfferInitialWeightsResponse resp;
    auto writer = workers_->OfferInitialWeights(ctx.get(), &resp);
    v1::InitialWeightsChunk m;
    m.set_job_id(job.job().id());
    m.set_worker_id(w.worker_id());
    m.set_incarnation(w.incarnation());
    *m.mutable_chunk() = Chunk(0, std::move(values));
    writer->Write(m);
    writer->WritesDone();
    TALLY_RETURN_IF_ERROR(FromGrpc(writer->Finish()));
    return resp.taken();
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(offer(cpp, std::vector<float>(10, 0.5f)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("was not asked for")));
  EXPECT_THAT(offer(py, {0, 0, 0, nan, 0, 0, 0, 0, 0, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("initial weight 3 is not finite")));
  EXPECT_THAT(offer(py, std::vector<float>(6, 0.5f)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cover 6 of the model's 10 values")));
  EXPECT_FALSE(heartbeat(py).has_assignment());
  absl::StatusOr<bool> taken = offer(py, std::vector<float>(10, 0.5f));
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(*taken);
  for (int i = 0; i < 500 && !r.has_assignment(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    r = heartbeat(py);
  }
  ASSERT_TRUE(r.has_assignment());
  EXPECT_FALSE(r.has_initial_weights());
  EXPECT_THAT(offer(py, std::vector<float>(10, 0.25f)),
              HasReason(absl::StatusCode::kAlreadyExists, v1::WEIGHTS_GIVEN));
}

// An offer of initial weights that its sender holds open keeps the job's
// one place for offers (a second is refused before anything is read),
// and ends when the job is cancelled: the stream is finished then, with
// JOB_ENDED, and the coordinator holds nothing of it any more.
TEST_F(ServiceTest, AnOfferHeldOpenIsTheJobsOnlyOneAndEndsWithTheJob) {
  v1::SubmitJobRequest sub;
  sub.set_spec(
      "name: py\nmodel: {python: {file: m.py, code: 'import torch', params: "
      "[{name: fc.weight, shape: [2, 4]}, {name: fc.bias, shape: [2]}]}}\n"
      "dataset: {name: synthetic, features: 4, classes: 2}\n"
      "training: {workers: 1}\noptimizer: {type: sgd, lr: 1.0}\n");
  v1::SubmitJobResponse job;
  ASSERT_TRUE(jobs_->SubmitJob(Ctx().get(), sub, &job).ok());
  v1::RegisterWorkerRequest reg;
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  reg.set_name("py");
  reg.set_python("Python 3, PyTorch");
  v1::RegisterWorkerResponse py;
  ASSERT_TRUE(workers_->RegisterWorker(Ctx().get(), reg, &py).ok());
  v1::HeartbeatRequest hb;
  hb.set_worker_id(py.worker_id());
  hb.set_incarnation(py.incarnation());
  v1::HeartbeatResponse beat;
  ASSERT_TRUE(workers_->Heartbeat(Ctx().get(), hb, &beat).ok());
  ASSERT_TRUE(beat.has_initial_weights());
  v1::InitialWeightsChunk first;
  first.set_job_id(job.job().id());
  first.set_worker_id(py.worker_id());
  first.set_incarnation(py.incarnation());
  *first.mutable_chunk() = Chunk(0, std::vector<float>(4, 0.5f));
  // The held offer: its first part sent, the rest never.
  auto held_ctx = Ctx();
  v1::OfferInitialWeightsResponse held_resp;
  auto held = workers_->OfferInitialWeights(held_ctx.get(), &held_resp);
  ASSERT_TRUE(held->Write(first));
  for (int i = 0; i < 500 && server_->coordinator()->offers().size() == 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(server_->coordinator()->offers().size(), 1);
  EXPECT_EQ(server_->coordinator()->offers().bytes(), 40);
  // Another offer of the job, whole, is refused before it is read.
  auto ctx = Ctx();
  v1::OfferInitialWeightsResponse resp;
  auto again = workers_->OfferInitialWeights(ctx.get(), &resp);
  *first.mutable_chunk() = Chunk(0, std::vector<float>(10, 0.5f));
  again->Write(first);
  again->WritesDone();
  EXPECT_THAT(FromGrpc(again->Finish()),
              HasReason(absl::StatusCode::kResourceExhausted, v1::OFFER_BUSY));
  // Cancelled: the held stream ends now, with the job's reason (not at
  // its deadline, DEADLINE_EXCEEDED).
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.job().id());
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), cancel, &cancelled).ok());
  EXPECT_THAT(FromGrpc(held->Finish()),
              HasReason(absl::StatusCode::kFailedPrecondition, v1::JOB_ENDED));
  for (int i = 0; i < 500 && server_->coordinator()->offers().size() > 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(server_->coordinator()->offers().size(), 0);
  EXPECT_EQ(server_->coordinator()->offers().bytes(), 0);
}

TEST_F(ServiceTest, ASyncStepOverTheWire) {
  StartJob();
  auto w0 = Pull(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  EXPECT_EQ(w0->first, 0);
  auto pushed = Push(FullPush(0, 0.5f));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(pushed->duplicate());
  EXPECT_EQ(pushed->version(), 0);  // staged until the pull commits it
  auto w1 = Pull(1);
  ASSERT_TRUE(w1.ok());
  for (int i = 0; i < kParams; ++i)
    EXPECT_FLOAT_EQ(w1->second[i], w0->second[i] - 0.5f);
  // The same push again: acknowledged, ignored.
  auto again = Push(FullPush(0, 0.5f));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->duplicate());
  EXPECT_EQ(Pull(1)->second, w1->second);
  // Fetch gives the same weights under PyTorch names.
  grpc::ClientContext ctx;
  v1::FetchWeightsRequest f;
  f.set_job_id(job_);
  auto reader = jobs_->FetchWeights(&ctx, f);
  v1::FileChunk chunk;
  std::string bytes;
  while (reader->Read(&chunk)) bytes += chunk.data();
  ASSERT_TRUE(reader->Finish().ok());
  auto tensors = DecodeSafetensors(bytes);
  ASSERT_TRUE(tensors.ok());
  EXPECT_EQ(tensors->at("0.weight").shape, (Shape{2, 4}));
  EXPECT_FLOAT_EQ(tensors->at("0.bias").data[1], w1->second[9]);
}

TEST_F(ServiceTest, BadPushesGetSpecificStatusesAndChangeNothing) {
  StartJob();
  auto before = Pull(0);
  ASSERT_TRUE(before.ok());
  // No header.
  v1::PushRequest no_header;
  *no_header.mutable_chunk() = Chunk(0, {1});
  EXPECT_THAT(Push({no_header}), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("header")));
  // Empty stream.
  EXPECT_THAT(Push({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("empty push")));
  // Offset outside the vector.
  auto m = Header(0);
  *m.mutable_chunk() = Chunk(8, {1, 1, 1});
  EXPECT_THAT(Push({m}), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("outside the 10-element")));
  // Count and bytes disagree.
  m = Header(0);
  *m.mutable_chunk() = Chunk(0, {1, 1, 1});
  m.mutable_chunk()->set_count(4);
  EXPECT_THAT(Push({m}), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("carries 12 bytes")));
  // Does not cover the whole vector.
  m = Header(0);
  *m.mutable_chunk() = Chunk(0, std::vector<float>(9, 1.0f));
  EXPECT_THAT(Push({m}), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("covers 9 of 10")));
  // Wrong step bookkeeping: the typed reason crosses the wire, with the
  // step it refers to.
  auto ahead = Push(FullPush(5, 1.0f));
  EXPECT_THAT(ahead, HasReason(absl::StatusCode::kAborted, v1::STEP_NOT_OPEN));
  EXPECT_EQ(ReasonStep(ahead.status()), 0);
  auto stale = FullPush(0, 1.0f);
  stale[0].mutable_header()->set_incarnation(worker_.incarnation() + 9);
  EXPECT_THAT(Push(stale), HasReason(absl::StatusCode::kFailedPrecondition,
                                     v1::REGISTER_AGAIN));
  // An oversized message is refused by gRPC itself.
  m = Header(0);
  *m.mutable_chunk() = Chunk(0, std::vector<float>(2 << 20, 1.0f));  // 8 MiB
  EXPECT_THAT(Push({m}),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::_));
  // None of that moved the weights or the step.
  auto after = Pull(0);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->first, 0);
  EXPECT_EQ(after->second, before->second);
  EXPECT_EQ(Job().metrics().rejected_pushes(), 0);
}

TEST_F(ServiceTest, NonFiniteGradientIsRejectedAndCountedAndTheStepGoesOn) {
  StartJob();
  auto before = Pull(0);
  auto nan = FullPush(0, 1.0f);
  std::vector<float> bad = {1, 1, std::numeric_limits<float>::quiet_NaN(), 1};
  *nan[1].mutable_chunk() = Chunk(6, bad);
  auto refused = Push(nan);
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("non-finite gradient value (nan) at element 8")));
  EXPECT_THAT(refused,
              HasReason(absl::StatusCode::kInvalidArgument, v1::NON_FINITE));
  EXPECT_EQ(Job().metrics().rejected_pushes(), 1);
  // The only member's step closed without its gradient: the weights stand.
  auto after = Pull(1);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->second, before->second);
  // Its step 0 is settled: a retry is acknowledged as a duplicate, ignored.
  auto retry = Push(FullPush(0, 1.0f));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->duplicate());
  EXPECT_EQ(Pull(1)->second, before->second);
}

TEST_F(ServiceTest, APushThatIsItsOwnCommitClosesTheStepWithoutAPullCommit) {
  StartJob();
  auto w0 = Pull(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  // A pull of the next version sent before the push (as a one-shard
  // worker does) waits for the step to close.
  auto early = std::async(std::launch::async, [&] {
    return Pull(1, /*wait_ms=*/5000, /*send_commit=*/false);
  });
  auto push = FullPush(0, 0.5f);
  push[0].mutable_header()->set_commit(true);
  auto pushed = Push(push);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(pushed->committed());
  EXPECT_FALSE(pushed->duplicate());
  EXPECT_EQ(pushed->version(), 1);  // the only member's commit closed it
  auto w1 = early.get();
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->first, 1);
  for (int i = 0; i < kParams; ++i)
    EXPECT_EQ(w1->second[i], w0->second[i] - 0.5f);
  // Sent again (its answer lost): a duplicate, still committed, and the
  // weights move once.
  auto again = Push(push);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->duplicate());
  EXPECT_TRUE(again->committed());
  EXPECT_EQ(Pull(1, 2000, false)->second, w1->second);
  // A plain push is not committed by itself: its step waits for the pull.
  auto plain = Push(FullPush(1, 0.25f));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->committed());
  EXPECT_EQ(plain->version(), 1);
  EXPECT_THAT(Pull(2, /*wait_ms=*/200, /*send_commit=*/false),
              StatusIs(absl::StatusCode::kDeadlineExceeded, ::testing::_));
  auto w2 = Pull(2);
  ASSERT_TRUE(w2.ok()) << w2.status();
  for (int i = 0; i < kParams; ++i)
    EXPECT_EQ(w2->second[i], w1->second[i] - 0.25f);
  // A refused push that is its own commit closes its step as nothing.
  auto nan = FullPush(2, 1.0f);
  nan[0].mutable_header()->set_commit(true);
  std::vector<float> bad = {1, std::numeric_limits<float>::infinity(), 1, 1};
  *nan[1].mutable_chunk() = Chunk(6, bad);
  EXPECT_THAT(Push(nan),
              HasReason(absl::StatusCode::kInvalidArgument, v1::NON_FINITE));
  auto w3 = Pull(3, 2000, false);
  ASSERT_TRUE(w3.ok()) << w3.status();
  EXPECT_EQ(w3->first, 3);
  EXPECT_EQ(w3->second, w2->second);
}

TEST_F(ServiceTest, APushStreamBrokenMidwayStagesNothingAndItsRetryCountsOnce) {
  StartJob();
  auto w0 = Pull(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  for (bool commit : {false, true}) {
    SCOPED_TRACE(commit ? "the push is its own commit" : "a plain push");
    const int64_t step = commit ? 1 : 0;
    auto push = FullPush(step, 0.5f);
    push[0].mutable_header()->set_commit(commit);
    {
      // The header and the first chunk go; then the call is cancelled.
      auto ctx = Ctx();
      v1::PushResponse resp;
      auto w = params_->PushGradients(ctx.get(), &resp);
      ASSERT_TRUE(w->Write(push[0]));
      absl::SleepFor(absl::Milliseconds(100));  // the shard reads it
      ctx->TryCancel();
      EXPECT_THAT(FromGrpc(w->Finish()),
                  StatusIs(absl::StatusCode::kCancelled, ::testing::_));
    }
    // Nothing was staged: the retry is the push's first arrival ...
    auto retried = Push(push);
    ASSERT_TRUE(retried.ok()) << retried.status();
    EXPECT_FALSE(retried->duplicate());
    EXPECT_EQ(retried->committed(), commit);
    // ... and a second retry (its answer lost) changes nothing.
    auto again = Push(push);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->duplicate());
    // The step's gradient counted once: neither the broken push's first
    // chunk nor the second retry. (The plain push is committed by this
    // pull; the other committed itself.)
    auto next = Pull(step + 1, 2000, /*send_commit=*/!commit);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->first, step + 1);
    for (int i = 0; i < kParams; ++i) {
      EXPECT_EQ(next->second[i],
                commit ? (w0->second[i] - 0.5f) - 0.5f : w0->second[i] - 0.5f);
    }
  }
}

// An Exchange stream, driven through the generated classes (so the shard's
// hand-written answers parse as the .proto's ExchangeResponse, and the
// generated ExchangeRequest bytes are what it reads).
class ExchangeStream {
 public:
  ExchangeStream(v1::ParameterService::Stub* stub, absl::Duration timeout)
      : ctx_(std::make_unique<grpc::ClientContext>()) {
    ctx_->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    rw_ = stub->Exchange(ctx_.get());
  }
  bool Write(const v1::ExchangeRequest& m) { return rw_->Write(m); }
  // The push's answer; nullopt if the stream ended instead.
  std::optional<v1::PushResponse> ReadPushAnswer() {
    v1::ExchangeResponse r;
    if (!rw_->Read(&r)) return std::nullopt;
    EXPECT_TRUE(r.has_push());
    EXPECT_FALSE(r.has_chunk());
    return r.push();
  }
  // A pull's answers: the version and the weights; nullopt if the stream
  // ended first.
  std::optional<std::pair<int64_t, std::vector<float>>> ReadWeights(int n) {
    std::vector<float> w(n);
    int64_t version = -1, got = 0;
    while (got < n) {
      v1::ExchangeResponse r;
      if (!rw_->Read(&r)) return std::nullopt;
      EXPECT_FALSE(r.has_push());
      EXPECT_EQ(r.chunk().data().size(), r.chunk().count() * 4);
      std::memcpy(w.data() + r.chunk().offset(), r.chunk().data().data(),
                  r.chunk().data().size());
      got += r.chunk().count();
      version = r.version();
    }
    return std::make_pair(version, w);
  }
  // The next answer, whatever it is; nullopt if the stream ended.
  std::optional<v1::ExchangeResponse> Read() {
    v1::ExchangeResponse r;
    if (!rw_->Read(&r)) return std::nullopt;
    return r;
  }
  absl::Status Finish() {
    rw_->WritesDone();
    return FromGrpc(rw_->Finish());
  }
  void Cancel() { ctx_->TryCancel(); }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ExchangeRequest,
                                           v1::ExchangeResponse>>
      rw_;
};

v1::ExchangeRequest AsExchange(const v1::PushRequest& m, bool done) {
  v1::ExchangeRequest e;
  if (m.has_header()) *e.mutable_header() = m.header();
  if (m.has_chunk()) *e.mutable_chunk() = m.chunk();
  e.set_push_done(done);
  return e;
}

TEST_F(ServiceTest, OneExchangeStreamCarriesEveryStepOfAJob) {
  StartJob();
  ExchangeStream stream(params_.get(), absl::Seconds(20));
  v1::ExchangeRequest pull;
  *pull.mutable_pull() = PullRequest(0);
  pull.mutable_pull()->set_chunk_elements(3);  // 4 messages of weights
  ASSERT_TRUE(stream.Write(pull));
  auto w = stream.ReadWeights(kParams);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->first, 0);
  auto weights_at = [&] {
    auto range = server_->shard_host()->Find(job_);
    EXPECT_TRUE(range.ok()) << range.status();
    int64_t version = 0, total = 0;
    return range->shard->Snapshot(&version, &total)->data();
  };
  for (int64_t step = 0; step < 3; ++step) {
    // The weights this stream pulled are not held once sent: the step
    // moves them in place, without a copy.
    const float* before = weights_at();
    // The push in two messages, the last with push_done. Odd steps: the
    // push is its own commit (as a one-shard worker's), so the step closes
    // while the stream's last pull message may still be in the shard's
    // hands; even steps: the pull of the next version commits it.
    const bool self_commit = step % 2 == 1;
    std::vector<v1::PushRequest> push = FullPush(step, 0.5f);
    push[0].mutable_header()->set_commit(self_commit);
    ASSERT_TRUE(stream.Write(AsExchange(push[0], false)));
    ASSERT_TRUE(stream.Write(AsExchange(push[1], true)));
    auto answer = stream.ReadPushAnswer();
    ASSERT_TRUE(answer.has_value());
    EXPECT_FALSE(answer->duplicate());
    EXPECT_EQ(answer->committed(), self_commit);
    EXPECT_EQ(answer->version(), self_commit ? step + 1 : step);
    *pull.mutable_pull() = PullRequest(step + 1);
    if (!self_commit) {
      pull.mutable_pull()->mutable_commit()->set_step(step);
      pull.mutable_pull()->mutable_commit()->set_contributed(true);
    }
    // One message of 40 bytes: gRPC copies a smaller piece of a slice
    // instead of holding it, and this test is about what is held.
    pull.mutable_pull()->set_chunk_elements(0);
    ASSERT_TRUE(stream.Write(pull));
    auto next = stream.ReadWeights(kParams);
    ASSERT_TRUE(next.has_value());
    EXPECT_EQ(next->first, step + 1);
    for (int i = 0; i < kParams; ++i)
      EXPECT_EQ(next->second[i], w->second[i] - 0.5f) << "step " << step;
    EXPECT_EQ(weights_at(), before) << "step " << step << " copied the weights";
    w = next;
  }
  // A push sent again on the stream (its answer lost) is a duplicate, read
  // no further than its header.
  ASSERT_TRUE(stream.Write(AsExchange(FullPush(2, 9.0f)[0], false)));
  ASSERT_TRUE(stream.Write(AsExchange(FullPush(2, 9.0f)[1], true)));
  auto again = stream.ReadPushAnswer();
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->duplicate());
  EXPECT_TRUE(stream.Finish().ok());
  EXPECT_EQ(Pull(3, 2000, false)->second, w->second);
}

TEST_F(ServiceTest, ExchangeMessagesOutOfTurnEndTheStreamWithTheirCode) {
  StartJob();
  ASSERT_TRUE(Pull(0).ok());
  {
    // A chunk of no push.
    ExchangeStream stream(params_.get(), absl::Seconds(10));
    v1::ExchangeRequest m;
    *m.mutable_chunk() = Chunk(0, {1, 2});
    ASSERT_TRUE(stream.Write(m));
    EXPECT_FALSE(stream.ReadPushAnswer().has_value());
    EXPECT_THAT(stream.Finish(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("a chunk of no push")));
  }
  {
    // A pull inside an open push.
    ExchangeStream stream(params_.get(), absl::Seconds(10));
    ASSERT_TRUE(stream.Write(AsExchange(FullPush(0, 0.5f)[0], false)));
    v1::ExchangeRequest pull;
    *pull.mutable_pull() = PullRequest(0);
    ASSERT_TRUE(stream.Write(pull));
    EXPECT_FALSE(stream.ReadPushAnswer().has_value());
    EXPECT_THAT(stream.Finish(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("a pull inside an open push")));
  }
  {
    // A push while a pull is being answered (its answer would pass the
    // pull's weights).
    ExchangeStream stream(params_.get(), absl::Seconds(10));
    v1::ExchangeRequest pull;
    *pull.mutable_pull() = PullRequest(5);  // waits: step 0 never closed
    pull.mutable_pull()->set_max_wait_ms(5000);
    ASSERT_TRUE(stream.Write(pull));
    ASSERT_TRUE(stream.Write(AsExchange(FullPush(0, 0.5f)[0], false)));
    EXPECT_FALSE(stream.ReadPushAnswer().has_value());
    EXPECT_THAT(stream.Finish(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("a push while a pull is being answered")));
  }
  {
    // push_done with no push.
    ExchangeStream stream(params_.get(), absl::Seconds(10));
    v1::ExchangeRequest m;
    m.set_push_done(true);
    ASSERT_TRUE(stream.Write(m));
    EXPECT_FALSE(stream.ReadPushAnswer().has_value());
    EXPECT_THAT(stream.Finish(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("no push begun")));
  }
  {
    // A NaN: the push's own code ends the stream; counted, and the step
    // closes as nothing once committed so.
    ExchangeStream stream(params_.get(), absl::Seconds(10));
    std::vector<v1::PushRequest> push = FullPush(0, 0.5f);
    *push[1].mutable_chunk() =
        Chunk(6, {1, std::numeric_limits<float>::quiet_NaN(), 1, 1});
    ASSERT_TRUE(stream.Write(AsExchange(push[0], false)));
    ASSERT_TRUE(stream.Write(AsExchange(push[1], true)));
    EXPECT_FALSE(stream.ReadPushAnswer().has_value());
    EXPECT_THAT(stream.Finish(),
                HasReason(absl::StatusCode::kInvalidArgument, v1::NON_FINITE));
  }
  // The server kept serving: the next step goes on a new stream.
  v1::PullRequest req = PullRequest(1);
  req.mutable_commit()->set_step(0);
  req.mutable_commit()->set_contributed(false);
  ExchangeStream stream(params_.get(), absl::Seconds(10));
  v1::ExchangeRequest pull;
  *pull.mutable_pull() = req;
  ASSERT_TRUE(stream.Write(pull));
  auto w = stream.ReadWeights(kParams);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->first, 1);
  EXPECT_TRUE(stream.Finish().ok());
}

TEST_F(ServiceTest, AnExchangeBrokenMidPushStagesNothingAndTheRetryCountsOnce) {
  StartJob();
  auto w0 = Pull(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  std::vector<v1::PushRequest> push = FullPush(0, 0.5f);
  {
    // The header and the first chunk go; then the stream is cancelled.
    ExchangeStream stream(params_.get(), absl::Seconds(10));
    ASSERT_TRUE(stream.Write(AsExchange(push[0], false)));
    absl::SleepFor(absl::Milliseconds(100));  // the shard reads it
    stream.Cancel();
    EXPECT_THAT(stream.Finish(),
                StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  }
  {
    // A stream half-closed in the middle of a push: dropped too.
    ExchangeStream stream(params_.get(), absl::Seconds(10));
    ASSERT_TRUE(stream.Write(AsExchange(push[0], false)));
    EXPECT_TRUE(stream.Finish().ok());
  }
  // Nothing was staged: the retry is the push's first arrival, and the
  // pull that commits it sees the gradient once.
  auto retried = Push(push);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_FALSE(retried->duplicate());
  auto next = Pull(1);
  ASSERT_TRUE(next.ok()) << next.status();
  for (int i = 0; i < kParams; ++i)
    EXPECT_EQ(next->second[i], w0->second[i] - 0.5f);
}

TEST_F(ServiceTest, PullWaitIsBoundedAndTheServerKeepsServing) {
  StartJob();
  EXPECT_THAT(Pull(3, 200), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     HasSubstr("version 3")));
  v1::Job j = Job();
  EXPECT_EQ(j.state(), v1::RUNNING);
  // Watching streams the state; cancelling the job ends the stream.
  grpc::ClientContext ctx;
  v1::WatchJobRequest w;
  w.set_job_id(job_);
  auto reader = jobs_->WatchJob(&ctx, w);
  v1::Job seen;
  ASSERT_TRUE(reader->Read(&seen));
  EXPECT_EQ(seen.state(), v1::RUNNING);
  v1::CancelJobRequest c;
  c.set_job_id(job_);
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), c, &cancelled).ok());
  while (reader->Read(&seen)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(seen.state(), v1::CANCELLED);
}

// bfloat16 on the wire: wrong sizes, unknown dtypes and NaNs are refused.
TEST_F(ServiceTest, MalformedBfloat16PushesAreRefused) {
  StartJob();
  // Wrong byte count for bfloat16 (float32-sized data), and an unknown dtype.
  std::vector<v1::PushRequest> bad = {Header(0)};
  *bad[0].mutable_chunk() = Chunk(0, std::vector<float>(kParams, 0.5f));
  bad[0].mutable_chunk()->set_dtype(v1::BFLOAT16);
  EXPECT_THAT(Push(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("BFLOAT16 elements but carries")));
  bad[0].mutable_chunk()->set_dtype(static_cast<v1::DType>(7));
  EXPECT_THAT(Push(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("unknown tensor dtype 7")));
  // A NaN in bfloat16 is rejected and counted like a float32 one.
  std::vector<float> nan(kParams, 0.5f);
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<v1::PushRequest> with_nan = {Header(0)};
  EncodeChunk(nan.data(), 0, kParams, v1::BFLOAT16,
              with_nan[0].mutable_chunk());
  EXPECT_THAT(Push(with_nan), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("non-finite")));
  EXPECT_EQ(Job().metrics().rejected_pushes(), 1);
}

// A push in half the bytes moves the weights as the float32 push would (0.5
// is exact in bfloat16); a pull in bfloat16 gives the weights rounded.
TEST_F(ServiceTest, Bfloat16PushMovesTheWeightsLikeFloat32) {
  StartJob();
  auto w0 = Pull(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  std::vector<v1::PushRequest> msgs = {Header(0)};
  std::vector<float> g(kParams, 0.5f);
  EncodeChunk(g.data(), 0, kParams, v1::BFLOAT16, msgs[0].mutable_chunk());
  EXPECT_EQ(msgs[0].chunk().data().size(), 2u * kParams);  // half the bytes
  auto pushed = Push(msgs);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  auto w1 = Pull(1);
  ASSERT_TRUE(w1.ok());
  for (int i = 0; i < kParams; ++i)
    EXPECT_FLOAT_EQ(w1->second[i], w0->second[i] - 0.5f);
  // The same weights pulled as bfloat16: each rounded, nothing else.
  grpc::ClientContext ctx;
  v1::PullRequest req = PullRequest(1);
  req.set_dtype(v1::BFLOAT16);
  auto reader = params_->PullWeights(&ctx, req);
  v1::PullResponse resp;
  std::vector<float> got(kParams);
  while (reader->Read(&resp)) {
    ASSERT_EQ(resp.chunk().dtype(), v1::BFLOAT16);
    ASSERT_EQ(resp.chunk().data().size(), 2u * resp.chunk().count());
    DecodeChunk(resp.chunk(), got.data());
  }
  ASSERT_TRUE(reader->Finish().ok());
  for (int i = 0; i < kParams; ++i) {
    char b[2];
    FloatToBfloat16(&w1->second[i], b, 1);
    float want;
    Bfloat16ToFloat(b, &want, 1);
    EXPECT_EQ(got[i], want) << i;
  }
  // An unknown dtype for a pull is refused.
  grpc::ClientContext ctx2;
  req.set_dtype(static_cast<v1::DType>(9));
  auto r2 = params_->PullWeights(&ctx2, req);
  while (r2->Read(&resp)) {
  }
  const grpc::Status st = r2->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("unknown tensor dtype 9"));
}

// A client that gives up on a waiting pull or a watch: the call ends as
// CANCELLED, and the event that would have woken it later (the next version,
// the next job change) finds nothing to wake.
TEST_F(ServiceTest, CancelledPullsAndWatchesEndCleanly) {
  StartJob();
  grpc::ClientContext pull_ctx;
  v1::PullRequest req = PullRequest(1);
  req.set_max_wait_ms(60000);
  auto pull = params_->PullWeights(&pull_ctx, req);
  grpc::ClientContext watch_ctx;
  v1::WatchJobRequest w;
  w.set_job_id(job_);
  auto watch = jobs_->WatchJob(&watch_ctx, w);
  v1::Job seen;
  ASSERT_TRUE(watch->Read(&seen));
  absl::SleepFor(absl::Milliseconds(100));  // the pull is waiting
  pull_ctx.TryCancel();
  watch_ctx.TryCancel();
  v1::PullResponse resp;
  EXPECT_FALSE(pull->Read(&resp));
  EXPECT_EQ(pull->Finish().error_code(), grpc::StatusCode::CANCELLED);
  while (watch->Read(&seen)) {
  }
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Now the events come; the server serves on.
  auto pushed = Push(FullPush(0, 0.25f));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  v1::CancelJobRequest c;
  c.set_job_id(job_);
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), c, &cancelled).ok());
  // The job ended: its data path is closed (clients fetch the weights).
  EXPECT_THAT(Pull(1), HasReason(absl::StatusCode::kFailedPrecondition,
                                 v1::JOB_ENDED));
  EXPECT_EQ(Job().metrics().step(), 0);  // the push was never committed
  EXPECT_THAT(FromGrpc(jobs_->CancelJob(Ctx().get(), c, &cancelled)),
              HasReason(absl::StatusCode::kFailedPrecondition, v1::JOB_ENDED));
}

// A worker's Attend call ends with its process: the coordinator ends its
// lease then (here within a tick or two, where the lease is 30 s), and the
// worker's next heartbeat is told to register again. A stale registration
// is refused at once.
TEST_F(ServiceTest, AnAttendCallThatEndsEndsTheWorkersLease) {
  StartJob();
  v1::AttendRequest stale;
  stale.set_worker_id(worker_.worker_id());
  stale.set_incarnation(worker_.incarnation() + 1);
  auto stale_ctx = Ctx();
  auto refused = workers_->Attend(stale_ctx.get(), stale);
  v1::AttendResponse nothing;
  EXPECT_FALSE(refused->Read(&nothing));
  EXPECT_THAT(FromGrpc(refused->Finish()),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::REGISTER_AGAIN));
  grpc::ClientContext attend_ctx;
  v1::AttendRequest req;
  req.set_worker_id(worker_.worker_id());
  req.set_incarnation(worker_.incarnation());
  auto attend = workers_->Attend(&attend_ctx, req);
  v1::HeartbeatRequest beat;
  beat.set_worker_id(worker_.worker_id());
  beat.set_incarnation(worker_.incarnation());
  v1::HeartbeatResponse answer;
  absl::SleepFor(absl::Milliseconds(300));  // held: the lease stands
  ASSERT_TRUE(workers_->Heartbeat(Ctx().get(), beat, &answer).ok());
  attend_ctx.TryCancel();  // as a killed process's closed connection does
  EXPECT_FALSE(attend->Read(&nothing));
  attend->Finish();
  absl::Status s;
  for (int i = 0; i < 50 && s.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    s = FromGrpc(workers_->Heartbeat(Ctx().get(), beat, &answer));
  }
  EXPECT_THAT(s, HasReason(absl::StatusCode::kFailedPrecondition,
                           v1::REGISTER_AGAIN));
  // Its slot is vacated: the job has no worker left.
  for (int i = 0; i < 50 && Job().metrics().workers() > 0; ++i)
    absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(Job().metrics().workers(), 0);
}

// The coordinator writes an empty message on a held Attend call every
// attend_ping, which keeps a proxy between from ending an idle call; the
// lease stands meanwhile.
TEST_F(ServiceTest, AHeldAttendCallIsPingedAndItsLeaseStands) {
  ServerOptions o;
  o.attend_ping = absl::Milliseconds(200);
  StartServer(o);
  StartJob();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::AttendRequest req;
  req.set_worker_id(worker_.worker_id());
  req.set_incarnation(worker_.incarnation());
  auto attend = workers_->Attend(&ctx, req);
  v1::AttendResponse ping;
  EXPECT_TRUE(attend->Read(&ping));
  EXPECT_TRUE(attend->Read(&ping));
  v1::HeartbeatRequest beat;
  beat.set_worker_id(worker_.worker_id());
  beat.set_incarnation(worker_.incarnation());
  v1::HeartbeatResponse answer;
  EXPECT_TRUE(workers_->Heartbeat(Ctx().get(), beat, &answer).ok());
  ctx.TryCancel();
  attend->Finish();
}

// A coordinator that shuts down ends the Attend calls it holds, saying
// why, instead of waiting out its grace (a minute here) for them.
TEST_F(ServiceTest, AShutdownEndsTheHeldAttendCallsSayingWhy) {
  StartJob();
  grpc::ClientContext ctx;
  v1::AttendRequest req;
  req.set_worker_id(worker_.worker_id());
  req.set_incarnation(worker_.incarnation());
  auto attend = workers_->Attend(&ctx, req);
  absl::SleepFor(absl::Milliseconds(200));  // the call is held
  std::thread stop([this] { server_->Shutdown(absl::Minutes(1)); });
  v1::AttendResponse nothing;
  EXPECT_FALSE(attend->Read(&nothing));
  const grpc::Status st = attend->Finish();
  stop.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), HasSubstr("shutting down"));
}

// A shard process's AttendShard call ends with it: its lease ends, and
// its next heartbeat is told to register again (the lease is 30 s here).
TEST_F(ServiceTest, AnAttendShardCallThatEndsEndsTheShardsLease) {
  auto coordination = v1::CoordinatorService::NewStub(channel_);
  v1::RegisterShardRequest shard;
  shard.set_address("127.0.0.1:1");
  v1::RegisterShardResponse registered;
  ASSERT_TRUE(
      coordination->RegisterShard(Ctx().get(), shard, &registered).ok());
  grpc::ClientContext attend_ctx;
  v1::AttendShardRequest req;
  req.set_shard_id(registered.shard_id());
  req.set_incarnation(registered.incarnation());
  auto attend = coordination->AttendShard(&attend_ctx, req);
  v1::ShardHeartbeatRequest beat;
  beat.set_shard_id(registered.shard_id());
  beat.set_incarnation(registered.incarnation());
  v1::ShardHeartbeatResponse answer;
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(coordination->ShardHeartbeat(Ctx().get(), beat, &answer).ok());
  attend_ctx.TryCancel();
  v1::AttendResponse nothing;
  EXPECT_FALSE(attend->Read(&nothing));
  attend->Finish();
  absl::Status s;
  for (int i = 0; i < 50 && s.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    s = FromGrpc(coordination->ShardHeartbeat(Ctx().get(), beat, &answer));
  }
  EXPECT_THAT(s, HasReason(absl::StatusCode::kFailedPrecondition,
                           v1::REGISTER_AGAIN));
}

// Only the job's members are on its data path, and nobody changes its
// schedule: a registered worker of no job is refused, and so is a member
// that claims another schedule; the job is untouched by either.
TEST_F(ServiceTest, NonMembersAndWrongSchedulesAreRefusedOnTheDataPath) {
  StartJob();
  v1::RegisterWorkerRequest reg;
  reg.set_name("stranger");
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  v1::RegisterWorkerResponse stranger;
  ASSERT_TRUE(workers_->RegisterWorker(Ctx().get(), reg, &stranger).ok());
  v1::PullRequest req = PullRequest(0);
  req.set_worker_id(stranger.worker_id());
  req.set_incarnation(stranger.incarnation());
  req.set_total_steps(1);
  req.set_steps_per_epoch(1);
  auto ctx = Ctx();
  auto r = params_->PullWeights(ctx.get(), req);
  v1::PullResponse resp;
  while (r->Read(&resp)) {
  }
  EXPECT_THAT(FromGrpc(r->Finish()),
              HasReason(absl::StatusCode::kPermissionDenied,
                        v1::NOT_A_MEMBER));
  auto push = FullPush(0, 1.0f);
  push[0].mutable_header()->set_worker_id(stranger.worker_id());
  push[0].mutable_header()->set_incarnation(stranger.incarnation());
  EXPECT_THAT(Push(push), HasReason(absl::StatusCode::kPermissionDenied,
                                    v1::NOT_A_MEMBER));
  // The member, with another dataset's schedule.
  req = PullRequest(0);
  req.set_total_steps(1);
  req.set_steps_per_epoch(1);
  auto ctx2 = Ctx();
  auto r2 = params_->PullWeights(ctx2.get(), req);
  while (r2->Read(&resp)) {
  }
  EXPECT_THAT(FromGrpc(r2->Finish()),
              HasReason(absl::StatusCode::kFailedPrecondition,
                        v1::SCHEDULE_MISMATCH));
  // The job's schedule (4096 samples / 64 per batch) stands.
  EXPECT_EQ(Job().metrics().total_steps(), 64);
  EXPECT_EQ(Job().state(), v1::RUNNING);
  EXPECT_TRUE(Pull(0).ok());
}

TEST_F(ServiceTest, RandomGarbagePushesNeverCrashOrWedgeTheServer) {
  StartJob();
  auto before = Pull(0);
  ASSERT_TRUE(before.ok());
  Rng rng(2024);
  int errors = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<v1::PushRequest> msgs;
    const int n = static_cast<int>(rng.Below(4));
    for (int m = 0; m < n; ++m) {
      v1::PushRequest r;
      if (rng.Below(2) == 0) {
        r = Header(static_cast<int64_t>(rng.Below(5)) - 2,
                   static_cast<int64_t>(rng.Below(8)) - 2);
        if (rng.Below(4) == 0) r.mutable_header()->set_job_id("job-x");
        if (rng.Below(4) == 0)
          r.mutable_header()->set_incarnation(rng.Below(9));
        if (rng.Below(8) == 0) r.mutable_header()->set_loss_sum(NAN);
      }
      if (rng.Below(3) != 0) {
        v1::TensorChunk* c = r.mutable_chunk();
        c->set_offset(static_cast<int64_t>(rng.Below(30)) - 10);
        c->set_count(static_cast<int64_t>(rng.Below(25)) - 5);
        std::string bytes(rng.Below(60), '\0');
        for (char& b : bytes) b = static_cast<char>(rng.Below(256));
        c->set_data(bytes);
      }
      msgs.push_back(r);
    }
    if (!Push(msgs).ok()) ++errors;
  }
  EXPECT_GT(errors, 250);  // almost all of it is refused
  // The server still answers, and a well-formed step still works.
  v1::Job j = Job();
  EXPECT_EQ(j.state(), v1::RUNNING);
  auto now = Pull(0);
  ASSERT_TRUE(now.ok()) << now.status();
  auto ok = Push(FullPush(now->first, 0.25f));
  EXPECT_TRUE(ok.ok() || absl::IsAborted(ok.status())) << ok.status();
}

// Two workers, whose shard sums each push as it arrives, element by element
// in rank order: the higher rank's push waits on the wire (the shard stops
// reading it) until the lower rank's values are in, and is answered then;
// one cancelled while it waits ends CANCELLED, and the job goes on.
TEST_F(ServiceTest, AHigherRankPushWaitsOnTheWireForTheLowerOne) {
  // A server whose shard sums even this small model's pushes as they come
  // (by default it stages ranges under 16 MiB).
  server_.reset();
  ServerOptions so;
  so.coordinator.lease_timeout = absl::Seconds(30);
  so.streamed_sums_min_bytes = 0;
  auto started = TallyServer::Start("127.0.0.1:0", so);
  ASSERT_TRUE(started.ok()) << started.status();
  server_ = *std::move(started);
  channel_ = Dial(absl::StrCat("127.0.0.1:", server_->port()));
  jobs_ = v1::JobService::NewStub(channel_);
  workers_ = v1::WorkerService::NewStub(channel_);
  params_ = v1::ParameterService::NewStub(
      Dial(absl::StrCat("127.0.0.1:", server_->data_port())));
  v1::SubmitJobRequest req;
  std::string spec = kSpec;
  spec.replace(spec.find("workers: 1"), 10, "workers: 2");
  req.set_spec(spec);
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(jobs_->SubmitJob(Ctx().get(), req, &submitted).ok());
  job_ = submitted.job().id();
  v1::RegisterWorkerResponse ws[2];
  for (auto& w : ws) {
    v1::RegisterWorkerRequest reg;
    reg.set_name("t");
    reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
    ASSERT_TRUE(workers_->RegisterWorker(Ctx().get(), reg, &w).ok());
  }
  auto rank_of = [&](const v1::RegisterWorkerResponse& w) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(w.worker_id());
    hb.set_incarnation(w.incarnation());
    v1::HeartbeatResponse resp;
    EXPECT_TRUE(workers_->Heartbeat(Ctx().get(), hb, &resp).ok());
    EXPECT_TRUE(resp.has_assignment());
    return resp.assignment().rank();
  };
  const int first = rank_of(ws[0]) == 0 ? 0 : 1;
  const v1::RegisterWorkerResponse low = ws[first], high = ws[1 - first];
  ASSERT_EQ(rank_of(high), 1);
  worker_ = low;
  auto w0 = Pull(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  worker_ = high;
  ASSERT_TRUE(Pull(0).ok());
  auto self_committed = [&](int64_t step, float value) {
    auto push = FullPush(step, value);
    push[0].mutable_header()->set_commit(true);
    return push;
  };

  // Step 0: the higher rank's whole push goes first, on a stream, in one
  // message that also asks for the weights there are (so the pull, begun
  // when the message is resumed, is ready at once on the resuming thread).
  ExchangeStream stream(params_.get(), absl::Seconds(20));
  v1::ExchangeRequest whole;
  *whole.mutable_header() = self_committed(0, 0.5f)[0].header();
  *whole.mutable_chunk() = Chunk(0, std::vector<float>(kParams, 0.5f));
  whole.set_push_done(true);
  *whole.mutable_pull() = PullRequest(0);
  ASSERT_TRUE(stream.Write(whole));
  auto answer = std::async(std::launch::async,
                           [&] { return stream.ReadPushAnswer(); });
  EXPECT_EQ(answer.wait_for(std::chrono::milliseconds(300)),
            std::future_status::timeout)
      << "answered before the lower rank's values were in";
  worker_ = low;
  auto low0 = Push(self_committed(0, 1.5f));
  ASSERT_TRUE(low0.ok()) << low0.status();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(10)),
            std::future_status::ready);
  std::optional<v1::PushResponse> a = answer.get();
  ASSERT_TRUE(a.has_value());
  EXPECT_FALSE(a->duplicate());
  EXPECT_TRUE(a->committed());
  auto pulled = stream.ReadWeights(kParams);
  ASSERT_TRUE(pulled.has_value());
  EXPECT_EQ(pulled->first, 0);  // asked while step 0 was open
  auto w1 = Pull(1, 2000, /*send_commit=*/false);
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->first, 1);
  for (int i = 0; i < kParams; ++i) {  // mean (4 * 0.5 + 4 * 1.5) / 8, lr 1
    EXPECT_EQ(w1->second[i], w0->second[i] - 1.0f);
    EXPECT_EQ(pulled->second[i], w0->second[i]);
  }

  // Step 1: the higher rank's push waits, and is cancelled meanwhile.
  worker_ = high;
  {
    auto ctx = Ctx();
    v1::PushResponse resp;
    auto w = params_->PushGradients(ctx.get(), &resp);
    for (const auto& m : self_committed(1, 0.5f)) ASSERT_TRUE(w->Write(m));
    w->WritesDone();
    absl::SleepFor(absl::Milliseconds(200));  // read, and waiting
    ctx->TryCancel();
    EXPECT_THAT(FromGrpc(w->Finish()),
                StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  }
  worker_ = low;
  ASSERT_TRUE(Push(self_committed(1, 1.5f)).ok());
  worker_ = high;
  auto again = Push(self_committed(1, 0.5f));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->duplicate());
  auto w2 = Pull(2, 2000, /*send_commit=*/false);
  ASSERT_TRUE(w2.ok()) << w2.status();
  EXPECT_EQ(w2->first, 2);
  for (int i = 0; i < kParams; ++i)
    EXPECT_EQ(w2->second[i], w0->second[i] - 2.0f);
  EXPECT_TRUE(stream.Finish().ok());
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// A stream that asked for shared memory with its first pull: the offer,
// mapped as a worker maps it, then the pull's weights.
struct SharedStream {
  std::unique_ptr<ExchangeStream> stream;
  v1::SharedMemoryOffer offer;
  std::unique_ptr<SharedRegion> region;
};

class SharedMemoryTest : public ServiceTest {
 protected:
  SharedStream Open(bool reply = true) {
    // The streams before it have ended; their regions go as the shard
    // retires them (at most two live a worker).
    for (int i = 0; i < 100 && server_->shard_host()->shared_regions() > 0; ++i)
      absl::SleepFor(absl::Milliseconds(20));
    SharedStream s;
    s.stream = std::make_unique<ExchangeStream>(params_.get(), absl::Seconds(20));
    v1::ExchangeRequest pull;
    *pull.mutable_pull() = PullRequest(0);
    pull.mutable_pull()->set_offer_shared_memory(true);
    EXPECT_TRUE(s.stream->Write(pull));
    std::optional<v1::ExchangeResponse> offer = s.stream->Read();
    EXPECT_TRUE(offer.has_value() && offer->has_shared());
    if (!offer.has_value()) return s;
    EXPECT_FALSE(offer->has_chunk());  // alone in its message
    s.offer = offer->shared();
    absl::StatusOr<std::unique_ptr<SharedRegion>> r = SharedRegion::Map(s.offer);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) s.region = *std::move(r);
    EXPECT_TRUE(s.stream->ReadWeights(kParams).has_value());
    if (reply) {
      v1::ExchangeRequest m;
      m.mutable_shared()->set_mapped(true);
      EXPECT_TRUE(s.stream->Write(m));
    }
    return s;
  }

  // Writes `values` at the region's push part and pushes step `step` from
  // there, in one message.
  static v1::ExchangeRequest SharedPush(v1::PushRequest header,
                                        const SharedRegion& region,
                                        const std::vector<float>& values,
                                        int64_t at) {
    std::memcpy(region.data() + at, values.data(), 4 * values.size());
    v1::ExchangeRequest m = AsExchange(header, true);
    v1::TensorChunk* c = m.mutable_chunk();
    c->set_offset(0);
    c->set_count(static_cast<int64_t>(values.size()));
    c->set_shared_offset(at);
    return m;
  }

  // Three steps in float32 and one in bfloat16, pushed from the region and
  // pulled into it, checked against the weights the SGD rule makes.
  void PushAndPullThroughTheRegion();
};

TEST_F(SharedMemoryTest, AWorkerOnTheShardsHostPushesAndPullsThroughIt) {
  StartJob();
  absl::StatusOr<Range> range = server_->shard_host()->Find(job_);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_FALSE(range->shard->StreamsPushes());
  PushAndPullThroughTheRegion();
}

// The same when the shard adds each push to the step's sum as it arrives
// (a small range streams when many workers would stage on it).
TEST_F(SharedMemoryTest, AStreamedRangeTakesPushesFromTheRegion) {
  ServerOptions streams;
  streams.streamed_sums_min_bytes = 0;
  StartServer(streams);
  StartJob();
  absl::StatusOr<Range> range = server_->shard_host()->Find(job_);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_TRUE(range->shard->StreamsPushes());
  PushAndPullThroughTheRegion();
}

void SharedMemoryTest::PushAndPullThroughTheRegion() {
  SharedStream s = Open();
  ASSERT_NE(s.region, nullptr);
  EXPECT_EQ(s.offer.pid(), getpid());
  EXPECT_GE(s.offer.pull_at() - s.offer.push_at(), kParams * 4);
  auto w = Pull(0);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> expect = w->second;
  for (int64_t step = 0; step < 3; ++step) {
    // Generated classes on both ends: the chunk carries no data, only
    // where its values lie.
    std::vector<float> grad(kParams);
    for (int i = 0; i < kParams; ++i) grad[i] = 0.25f * (i + 1) + step;
    ASSERT_TRUE(s.stream->Write(
        SharedPush(Header(step), *s.region, grad, s.offer.push_at())));
    auto answer = s.stream->ReadPushAnswer();
    ASSERT_TRUE(answer.has_value());
    EXPECT_FALSE(answer->duplicate());
    v1::ExchangeRequest pull;
    *pull.mutable_pull() = PullRequest(step + 1);
    pull.mutable_pull()->mutable_commit()->set_step(step);
    pull.mutable_pull()->mutable_commit()->set_contributed(true);
    pull.mutable_pull()->set_into_shared_memory(true);
    ASSERT_TRUE(s.stream->Write(pull));
    auto r = s.stream->Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->version(), step + 1);
    ASSERT_TRUE(r->chunk().has_shared_offset());
    EXPECT_EQ(r->chunk().shared_offset(), s.offer.pull_at());
    EXPECT_EQ(r->chunk().offset(), 0);
    EXPECT_EQ(r->chunk().count(), kParams);
    EXPECT_TRUE(r->chunk().data().empty());
    std::vector<float> got(kParams);
    std::memcpy(got.data(), s.region->data() + s.offer.pull_at(), 4 * kParams);
    for (int i = 0; i < kParams; ++i) expect[i] -= grad[i];  // sgd, lr 1
    EXPECT_EQ(got, expect) << "step " << step;
    // The same weights over TCP.
    EXPECT_EQ(Pull(step + 1, 2000, false)->second, expect);
  }
  // bfloat16 both ways: two bytes a value, where float32 would lie.
  std::vector<float> grad(kParams, 0.5f);
  std::vector<uint16_t> wire(kParams);
  FloatToBfloat16(grad.data(), reinterpret_cast<char*>(wire.data()), kParams);
  std::memcpy(s.region->data() + s.offer.push_at(), wire.data(), 2 * kParams);
  v1::ExchangeRequest push = AsExchange(Header(3), true);
  push.mutable_chunk()->set_count(kParams);
  push.mutable_chunk()->set_dtype(v1::BFLOAT16);
  push.mutable_chunk()->set_shared_offset(s.offer.push_at());
  ASSERT_TRUE(s.stream->Write(push));
  ASSERT_TRUE(s.stream->ReadPushAnswer().has_value());
  v1::ExchangeRequest pull;
  *pull.mutable_pull() = PullRequest(4);
  pull.mutable_pull()->mutable_commit()->set_step(3);
  pull.mutable_pull()->mutable_commit()->set_contributed(true);
  pull.mutable_pull()->set_into_shared_memory(true);
  pull.mutable_pull()->set_dtype(v1::BFLOAT16);
  ASSERT_TRUE(s.stream->Write(pull));
  auto r = s.stream->Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->chunk().dtype(), v1::BFLOAT16);
  std::vector<float> got(kParams), want(kParams);
  Bfloat16ToFloat(s.region->data() + r->chunk().shared_offset(), got.data(),
                  kParams);
  for (int i = 0; i < kParams; ++i) expect[i] -= 0.5f;
  FloatToBfloat16(expect.data(), reinterpret_cast<char*>(wire.data()), kParams);
  Bfloat16ToFloat(reinterpret_cast<const char*>(wire.data()), want.data(),
                  kParams);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(s.stream->Finish().ok());
}

TEST_F(SharedMemoryTest, MisuseEndsTheStreamWithItsCodeAndTheServerKeepsServing) {
  StartJob();
  ASSERT_TRUE(Pull(0).ok());
  auto expect_refused = [&](SharedStream& s, const v1::ExchangeRequest& m,
                            const std::string& why) {
    ASSERT_TRUE(s.stream->Write(m));
    EXPECT_FALSE(s.stream->Read().has_value()) << why;
    EXPECT_THAT(s.stream->Finish(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)));
  };
  {
    // No region: a chunk or a pull that names one, a reply to nothing.
    SharedStream s;
    s.stream = std::make_unique<ExchangeStream>(params_.get(), absl::Seconds(10));
    v1::ExchangeRequest m = AsExchange(Header(0), true);
    m.mutable_chunk()->set_count(kParams);
    m.mutable_chunk()->set_shared_offset(64);
    expect_refused(s, m, "no region mapped");
    s.stream = std::make_unique<ExchangeStream>(params_.get(), absl::Seconds(10));
    v1::ExchangeRequest pull;
    *pull.mutable_pull() = PullRequest(0);
    pull.mutable_pull()->set_into_shared_memory(true);
    expect_refused(s, pull, "no region mapped");
    s.stream = std::make_unique<ExchangeStream>(params_.get(), absl::Seconds(10));
    v1::ExchangeRequest reply;
    reply.mutable_shared()->set_mapped(true);
    expect_refused(s, reply, "no offer");
  }
  {
    // Offered but not yet said mapped.
    SharedStream s = Open(/*reply=*/false);
    ASSERT_NE(s.region, nullptr);
    // Sealed: the worker cannot shrink it under the shard.
    const std::string path =
        absl::StrCat("/proc/", s.offer.pid(), "/fd/", s.offer.fd());
    const int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    EXPECT_NE(ftruncate(fd, 0), 0);
    EXPECT_EQ(errno, EPERM);
    close(fd);
    expect_refused(s,
                   SharedPush(Header(0), *s.region,
                              std::vector<float>(kParams, 1), s.offer.push_at()),
                   "no region mapped");
  }
  {
    // Outside the push part: in the pull part, past the end, a count that
    // overflows.
    for (int64_t at : {int64_t{-2}, int64_t{-1}, int64_t{0}, int64_t{8}}) {
      SharedStream s = Open();
      ASSERT_NE(s.region, nullptr);
      int64_t offset = at == -2   ? s.offer.push_at() - 4  // on the token
                       : at == -1 ? s.offer.pull_at()
                                  : s.offer.size() - at;
      v1::ExchangeRequest m = AsExchange(Header(0), true);
      m.mutable_chunk()->set_count(kParams);
      m.mutable_chunk()->set_shared_offset(offset);
      expect_refused(s, m, "outside the shared region's part for pushes");
    }
    SharedStream s = Open();
    v1::ExchangeRequest m = AsExchange(Header(0), true);
    m.mutable_chunk()->set_count(int64_t{1} << 62);
    m.mutable_chunk()->set_shared_offset(s.offer.push_at());
    expect_refused(s, m, "outside the shared region's part for pushes");
  }
  {
    // Values in both places; a second reply.
    SharedStream s = Open();
    v1::ExchangeRequest m = AsExchange(Header(0), true);
    *m.mutable_chunk() = Chunk(0, std::vector<float>(kParams, 1));
    m.mutable_chunk()->set_shared_offset(s.offer.push_at());
    expect_refused(s, m, "both in data and in shared memory");
    SharedStream t = Open();
    v1::ExchangeRequest reply;
    reply.mutable_shared()->set_mapped(true);
    expect_refused(t, reply, "a second SharedMemoryReply");
  }
  {
    // A NaN in shared memory is a NaN: refused and counted.
    SharedStream s = Open();
    std::vector<float> grad(kParams, 1);
    grad[3] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_TRUE(s.stream->Write(
        SharedPush(Header(0), *s.region, grad, s.offer.push_at())));
    EXPECT_FALSE(s.stream->Read().has_value());
    EXPECT_THAT(s.stream->Finish(),
                HasReason(absl::StatusCode::kInvalidArgument, v1::NON_FINITE));
  }
  // PushGradients has no region.
  std::vector<v1::PushRequest> push = FullPush(0, 0.5f);
  push[0].mutable_chunk()->set_shared_offset(64);
  EXPECT_THAT(Push(push), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("outside an Exchange stream")));
  // The server kept serving: the NaN's step closes as nothing.
  v1::PullRequest req = PullRequest(1);
  req.mutable_commit()->set_step(0);
  req.mutable_commit()->set_contributed(false);
  req.set_max_wait_ms(5000);
  auto ctx = Ctx();
  auto r = params_->PullWeights(ctx.get(), req);
  v1::PullResponse resp;
  ASSERT_TRUE(r->Read(&resp));
  EXPECT_EQ(resp.version(), 1);
}

TEST_F(SharedMemoryTest, AWorkerThatCannotMapItOrAShardThatWillNotGoesOnOverTcp) {
  StartJob();
  {
    // Declined: the shard lets go of the region, and the stream carries
    // every step as bytes.
    SharedStream s = Open(/*reply=*/false);
    v1::ExchangeRequest m;
    m.mutable_shared()->set_mapped(false);
    m.mutable_shared()->set_error("another host");
    ASSERT_TRUE(s.stream->Write(m));
    std::vector<v1::PushRequest> push = FullPush(0, 0.5f);
    ASSERT_TRUE(s.stream->Write(AsExchange(push[0], false)));
    ASSERT_TRUE(s.stream->Write(AsExchange(push[1], true)));
    ASSERT_TRUE(s.stream->ReadPushAnswer().has_value());
    EXPECT_TRUE(s.stream->Finish().ok());
  }
  // The region went at the decline (and would at the stream's end).
  EXPECT_EQ(server_->shard_host()->shared_regions(), 0);
  EXPECT_EQ(server_->shard_host()->shared_pushed_bytes(), 0);
  // A shard that shares nothing answers the pull alone (the job again on
  // such a server: its worker commits step 0 without a push, which closes
  // it as nothing).
  ServerOptions shares_nothing;
  shares_nothing.shared_memory_max_bytes = 0;
  StartServer(shares_nothing);
  StartJob();
  ExchangeStream stream(params_.get(), absl::Seconds(10));
  v1::ExchangeRequest pull;
  *pull.mutable_pull() = PullRequest(1);
  pull.mutable_pull()->mutable_commit()->set_step(0);
  pull.mutable_pull()->mutable_commit()->set_contributed(true);
  pull.mutable_pull()->set_offer_shared_memory(true);
  ASSERT_TRUE(stream.Write(pull));
  auto first = stream.Read();
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(first->has_shared());
  EXPECT_EQ(first->version(), 1);
  EXPECT_EQ(first->chunk().count(), kParams);
  EXPECT_TRUE(stream.Finish().ok());
}

// A worker that dials its shard over IPv6 loopback is on its host too.
class SharedMemoryOverIpv6Test : public SharedMemoryTest {
 protected:
  void SetUp() override {
    host_ = "[::1]";
    SharedMemoryTest::SetUp();
  }
};

TEST_F(SharedMemoryOverIpv6Test, IsOffered) {
  StartJob();
  SharedStream s = Open();
  ASSERT_NE(s.region, nullptr);
  EXPECT_EQ(server_->shard_host()->shared_regions(), 1);
  EXPECT_TRUE(s.stream->Finish().ok());
}

}  // namespace
}  // namespace tally
