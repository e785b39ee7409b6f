// A swarm of light workers in one process, for what a coordinator and its
// shards cost as the number of workers grows (bench/swarm.sh, and the swarm
// test). Each light worker is what tally-worker is to the servers, without
// a model: it has connections of its own (to the coordinator and to every
// shard), registers, heartbeats as the daemon does (every quarter lease,
// its step times and job), and when assigned drives the job through the
// worker's own ParameterClient: push step t (a gradient made once, one
// sample) and pull version t + 1, as tally-worker does (on one shard the
// push is its own commit and the pull goes with it; on several the pull
// carries the commit, once every shard answered the push). At the
// end every worker reports the final version, as a worker reports its test
// accuracy, so the job SUCCEEDS.
//
// One instance (--submit) submits the job: JOB_WORKERS workers on SHARDS
// shards, a linear layer of PARAMS values, one sample per rank (one step an
// epoch), STEPS steps. --kill=M workers of this process die at step
// --kill_at: they stop heartbeating and their connections close, as a
// killed process's do, before they push that step. --idle=D: register and
// heartbeat for D seconds, no job (what an idle worker costs the
// coordinator).
//
// Prints one JSON line: steps done, the heartbeats sent and their message
// bytes, and for --kill the seconds from the death to the step closing
// without the dead (the survivors' pull of that step's successor returning).
//   tally-bench-swarm --server=HOST:PORT --workers=N [--submit --job_workers=T
//     --shards=K --steps=S --params=P] [--kill=M --kill_at=STEP] [--idle=D]
//     [--tls_ca=... --tls_cert=... --tls_key=... --token_file=...]
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/errors.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "proto/transport_flags.h"
#include "worker/param_client.h"

ABSL_FLAG(std::string, server, "localhost:7070", "the coordinator");
ABSL_FLAG(std::string, name, "swarm", "this process's workers' name prefix");
ABSL_FLAG(int, workers, 16, "light workers in this process");
ABSL_FLAG(bool, submit, false, "this instance submits the job");
ABSL_FLAG(int, job_workers, 16, "workers the job trains on (all processes)");
ABSL_FLAG(int, shards, 1, "shards the job's parameters are split over");
ABSL_FLAG(int, steps, 100, "steps of the job");
ABSL_FLAG(int, params, 16384,
          "parameters of the job's model (a linear layer of PARAMS / 2 x 2)");
ABSL_FLAG(int, kill, 0, "workers of this process that die at --kill_at");
ABSL_FLAG(int, kill_at, 50, "the step before whose push they die");
ABSL_FLAG(double, idle, 0, "seconds to stay registered without a job");

namespace v1 = tally::v1;

namespace {

constexpr absl::Duration kStepTimeout = absl::Minutes(2);
constexpr absl::Duration kAssignTimeout = absl::Minutes(3);

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "tally-bench-swarm %s: %s: %s\n",
               absl::GetFlag(FLAGS_name).c_str(), what.c_str(),
               s.ToString().c_str());
  std::fflush(stderr);
  std::_Exit(1);  // gRPC callbacks may still hold our buffers
}

std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return c;
}

// One light worker. Its registration and assignment are written by the
// heartbeat thread that serves it and read by its own thread.
struct Light {
  std::string name;
  std::unique_ptr<v1::WorkerService::Stub> stub;
  std::string worker_id;
  int64_t incarnation = 0;
  std::atomic<bool> dead{false};
  absl::Mutex mu;
  std::optional<v1::Assignment> assignment ABSL_GUARDED_BY(mu);
};

struct Totals {
  std::atomic<int64_t> heartbeats{0};
  std::atomic<int64_t> heartbeat_bytes{0};
  std::atomic<int64_t> steps{0};
  std::atomic<bool> stop{false};
  int64_t lease_ms = 3000;
};

void Register(Light& w, Totals& totals) {
  v1::RegisterWorkerRequest req;
  req.set_name(w.name);
  req.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  v1::RegisterWorkerResponse resp;
  grpc::Status s = w.stub->RegisterWorker(Ctx(absl::Seconds(30)).get(), req, &resp);
  if (!s.ok()) Die(absl::StrCat("register ", w.name), tally::FromGrpc(s));
  w.worker_id = resp.worker_id();
  w.incarnation = resp.incarnation();
  totals.lease_ms = resp.lease_ms();
}

// One heartbeat of `w`, as the daemon sends it.
void Heartbeat(Light& w, Totals& totals) {
  v1::HeartbeatRequest req;
  req.set_worker_id(w.worker_id);
  req.set_incarnation(w.incarnation);
  {
    absl::MutexLock lock(&w.mu);
    if (w.assignment.has_value()) {
      req.set_job_id(w.assignment->job_id());
      req.set_held(w.assignment->key());
      req.set_compute_seconds(0.001);
      req.set_wait_seconds(0.001);
      req.set_push_seconds(0.001);
    }
  }
  v1::HeartbeatResponse resp;
  grpc::Status s = w.stub->Heartbeat(
      Ctx(absl::Milliseconds(totals.lease_ms / 2)).get(), req, &resp);
  totals.heartbeats.fetch_add(1);
  totals.heartbeat_bytes.fetch_add(
      static_cast<int64_t>(req.ByteSizeLong() + resp.ByteSizeLong()));
  // A slow answer is the coordinator's load, which is what is measured; a
  // refusal means the lease is gone, which a swarm must not see.
  if (!s.ok() && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    if (w.dead.load()) return;
    Die(absl::StrCat("heartbeat of ", w.name), tally::FromGrpc(s));
  }
  if (s.ok() && resp.has_assignment()) {
    absl::MutexLock lock(&w.mu);
    if (!w.assignment.has_value()) w.assignment = resp.assignment();
  }
}

// `w`'s heartbeats, every quarter lease as the daemon's, until totals.stop
// or its death.
void HeartbeatLoop(Light& w, Totals& totals) {
  const absl::Duration period =
      absl::Milliseconds(std::clamp<int64_t>(totals.lease_ms / 4, 50, 1000));
  while (!totals.stop.load() && !w.dead.load()) {
    const absl::Time round = absl::Now();
    Heartbeat(w, totals);
    absl::SleepFor(std::max(absl::ZeroDuration(), round + period - absl::Now()));
  }
}

void Submit(const std::string& server, const tally::TransportOptions& t) {
  auto jobs = v1::JobService::NewStub(tally::Dial(server, t));
  const int workers = absl::GetFlag(FLAGS_job_workers);
  // train_size = workers: one sample a rank, one step an epoch. lr 0 keeps
  // the weights, and any gradient values, as they are.
  v1::SubmitJobRequest sub;
  sub.set_spec(absl::StrCat(
      "name: swarm\nmodel: {layers: [{linear: {in_features: ",
      absl::GetFlag(FLAGS_params) / 2, ", out_features: 2, bias: false}}]}\n",
      "dataset: {name: synthetic, features: ", absl::GetFlag(FLAGS_params) / 2,
      ", classes: 2, train_size: ", workers,
      ", test_size: 0}\ntraining: {workers: ", workers,
      ", shards: ", absl::GetFlag(FLAGS_shards),
      ", epochs: ", absl::GetFlag(FLAGS_steps),
      "}\noptimizer: {type: sgd, lr: 0.0}\n"));
  v1::SubmitJobResponse job;
  grpc::Status s = jobs->SubmitJob(Ctx(absl::Seconds(30)).get(), sub, &job);
  if (!s.ok()) Die("submit", tally::FromGrpc(s));
}

// What a worker's run says: when it died (if it did), when its pull of
// the death step's successor returned (if it lived).
struct RunResult {
  absl::Time died = absl::InfinitePast();
  absl::Time closed_after_death = absl::InfinitePast();
};

// Waits for `work`; cancels it on a deadline, so nothing writes the
// borrowed buffers after we exit.
void WaitOrDie(tally::Work& work, const std::string& what) {
  absl::Status s = work.Wait(absl::Now() + kStepTimeout);
  if (absl::IsDeadlineExceeded(s) && !work.Done()) work.Cancel();
  if (!s.ok()) Die(what, s);
}

// The first pull: the ranges reach the shards shortly after the
// assignment (until then NOT_FOUND or JOB_NOT_STARTED).
void FirstPull(tally::ParameterClient& client, float* weights,
               const std::string& who) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);;) {
    auto pull = client.Pull(0, weights);
    absl::Status s = pull->Wait(absl::Now() + kStepTimeout);
    if (absl::IsDeadlineExceeded(s) && !pull->Done()) pull->Cancel();
    if (s.ok()) return;
    const bool not_ready = absl::IsNotFound(s) || absl::IsUnavailable(s) ||
                           tally::ReasonOf(s) == v1::JOB_NOT_STARTED;
    if (!not_ready || absl::Now() > give_up) Die(who + ": pull 0", s);
    absl::SleepFor(absl::Milliseconds(100));
  }
}

v1::Assignment AwaitAssignment(Light& w) {
  for (const absl::Time give_up = absl::Now() + kAssignTimeout;;) {
    {
      absl::MutexLock lock(&w.mu);
      if (w.assignment.has_value()) return *w.assignment;
    }
    if (absl::Now() > give_up)
      Die(w.name, absl::DeadlineExceededError("no job assigned"));
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::unique_ptr<tally::ParameterClient> MakeClient(
    const Light& w, const v1::Assignment& job, int64_t n,
    const tally::TransportOptions& transport) {
  tally::ParamClientOptions po;
  po.job_id = job.job_id();
  po.worker_id = w.worker_id;
  po.incarnation = w.incarnation;
  po.pull_wait = kStepTimeout;
  po.rpc_timeout = kStepTimeout;
  po.total_steps = job.schedule().total_steps();
  po.steps_per_epoch = job.schedule().steps_per_epoch();
  po.plan = job.schedule().plan();
  po.transport = transport;
  po.transport.own_connection = true;  // as a process of its own would
  po.shared_memory = false;
  auto client = tally::ParameterClient::Create(
      job.shard_map(), n, absl::GetFlag(FLAGS_server), po);
  if (!client.ok()) Die(w.name, client.status());
  return *std::move(client);
}

// Every member reports the final version, as tally-worker reports its test
// accuracy. The coordinator learns a remote shard's version from its
// heartbeats: until then it answers UNAVAILABLE (NOT_FINISHED).
void Report(Light& w, const v1::Assignment& job) {
  v1::ReportResultRequest req;
  req.set_worker_id(w.worker_id);
  req.set_incarnation(w.incarnation);
  req.set_job_id(job.job_id());
  req.set_ok(true);
  req.set_steps(job.schedule().total_steps());
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);;) {
    v1::ReportResultResponse resp;
    grpc::Status s =
        w.stub->ReportResult(Ctx(absl::Seconds(30)).get(), req, &resp);
    if (s.ok()) return;
    // The job may have ended with another member's report: nothing to say.
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        s.error_code() == grpc::StatusCode::NOT_FOUND) {
      return;
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() > give_up)
      Die(absl::StrCat(w.name, ": report"), tally::FromGrpc(s));
    absl::SleepFor(absl::Milliseconds(100));
  }
}

RunResult Train(Light& w, bool dies, int kill_at,
                const tally::TransportOptions& transport, Totals& totals) {
  // Below the heartbeat threads: a worker process of its own would never
  // see its heartbeats wait behind hundreds of other workers' steps.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  const v1::Assignment job = AwaitAssignment(w);
  int64_t n = 0;
  for (const auto& e : job.shard_map().shards()) n += e.count();
  std::unique_ptr<tally::ParameterClient> client =
      MakeClient(w, job, n, transport);
  std::vector<float> weights(n), grads(n, 0.001f);
  FirstPull(*client, weights.data(), w.name);
  RunResult result;
  // As tally-worker does: on one shard a push is its own commit and the
  // next pull goes with it; on several the pull carries the commit, once
  // every shard answered the push.
  const bool pipelined = client->num_shards() == 1;
  for (int64_t t = 0; t < job.schedule().total_steps(); ++t) {
    if (dies && t == kill_at) {
      result.died = absl::Now();
      w.dead.store(true);
      client.reset();  // its connections close
      return result;
    }
    tally::PushInfo info;
    info.step = t;
    info.samples = 1;
    info.commit = pipelined;
    std::shared_ptr<tally::Work> push = client->Push(info, grads.data());
    v1::StepCommit commit;
    commit.set_step(t);
    commit.set_contributed(true);
    std::shared_ptr<tally::Work> pull;
    if (pipelined) pull = client->Pull(t + 1, weights.data());
    WaitOrDie(*push, absl::StrCat(w.name, ": push ", t));
    if (pipelined && !push->Committed())
      Die(w.name, absl::InternalError("a push on one shard not committed"));
    if (!pipelined) pull = client->Pull(t + 1, weights.data(), &commit);
    WaitOrDie(*pull, absl::StrCat(w.name, ": pull ", t + 1));
    if (t == kill_at) result.closed_after_death = absl::Now();
    totals.steps.fetch_add(1);
  }
  Report(w, job);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  tally::UseTransportExperiments();
  tally::ParseProgramFlags(argc, argv, "tally-bench-swarm --server=HOST:PORT --workers=N ...\n");
  const int n = absl::GetFlag(FLAGS_workers);
  const int kill = absl::GetFlag(FLAGS_kill);
  const int kill_at = absl::GetFlag(FLAGS_kill_at);
  if (n < 1 || kill < 0 || kill > n || kill_at < 0) {
    std::fprintf(stderr, "--workers >= 1, 0 <= --kill <= --workers, --kill_at >= 0\n");
    return 2;
  }
  absl::StatusOr<tally::TransportOptions> transport = tally::TransportFromFlags();
  if (!transport.ok()) Die("flags", transport.status());
  const std::string server = absl::GetFlag(FLAGS_server);
  if (absl::GetFlag(FLAGS_submit)) Submit(server, *transport);

  Totals totals;
  std::vector<std::unique_ptr<Light>> lights;
  for (int i = 0; i < n; ++i) {
    auto w = std::make_unique<Light>();
    w->name = absl::StrCat(absl::GetFlag(FLAGS_name), "-", i);
    tally::TransportOptions own = *transport;
    own.own_connection = true;
    w->stub = v1::WorkerService::NewStub(tally::Dial(server, own));
    Register(*w, totals);
    lights.push_back(std::move(w));
  }
  // A heartbeat thread a worker, as each daemon has its own: one slow
  // answer delays nobody else's heartbeat.
  std::vector<std::thread> heartbeats;
  for (int i = 0; i < n; ++i) {
    heartbeats.emplace_back(
        [w = lights[i].get(), &totals] { HeartbeatLoop(*w, totals); });
  }
  const absl::Time start = absl::Now();
  std::vector<RunResult> results(n);
  double idle = absl::GetFlag(FLAGS_idle);
  if (idle > 0) {
    absl::SleepFor(absl::Seconds(idle));
  } else {
    std::vector<std::thread> trainers;
    for (int i = 0; i < n; ++i) {
      trainers.emplace_back([&, i] {
        results[i] = Train(*lights[i], i < kill, kill_at, *transport, totals);
      });
    }
    for (std::thread& t : trainers) t.join();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  totals.stop.store(true);
  for (std::thread& t : heartbeats) t.join();

  // Death to close: from the first death to the last survivor's pull of
  // the successor of the step it died at.
  absl::Time died = absl::InfiniteFuture(), closed = absl::InfinitePast();
  for (const RunResult& r : results) {
    if (r.died != absl::InfinitePast()) died = std::min(died, r.died);
    closed = std::max(closed, r.closed_after_death);
  }
  const double death_to_close =
      kill > 0 && kill < n ? absl::ToDoubleSeconds(closed - died) : -1;
  std::printf(
      "{\"name\": \"%s\", \"workers\": %d, \"seconds\": %.3f, \"steps\": %lld, "
      "\"heartbeats\": %lld, \"heartbeat_bytes\": %lld, "
      "\"death_to_close_seconds\": %.3f}\n",
      absl::GetFlag(FLAGS_name).c_str(), n, seconds,
      static_cast<long long>(totals.steps.load()),
      static_cast<long long>(totals.heartbeats.load()),
      static_cast<long long>(totals.heartbeat_bytes.load()), death_to_close);
  std::fflush(stdout);
  std::_Exit(0);  // the workers' channels may still be closing
}
