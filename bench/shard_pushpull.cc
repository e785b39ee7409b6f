// Push + pull throughput of one worker of a job whose parameters are split
// over several shard processes (bench/shard_scaling.sh runs several of
// these at once, one per worker host, and adds their figures up).
//
// One instance (--submit) submits a job of WORKERS workers on exactly SHARDS
// shards whose model is one linear layer of IN x OUT (default 4096 x 4096:
// 16.8 M parameters, 67 MB); every instance registers as a worker, waits
// for its assignment, and drives the job through ParameterClient as
// tally-worker does (push step t, then pull version t + 1 carrying the
// commit of that push), without computing anything. Prints one JSON line:
// float32 bytes pushed and pulled per second by this worker, the first step
// (warm-up) not counted.
//   tally-bench-shard-pushpull --server=HOST:PORT --shards=K [--submit]
//   [--name=w0] [--steps=10] [--workers=4] [--in=4096] [--out=4096]
//   [--exchange=false] [--shared_memory]
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/malloc_tuning.h"
#include "proto/errors.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "worker/param_client.h"

ABSL_FLAG(std::string, server, "localhost:7070", "the coordinator");
ABSL_FLAG(std::string, name, "shard-pushpull", "this worker's name");
ABSL_FLAG(int, steps, 10, "push+pull rounds (the first is not timed)");
ABSL_FLAG(bool, submit, false, "this instance submits the job");
ABSL_FLAG(int, in, 4096, "model input features");
ABSL_FLAG(int, out, 4096, "model output features");
ABSL_FLAG(int, shards, 1, "shards the job's parameters are split over");
ABSL_FLAG(int, workers, 4, "workers the job trains on");
ABSL_FLAG(bool, exchange, true,
          "one Exchange stream per shard (false: a call per push and pull)");
ABSL_FLAG(bool, shared_memory, false,
          "on those streams, push and pull through memory a shard on this "
          "host shares (tally-worker's default); false: loopback TCP, what "
          "the transport benchmarks measure");

namespace v1 = tally::v1;

namespace {

// Long enough for every worker's push of a 67 MB model through one shard's
// 1 Gbit/s link, and then some: a step waits for the slowest member.
constexpr absl::Duration kStepTimeout = absl::Minutes(2);
constexpr absl::Duration kAssignTimeout = absl::Minutes(2);

std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return c;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "tally-bench-shard-pushpull %s: %s: %s\n",
               absl::GetFlag(FLAGS_name).c_str(), what.c_str(),
               s.ToString().c_str());
  // _Exit: the heartbeat thread may call this too, and gRPC callbacks may
  // still hold our buffers; run no destructors under them.
  std::fflush(stderr);
  std::_Exit(1);
}

void Check(const grpc::Status& s, const std::string& what) {
  if (!s.ok()) Die(what, tally::FromGrpc(s));
}

// Waits for `work`; on a deadline, cancels it so that nothing writes the
// borrowed buffers after we exit.
void WaitOrDie(tally::Work& work, const std::string& what) {
  absl::Status s = work.Wait(absl::Now() + kStepTimeout);
  if (absl::IsDeadlineExceeded(s) && !work.Done()) work.Cancel();
  if (!s.ok()) Die(what, s);
}

}  // namespace

int main(int argc, char** argv) {
  tally::UseTransportExperiments();
  tally::TuneMallocForBulkTransfers();
  absl::ParseCommandLine(argc, argv);
  const std::string server = absl::GetFlag(FLAGS_server);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int shards = absl::GetFlag(FLAGS_shards);
  const int workers = absl::GetFlag(FLAGS_workers);
  if (steps < 2 || shards < 1 || workers < 1) {
    std::fprintf(stderr, "--steps >= 2, --shards >= 1, --workers >= 1\n");
    return 2;
  }
  auto ch = tally::Dial(server);
  auto jobs = v1::JobService::NewStub(ch);
  auto worker_service = v1::WorkerService::NewStub(ch);

  if (absl::GetFlag(FLAGS_submit)) {
    // train_size = workers: one sample per rank, so one step per epoch and
    // steps + 1 steps in all (the job must not end at the last version we
    // pull). lr 0 keeps the weights, and any float values, unchanged.
    const int in = absl::GetFlag(FLAGS_in), out = absl::GetFlag(FLAGS_out);
    v1::SubmitJobRequest sub;
    sub.set_spec(absl::StrCat(
        "name: shard-pushpull\nmodel: {layers: [{linear: {in_features: ", in,
        ", out_features: ", out, "}}]}\ndataset: {name: synthetic, features: ",
        in, ", classes: ", out, ", train_size: ", workers,
        ", test_size: 0}\ntraining: {workers: ", workers, ", shards: ", shards,
        ", epochs: ", steps + 1, "}\noptimizer: {type: sgd, lr: 0.0}\n"));
    v1::SubmitJobResponse job;
    Check(jobs->SubmitJob(Ctx(absl::Seconds(30)).get(), sub, &job), "submit");
  }

  v1::RegisterWorkerRequest reg;
  reg.set_name(absl::GetFlag(FLAGS_name));
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  v1::RegisterWorkerResponse me;
  Check(worker_service->RegisterWorker(Ctx(absl::Seconds(30)).get(), reg, &me),
        "register");

  // Heartbeats for the whole run, on their own thread: the lease must hold
  // while the main thread is blocked in a long push or pull.
  absl::Mutex mu;
  v1::Assignment assignment;  // guarded by mu
  bool assigned = false;      // guarded by mu
  std::atomic<bool> stop{false};
  std::thread heartbeat([&] {
    std::string job_id;
    while (!stop.load()) {
      v1::HeartbeatRequest req;
      req.set_worker_id(me.worker_id());
      req.set_incarnation(me.incarnation());
      req.set_job_id(job_id);
      v1::HeartbeatResponse resp;
      grpc::Status s =
          worker_service->Heartbeat(Ctx(absl::Seconds(10)).get(), req, &resp);
      // This host's link is saturated by the transfers: a slow heartbeat is
      // expected and harmless (the script's lease is minutes long); a
      // refusal (stale registration) is not.
      if (!s.ok() && s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
          s.error_code() != grpc::StatusCode::UNAVAILABLE) {
        Die("heartbeat", tally::FromGrpc(s));
      }
      if (s.ok() && resp.has_assignment() && job_id.empty()) {
        job_id = resp.assignment().job_id();
        absl::MutexLock lock(&mu);
        assignment = resp.assignment();
        assigned = true;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  v1::Assignment job;
  {
    absl::MutexLock lock(&mu);
    if (!mu.AwaitWithTimeout(absl::Condition(&assigned), kAssignTimeout)) {
      Die("assignment", absl::DeadlineExceededError(
                            "no job assigned (are all workers and shards up?)"));
    }
    job = assignment;
  }
  const v1::ShardMap& map = job.shard_map();
  if (map.shards_size() != shards) {
    Die("assignment", absl::FailedPreconditionError(absl::StrCat(
                          "the job is on ", map.shards_size(), " shards, not ",
                          shards)));
  }
  int64_t n = 0;
  for (const auto& e : map.shards()) n += e.count();

  tally::ParamClientOptions po;
  po.job_id = job.job_id();
  po.worker_id = me.worker_id();
  po.incarnation = me.incarnation();
  // A pull of the next version waits for every member's push: the server
  // may hold it as long as a step can take.
  po.pull_wait = kStepTimeout;
  po.rpc_timeout = kStepTimeout;
  po.exchange = absl::GetFlag(FLAGS_exchange);
  po.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  po.total_steps = job.schedule().total_steps();
  po.steps_per_epoch = job.schedule().steps_per_epoch();
  auto client = tally::ParameterClient::Create(map, n, server, po);
  if (!client.ok()) Die("parameter client", client.status());

  std::vector<float> weights(n), grads(n, 0.001f);
  // The ranges reach the shards shortly after the assignment: until then a
  // shard answers NOT_FOUND or JOB_NOT_STARTED. Retry the first pull only.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);;) {
    auto pull = (*client)->Pull(0, weights.data());
    absl::Status s = pull->Wait(absl::Now() + kStepTimeout);
    if (absl::IsDeadlineExceeded(s) && !pull->Done()) pull->Cancel();
    if (s.ok()) break;
    const bool not_ready = absl::IsNotFound(s) || absl::IsUnavailable(s) ||
                           tally::ReasonOf(s) == v1::JOB_NOT_STARTED;
    if (!not_ready || absl::Now() > give_up) Die("pull 0", s);
    absl::SleepFor(absl::Milliseconds(100));
  }

  absl::Time start;
  for (int t = 0; t < steps; ++t) {
    if (t == 1) start = absl::Now();  // step 0 warms up
    tally::PushInfo info;
    info.step = t;
    info.samples = 1;
    WaitOrDie(*(*client)->Push(info, grads.data()),
              absl::StrCat("push ", t));
    v1::StepCommit commit;
    commit.set_step(t);
    commit.set_contributed(true);
    WaitOrDie(*(*client)->Pull(t + 1, weights.data(), &commit),
              absl::StrCat("pull ", t + 1));
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  stop.store(true);
  heartbeat.join();

  // float32 bytes of the model, pushed and pulled, per timed step.
  const double bytes = 2.0 * 4.0 * static_cast<double>(n) * (steps - 1);
  std::printf(
      "{\"name\": \"%s\", \"shards\": %d, \"steps\": %d, "
      "\"timed_steps\": %d, \"seconds\": %.3f, \"gb_per_sec\": %.4f}\n",
      absl::GetFlag(FLAGS_name).c_str(), shards, steps, steps - 1, secs,
      bytes / secs / 1e9);
  return 0;
}
