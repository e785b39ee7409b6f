// tally: the client.
//
//   tally [--server=HOST:PORT] submit FILE [--wait]
//   tally list
//   tally status JOB [--json]
//   tally watch JOB
//   tally cancel JOB
//   tally fetch JOB PATH            (or --output=PATH)
//   tally report JOB FILE.html      (or --output=FILE.html)
//   tally shards
//   tally health [--service=NAME]
//
// Exit codes: 0 success, 1 the request failed (or the job did not succeed,
// for submit --wait and watch), 2 bad usage, 3 server unreachable.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/io/safetensors.h"
#include "proto/health.grpc.pb.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "proto/transport_flags.h"
#include "common/page/page.h"

ABSL_FLAG(std::string, server, "localhost:7070",
          "tally-server address HOST:PORT");
ABSL_FLAG(bool, wait, false, "submit: watch the job until it ends");
ABSL_FLAG(bool, json, false, "status: print the job as JSON");
ABSL_FLAG(std::string, output, "",
          "fetch, report: where to write (instead of the PATH after JOB)");
ABSL_FLAG(std::string, service, "",
          "health: service name to check ('' = server)");
ABSL_FLAG(int, timeout_s, 10, "Deadline of each request, in seconds");

namespace {

using tally::v1::Job;

constexpr char kUsage[] =
    "usage: tally [--server=HOST:PORT] [--tls_ca=F --tls_cert=F --tls_key=F]\n"
    "             [--token_file=F] COMMAND\n"
    "  submit FILE [--wait]     submit a job spec; prints the job id first\n"
    "  list                     all jobs\n"
    "  status JOB [--json]      one job\n"
    "  watch JOB                live progress until the job ends\n"
    "  cancel JOB\n"
    "  fetch JOB PATH           trained weights as .safetensors (or\n"
    "                           --output=PATH)\n"
    "  report JOB F.html        curves, events and record in one HTML file\n"
    "                           (or --output=F.html)\n"
    "  shards                   parameter shards and the ranges they hold\n"
    "  health [--service=NAME]  grpc.health.v1 check\n";

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s))));
  return ctx;
}

int Report(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
       s.error_message().find("onnect") != std::string::npos)) {
    std::cerr << "tally: cannot reach tally-server at "
              << absl::GetFlag(FLAGS_server) << ": " << s.error_message()
              << "\n";
    return 3;
  }
  std::cerr << "tally: " << s.error_message() << "\n";
  return 1;
}

std::string StateName(tally::v1::JobState s) {
  return tally::v1::JobState_Name(s);
}

bool Ended(const Job& j) {
  return j.state() == tally::v1::SUCCEEDED ||
         j.state() == tally::v1::FAILED || j.state() == tally::v1::CANCELLED;
}

// Whether the job's figures include an accuracy: a classifier's
// (cross_entropy; a server that does not say is taken to be one).
bool Classifies(const Job& j) {
  return j.loss().empty() || j.loss() == "cross_entropy" ||
         j.loss() == "binary_cross_entropy";
}

std::string Line(const Job& j) {
  const auto& m = j.metrics();
  std::string s = absl::StrFormat(
      "%-8s %-10s %-24s step %lld/%lld", j.id(), StateName(j.state()),
      j.name().empty() ? "-" : j.name(), static_cast<long long>(m.step()),
      static_cast<long long>(m.total_steps()));
  if (m.step() > 0) {
    absl::StrAppendFormat(&s, "  loss %.4f", m.loss());
    if (Classifies(j)) absl::StrAppendFormat(&s, "  acc %.3f", m.accuracy());
  }
  if (j.state() == tally::v1::SUCCEEDED) {
    if (m.no_test_split()) {  // nothing evaluated: no figures, not zeros
      absl::StrAppend(&s, "  no test split");
    } else if (Classifies(j)) {
      absl::StrAppendFormat(&s, "  test accuracy %.4f", m.test_accuracy());
    } else {
      absl::StrAppendFormat(&s, "  test loss %.4f", m.test_loss());
    }
    if (m.test_auc() > 0) absl::StrAppendFormat(&s, "  test AUC %.4f", m.test_auc());
  }
  if (!j.message().empty()) absl::StrAppend(&s, "  (", j.message(), ")");
  return s;
}

// A job that grows: its membership over time, a line a world (tally
// status).
std::string MembershipTable(const Job& j) {
  if (j.workers_max() <= j.workers_wanted() && j.membership_size() <= 1)
    return "";
  std::string s = absl::StrFormat("  workers %d to %d; membership:\n",
                                  j.workers_wanted(), j.workers_max());
  for (const tally::v1::MembershipPeriod& p : j.membership()) {
    absl::StrAppendFormat(
        &s, "    %d worker%s from step %d (epoch %d): global batch %d, %d "
        "steps an epoch\n",
        p.world(), p.world() == 1 ? "" : "s", p.first_step(),
        p.first_epoch(), p.global_batch(), p.steps_per_epoch());
  }
  return s;
}

// The job's workers, one line each, the slowest marked (tally status).
std::string WorkerTable(const Job& j) {
  const auto& m = j.metrics();
  if (m.progress().empty()) return "";
  std::string s = absl::StrFormat(
      "  %-4s %-28s %8s %5s %10s %10s %10s %10s\n", "rank", "worker", "clock",
      "lag", "compute", "wait", "push", "loader");
  for (const tally::v1::WorkerProgress& p : m.progress()) {
    const std::string who =
        p.name().empty() ? p.worker_id()
                         : absl::StrCat(p.worker_id(), " (", p.name(), ")");
    absl::StrAppendFormat(
        &s, "  %-4d %-28s %8s %5d %8.3fms %8.3fms %8.3fms %8.3fms%s\n",
        p.rank(), who,
        p.clock() < 0 ? std::string("-") : absl::StrCat(p.clock()), p.lag(),
        p.compute_seconds() * 1e3, p.wait_seconds() * 1e3,
        p.push_seconds() * 1e3, p.loader_seconds() * 1e3,
        p.slowest() ? "  <- slowest" : "");
  }
  // An ended job waits on nobody (a record from an older server may
  // still carry the wait of its last moment).
  if (!m.waiting_on().empty() && !Ended(j)) {
    absl::StrAppendFormat(&s, "  step %d has waited %.0f s on %s\n", m.step(),
                          m.stalled_seconds(),
                          absl::StrJoin(m.waiting_on(), ", "));
  }
  return s;
}

std::string Progress(const Job& j) {
  const auto& m = j.metrics();
  const double frac = m.total_steps() > 0
                          ? static_cast<double>(m.step()) / m.total_steps()
                          : 0.0;
  constexpr int kWidth = 24;
  std::string bar(static_cast<int>(frac * kWidth), '#');
  bar.resize(kWidth, '.');
  return absl::StrFormat("%s %s [%s] step %d/%d  epoch %d  loss %.4f", j.id(),
                         StateName(j.state()), bar, m.step(), m.total_steps(),
                         m.epoch(), m.loss()) +
      (Classifies(j) ? absl::StrFormat("  acc %.3f", m.accuracy())
                     : std::string()) +
      absl::StrFormat("  %.0f samples/s  workers %d", m.samples_per_sec(),
                      m.workers()) +
      (m.waiting_on().empty() || Ended(j)
           ? std::string()
           : absl::StrFormat("  waiting %.0f s on %s", m.stalled_seconds(),
                             absl::StrJoin(m.waiting_on(), ", ")));
}

// Streams the job until it ends; returns the exit code (0 iff SUCCEEDED).
int Watch(tally::v1::JobService::Stub& stub, const std::string& id) {
  const bool tty = isatty(fileno(stdout));
  // A long-lived stream: its own deadline is a day, not --timeout_s.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Hours(24)));
  tally::v1::WatchJobRequest req;
  req.set_job_id(id);
  auto reader = stub.WatchJob(&ctx, req);
  Job j, last;
  bool any = false;
  while (reader->Read(&j)) {
    any = true;
    last = j;
    if (tty) {
      std::printf("\r%s\033[K", Progress(j).c_str());
    } else {
      std::printf("%s\n", Progress(j).c_str());
    }
    std::fflush(stdout);
  }
  if (tty && any) std::printf("\n");
  grpc::Status s = reader->Finish();
  if (!s.ok()) return Report(s);
  std::printf("%s\n", Line(last).c_str());
  if (last.state() == tally::v1::SUCCEEDED) {
    if (last.metrics().no_test_split()) {
      std::printf("no test split: the job has no test figures\n");
    } else if (Classifies(last)) {
      std::printf("final test accuracy: %.4f\n",
                  last.metrics().test_accuracy());
    } else {
      std::printf("final test loss: %.4f\n", last.metrics().test_loss());
    }
    if (last.metrics().test_auc() > 0)
      std::printf("final test AUC: %.4f\n", last.metrics().test_auc());
    return 0;
  }
  return 1;
}

int Submit(tally::v1::JobService::Stub& stub, const std::string& path) {
  auto text = tally::ReadFile(path);
  if (!text.ok()) {
    std::cerr << "tally: " << text.status().message() << "\n";
    return 1;
  }
  tally::v1::SubmitJobRequest req;
  req.set_spec(*text);
  tally::v1::SubmitJobResponse resp;
  auto ctx = Context();
  grpc::Status s = stub.SubmitJob(ctx.get(), req, &resp);
  if (!s.ok()) return Report(s);
  std::printf("%s\n", resp.job().id().c_str());
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_wait)) return Watch(stub, resp.job().id());
  std::printf("%s\n", Line(resp.job()).c_str());
  return 0;
}

// Where fetch and report write: the PATH after the job, or --output=PATH
// (not two different ones). "" once it has said what is wrong.
std::string OutputPath(const std::string& cmd, const std::vector<char*>& args,
                       const char* what) {
  const std::string flag = absl::GetFlag(FLAGS_output);
  const std::string positional = args.size() > 3 ? args[3] : "";
  if (!flag.empty() && !positional.empty() && flag != positional) {
    std::cerr << "tally " << cmd << ": two paths, " << positional
              << " and --output=" << flag << "\n";
    return "";
  }
  const std::string out = positional.empty() ? flag : positional;
  if (out.empty()) {
    std::cerr << "tally " << cmd << " needs a path: tally " << cmd << " JOB "
              << what << " (or --output=" << what << ")\n";
  }
  return out;
}

int Fetch(tally::v1::JobService::Stub& stub, const std::string& id,
          const std::string& out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s) * 30)));
  tally::v1::FetchWeightsRequest req;
  req.set_job_id(id);
  auto reader = stub.FetchWeights(&ctx, req);
  // Straight to the file (a job's tables may be larger than this
  // machine's memory), renamed into place once whole.
  const std::string part = out + ".part";
  std::FILE* f = std::fopen(part.c_str(), "wb");
  if (f == nullptr) {
    std::cerr << "tally: " << part << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  tally::v1::FileChunk chunk;
  int64_t bytes = 0;
  std::string head;  // the header's start, for its "tables" note
  std::string buffers_note;
  bool written = true;
  while (reader->Read(&chunk)) {
    if (buffers_note.empty()) buffers_note = chunk.buffers_note();
    written = written && std::fwrite(chunk.data().data(), 1,
                                     chunk.data().size(), f) ==
                             chunk.data().size();
    if (head.size() < 65536) head += chunk.data().substr(0, 65536);
    bytes += static_cast<int64_t>(chunk.data().size());
  }
  grpc::Status s = reader->Finish();
  written = written && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  written = std::fclose(f) == 0 && written;
  if (!s.ok() || !written ||
      std::rename(part.c_str(), out.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(part.c_str());
    if (!s.ok()) return Report(s);
    std::cerr << "tally: writing " << out << ": " << why << "\n";
    return 1;
  }
  std::printf("wrote %s (%lld bytes)\n", out.c_str(),
              static_cast<long long>(bytes));
  // A Python model's file without its buffers fails a strict load: said
  // where it cannot be missed.
  if (!buffers_note.empty()) {
    std::fprintf(stderr, "tally: warning: %s has no buffers of the model: %s\n",
                 out.c_str(), buffers_note.c_str());
  }
  // A job with tables whose file has none says why in its metadata.
  const std::string key = "\"tables\":\"";
  if (size_t at = head.find(key); at != std::string::npos) {
    const size_t from = at + key.size();
    std::printf("the file has no embedding tables: %s\n",
                head.substr(from, head.find('"', from) - from).c_str());
  }
  return 0;
}

// One self-contained HTML file: the dashboard's job page with the job's
// record, curves, events and the shards that hold it built in.
int WriteReport(tally::v1::JobService::Stub& stub, const std::string& id,
                const std::string& out) {
  tally::v1::GetJobRequest req;
  req.set_job_id(id);
  Job job;
  grpc::Status s = stub.GetJob(Context().get(), req, &job);
  if (!s.ok()) return Report(s);
  tally::v1::JobHistory history;
  s = stub.GetJobHistory(Context().get(), req, &history);
  if (!s.ok()) return Report(s);
  std::string shards = "[]";
  tally::v1::ListShardsResponse listed;
  // Shards are an admin's or a viewer's to see; a report goes on without.
  if (stub.ListShards(Context().get(), {}, &listed).ok()) {
    shards = tally::JobShardsJson(
        {listed.shards().begin(), listed.shards().end()}, id);
  }
  const std::string detail = absl::StrCat(
      "{\"job\":", tally::PageJson(job), ",\"history\":", tally::PageJson(history),
      ",\"workers\":[],\"shards\":", shards, ",\"written_unix\":",
      absl::ToUnixSeconds(absl::Now()), "}");
  absl::Status w = tally::WriteFileAtomic(out, tally::StaticReportPage(detail));
  if (!w.ok()) {
    std::cerr << "tally: " << w.message() << "\n";
    return 1;
  }
  std::printf("wrote %s (%s, %d curve points, %d events)\n", out.c_str(),
              id.c_str(), history.curve_size(), history.events_size());
  return 0;
}

int Health(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = Context();
  grpc::Status s = stub->Check(ctx.get(), req, &resp);
  if (!s.ok()) return Report(s);
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                          resp.status())
                          .c_str());
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0
                                                                         : 1;
}

int Shards(tally::v1::JobService::Stub& stub) {
  tally::v1::ListShardsResponse resp;
  auto ctx = Context();
  grpc::Status s = stub.ListShards(ctx.get(), {}, &resp);
  if (!s.ok()) return Report(s);
  if (resp.shards().empty()) std::printf("no shards\n");
  for (const auto& sh : resp.shards()) {
    std::printf(
        "%-16s %-24s %-5s %10.1f MB held\n", sh.shard_id().c_str(),
        tally::ResolveShardAddress(absl::GetFlag(FLAGS_server), sh.address())
            .c_str(),
        sh.live() ? "live" : "LOST", static_cast<double>(sh.bytes()) / 1e6);
    for (const auto& r : sh.ranges()) {
      // A replicated range: which copy this is, and where the other is.
      std::string copy;
      if (r.backup()) {
        copy = "  backup copy";
      } else if (!r.peer_address().empty()) {
        copy = "  primary, backup on " + r.peer_address();
      }
      std::printf(
          "                 %-8s [%lld, %lld)  %lld elements, at step "
          "%lld%s\n",
          r.job_id().c_str(), static_cast<long long>(r.offset()),
          static_cast<long long>(r.offset() + r.count()),
          static_cast<long long>(r.count()),
          static_cast<long long>(r.version()), copy.c_str());
    }
  }
  return 0;
}

int List(tally::v1::JobService::Stub& stub) {
  tally::v1::ListJobsRequest req;
  req.set_omit_spec(true);
  req.set_page_size(500);
  int shown = 0;
  do {  // every page
    tally::v1::ListJobsResponse resp;
    auto ctx = Context();
    grpc::Status s = stub.ListJobs(ctx.get(), req, &resp);
    if (!s.ok()) return Report(s);
    for (const Job& j : resp.jobs()) std::printf("%s\n", Line(j).c_str());
    shown += resp.jobs_size();
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  if (shown == 0) std::printf("no jobs\n");
  return 0;
}

// `status` and `cancel` answer with the job.
int StatusOrCancel(tally::v1::JobService::Stub& stub, const std::string& cmd,
                   const std::string& id) {
  Job job;
  auto ctx = Context();
  grpc::Status s;
  if (cmd == "status") {
    tally::v1::GetJobRequest req;
    req.set_job_id(id);
    s = stub.GetJob(ctx.get(), req, &job);
  } else {
    tally::v1::CancelJobRequest req;
    req.set_job_id(id);
    s = stub.CancelJob(ctx.get(), req, &job);
  }
  if (!s.ok()) return Report(s);
  if (absl::GetFlag(FLAGS_json)) {
    std::string json;
    google::protobuf::util::JsonPrintOptions o;
    o.add_whitespace = true;
    o.always_print_primitive_fields = true;
    o.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(job, &json, o);
    std::printf("%s", json.c_str());
  } else {
    std::printf("%s\n%s%s", Line(job).c_str(), MembershipTable(job).c_str(),
                WorkerTable(job).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tally::UseTransportExperiments();
  std::vector<char*> args = tally::ParseProgramFlags(argc, argv, kUsage);
  if (args.size() < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = args[1];
  auto need = [&](size_t n) {
    if (args.size() != n) {
      std::cerr << "tally " << cmd << ": wrong number of arguments\n" << kUsage;
      return false;
    }
    return true;
  };
  auto transport = tally::TransportFromFlags();
  if (!transport.ok()) {
    std::cerr << "tally: " << transport.status().message() << "\n";
    return 2;
  }
  auto channel = tally::Dial(absl::GetFlag(FLAGS_server), *transport);
  auto stub = tally::v1::JobService::NewStub(channel);
  if (cmd == "submit") return need(3) ? Submit(*stub, args[2]) : 2;
  if (cmd == "watch") return need(3) ? Watch(*stub, args[2]) : 2;
  if (cmd == "fetch" || cmd == "report") {  // JOB, then PATH or --output
    if (args.size() != 3 && !need(4)) return 2;
    const std::string out =
        OutputPath(cmd, args, cmd == "fetch" ? "PATH" : "FILE.html");
    if (out.empty()) return 2;
    return cmd == "fetch" ? Fetch(*stub, args[2], out)
                          : WriteReport(*stub, args[2], out);
  }
  if (cmd == "health") return need(2) ? Health(channel) : 2;
  if (cmd == "shards") return need(2) ? Shards(*stub) : 2;
  if (cmd == "list") return need(2) ? List(*stub) : 2;
  if (cmd == "status" || cmd == "cancel")
    return need(3) ? StatusOrCancel(*stub, cmd, args[2]) : 2;
  std::cerr << "tally: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}
