// Push + pull throughput against a running tally-server, for a large model.
//
// Submits a one-worker job whose model is one linear layer of IN x OUT
// (default 4096 x 4096: 16.8 M parameters, 67 MB), registers as its worker,
// and then runs STEPS sync steps of: push a full gradient, pull the new
// weights. Prints the bytes moved per second (push + pull) as JSON.
//   tally-bench-pushpull --server=HOST:PORT [--steps=10] [--in=4096]
//   [--out=4096]
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/malloc_tuning.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "proto/transport_flags.h"
#include "proto/tensor_chunk.h"

ABSL_FLAG(std::string, server, "localhost:7070", "tally-server");
ABSL_FLAG(int, steps, 10, "push+pull rounds to time");
ABSL_FLAG(int, in, 4096, "model input features");
ABSL_FLAG(int, out, 4096, "model output features");
ABSL_FLAG(std::string, dtype, "float32",
          "float32 or bfloat16: how gradients and weights travel");

namespace v1 = tally::v1;

namespace {

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  return c;
}

void Check(const grpc::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.error_message().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  tally::UseTransportExperiments();
  tally::TuneMallocForBulkTransfers();
  absl::ParseCommandLine(argc, argv);
  auto transport = tally::TransportFromFlags();  // --tls_*, --token_file
  if (!transport.ok()) {
    std::fprintf(stderr, "%s\n", std::string(transport.status().message()).c_str());
    return 2;
  }
  auto ch = tally::Dial(absl::GetFlag(FLAGS_server), *transport);
  auto jobs = v1::JobService::NewStub(ch);
  auto workers = v1::WorkerService::NewStub(ch);
  const int in = absl::GetFlag(FLAGS_in), out = absl::GetFlag(FLAGS_out);
  const int steps = absl::GetFlag(FLAGS_steps);
  const bool bf16 = absl::GetFlag(FLAGS_dtype) == "bfloat16";
  if (!bf16 && absl::GetFlag(FLAGS_dtype) != "float32") {
    std::fprintf(stderr, "--dtype: float32 or bfloat16\n");
    return 2;
  }
  const v1::DType dtype = bf16 ? v1::BFLOAT16 : v1::FLOAT32;
  v1::SubmitJobRequest sub;
  sub.set_spec(absl::StrCat(
      "name: pushpull\nmodel: {layers: [{linear: {in_features: ", in,
      ", out_features: ", out,
      "}}]}\ndataset: {name: synthetic, features: ", in, ", classes: ", out,
      ", train_size: 1, test_size: 0}\ntraining: {workers: 1, epochs: ",
      steps + 1, "}\noptimizer: {type: sgd, lr: 0.0}\n"));
  v1::SubmitJobResponse job;
  Check(jobs->SubmitJob(Ctx().get(), sub, &job), "submit");
  v1::RegisterWorkerRequest reg;
  reg.set_name("pushpull-bench");
  reg.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  v1::RegisterWorkerResponse me;
  Check(workers->RegisterWorker(Ctx().get(), reg, &me), "register");
  // The one-process cluster's shard serves on its own data port.
  v1::ListShardsResponse shards;
  Check(jobs->ListShards(Ctx().get(), {}, &shards), "list shards");
  if (shards.shards_size() != 1) {
    std::fprintf(stderr, "the server should hold the parameters alone\n");
    return 1;
  }
  auto params = v1::ParameterService::NewStub(tally::Dial(
      tally::ResolveShardAddress(absl::GetFlag(FLAGS_server),
                                 shards.shards(0).address()),
      *transport));
  const int64_t n = job.job().num_params();
  std::vector<float> weights(n), grads(n, 0.001f);
  constexpr int64_t kChunk = 262144;

  auto pull = [&](int64_t v) {
    v1::PullRequest req;
    req.set_job_id(job.job().id());
    req.set_worker_id(me.worker_id());
    req.set_incarnation(me.incarnation());
    req.set_min_version(v);
    req.set_total_steps(steps + 1);
    req.set_steps_per_epoch(1);
    req.set_dtype(dtype);
    if (v > 0) {  // the push of v - 1 reached the (only) shard
      req.mutable_commit()->set_step(v - 1);
      req.mutable_commit()->set_contributed(true);
    }
    auto ctx = Ctx();
    auto r = params->PullWeights(ctx.get(), req);
    v1::PullResponse resp;
    while (r->Read(&resp)) {
      if (!tally::CheckChunk(resp.chunk(), n).ok()) {
        std::fprintf(stderr, "pull: malformed chunk\n");
        std::exit(1);
      }
      tally::DecodeChunk(resp.chunk(), weights.data());
    }
    Check(r->Finish(), "pull");
  };
  auto push = [&](int64_t step) {
    auto ctx = Ctx();
    v1::PushResponse resp;
    auto w = params->PushGradients(ctx.get(), &resp);
    v1::PushRequest m;
    auto* h = m.mutable_header();
    h->set_job_id(job.job().id());
    h->set_worker_id(me.worker_id());
    h->set_incarnation(me.incarnation());
    h->set_step(step);
    h->set_base_version(step);
    h->set_samples(1);
    for (int64_t off = 0; off < n; off += kChunk) {
      const int64_t c = std::min(kChunk, n - off);
      tally::EncodeChunk(grads.data() + off, off, c, dtype, m.mutable_chunk());
      w->Write(m);
      m.clear_header();
    }
    w->WritesDone();
    Check(w->Finish(), "push");
  };
  pull(0);
  push(0);  // warm up
  const absl::Time start = absl::Now();
  for (int s = 1; s <= steps; ++s) {
    pull(s);
    push(s);
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  // float32 bytes of the model moved per second, whatever the wire dtype:
  // the figure a training job sees.
  const double bytes = 2.0 * 4.0 * n * steps;
  std::printf(
      "{\"params\": %lld, \"model_mb\": %.1f, \"dtype\": \"%s\", "
      "\"steps\": %d, \"seconds\": %.3f, \"gb_per_sec\": %.3f}\n",
      static_cast<long long>(n), 4.0 * n / 1e6, bf16 ? "bfloat16" : "float32",
      steps, secs, bytes / secs / 1e9);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.job().id());
  v1::Job j;
  jobs->CancelJob(Ctx().get(), cancel, &j);
  return 0;
}
