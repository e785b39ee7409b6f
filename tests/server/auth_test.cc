// mTLS and token roles, in process over a real TLS socket: every way in
// that should fail fails with its code (UNAVAILABLE at the handshake,
// UNAUTHENTICATED, PERMISSION_DENIED) and changes nothing. The certificates
// and tokens come from deploy/make-certs.sh (ctest's `certs` fixture runs
// it into TALLY_BINARY_DIR/test-certs).
#include "proto/auth.h"

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "proto/errors.h"
#include "proto/health.grpc.pb.h"
#include "proto/transport.h"
#include "server/tally_server.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"(
name: tiny
model: {layers: [{linear: {in_features: 4, out_features: 2}}]}
dataset: {name: synthetic, features: 4, classes: 2}
training: {workers: 1}
optimizer: {type: sgd, lr: 1.0}
)";

std::string CertPath(const std::string& name) {
  return std::string(TALLY_BINARY_DIR) + "/test-certs/" + name;
}

std::string Token(const std::string& who) {
  std::ifstream in(CertPath(who + ".token"));
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

TlsMaterial Tls(const std::string& cert, const std::string& ca = "ca") {
  auto tls = LoadTls(CertPath(ca + ".pem"), CertPath(cert + ".pem"),
                     CertPath(cert + ".key"));
  EXPECT_TRUE(tls.ok()) << tls.status()
                        << " (run deploy/make-certs.sh through ctest)";
  return tls.ok() ? *tls : TlsMaterial{};
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.coordinator.lease_timeout = absl::Seconds(30);
    o.security.tls = Tls("node");
    auto tokens = TokenTable::Load(CertPath("tokens.txt"));
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    o.security.tokens = *tokens;
    auto s = TallyServer::Start("127.0.0.1:0", o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    target_ = absl::StrCat("localhost:", server_->port());
  }

  // A channel as `who` (a token file's name; "" for none) with `cert`.
  std::shared_ptr<grpc::Channel> As(const std::string& who,
                                    const std::string& cert = "node",
                                    const std::string& ca = "ca") {
    return Dial(target_, As(who, cert, ca, nullptr));
  }
  static TransportOptions As(const std::string& who, const std::string& cert,
                             const std::string& ca, std::nullptr_t) {
    TransportOptions t;
    t.tls = Tls(cert, ca);
    if (!who.empty()) t.token = Token(who);
    return t;
  }

  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return c;
  }

  absl::StatusOr<v1::Job> Submit(const std::shared_ptr<grpc::Channel>& ch) {
    v1::SubmitJobRequest req;
    req.set_spec(kSpec);
    v1::SubmitJobResponse resp;
    absl::Status s = FromGrpc(
        v1::JobService::NewStub(ch)->SubmitJob(Ctx().get(), req, &resp));
    if (!s.ok()) return s;
    return resp.job();
  }

  absl::Status Cancel(const std::shared_ptr<grpc::Channel>& ch,
                      const std::string& id) {
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::Job out;
    return FromGrpc(
        v1::JobService::NewStub(ch)->CancelJob(Ctx().get(), req, &out));
  }

  absl::StatusOr<v1::Job> Get(const std::shared_ptr<grpc::Channel>& ch,
                              const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job out;
    absl::Status s =
        FromGrpc(v1::JobService::NewStub(ch)->GetJob(Ctx().get(), req, &out));
    if (!s.ok()) return s;
    return out;
  }

  absl::StatusOr<v1::ListJobsResponse> List(
      const std::shared_ptr<grpc::Channel>& ch) {
    v1::ListJobsResponse out;
    absl::Status s = FromGrpc(
        v1::JobService::NewStub(ch)->ListJobs(Ctx().get(), {}, &out));
    if (!s.ok()) return s;
    return out;
  }

  std::unique_ptr<TallyServer> server_;
  std::string target_;
};

TEST_F(AuthTest, AdminDoesEverything) {
  auto admin = As("admin");
  auto job = Submit(admin);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->owner(), "admin");
  EXPECT_TRUE(List(admin).ok());
  EXPECT_TRUE(Cancel(admin, job->id()).ok());
}

TEST_F(AuthTest, PlaintextClientCannotConnect) {
  auto ch = Dial(target_);  // no TLS
  EXPECT_THAT(List(ch), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(AuthTest, ClientTrustingAnotherCaRefusesTheServer) {
  // The client presents a good certificate but trusts another CA: the
  // server's certificate does not verify.
  TransportOptions t;
  t.tls = Tls("node", "ca");
  auto other = LoadTls(CertPath("stranger-ca.pem"), CertPath("node.pem"),
                       CertPath("node.key"));
  ASSERT_TRUE(other.ok());
  t.tls = *other;
  t.token = Token("admin");
  EXPECT_THAT(List(Dial(target_, t)),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(AuthTest, CertificateFromAnotherCaIsRefused) {
  // Trusts the right CA, but its own certificate comes from a stranger.
  auto tls = LoadTls(CertPath("ca.pem"), CertPath("stranger.pem"),
                     CertPath("stranger.key"));
  ASSERT_TRUE(tls.ok());
  TransportOptions t;
  t.tls = *tls;
  t.token = Token("admin");
  EXPECT_THAT(List(Dial(target_, t)),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_EQ(server_->coordinator()->List().size(), 0u);
}

TEST_F(AuthTest, ExpiredCertificateIsRefused) {
  EXPECT_THAT(Submit(As("admin", "expired")),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_EQ(server_->coordinator()->List().size(), 0u);
}

TEST_F(AuthTest, MissingOrUnknownTokenIsUnauthenticated) {
  EXPECT_THAT(Submit(As("")), StatusIs(absl::StatusCode::kUnauthenticated,
                                       HasSubstr("no bearer token")));
  TransportOptions t;
  t.tls = Tls("node");
  t.token = "not-a-token-this-server-knows";
  EXPECT_THAT(Submit(Dial(target_, t)),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("unknown bearer token")));
  EXPECT_EQ(server_->coordinator()->List().size(), 0u);
}

TEST_F(AuthTest, HealthNeedsNoTokenButTls) {
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_TRUE(grpc::health::v1::Health::NewStub(As(""))
                  ->Check(Ctx().get(), req, &resp)
                  .ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_THAT(FromGrpc(grpc::health::v1::Health::NewStub(Dial(target_))
                           ->Check(Ctx().get(), req, &resp)),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
}

TEST_F(AuthTest, ViewerReadsButCannotCancel) {
  auto job = Submit(As("alice"));
  ASSERT_TRUE(job.ok()) << job.status();
  auto viewer = As("viewer");
  EXPECT_TRUE(Get(viewer, job->id()).ok());
  EXPECT_TRUE(List(viewer).ok());
  EXPECT_THAT(Cancel(viewer, job->id()),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role viewer")));
  EXPECT_THAT(Submit(viewer),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  auto after = Get(As("admin"), job->id());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state(), v1::PENDING);
}

TEST_F(AuthTest, SubmitterTouchesOnlyItsOwnJobs) {
  auto alice = As("alice"), bob = As("bob");
  auto mine = Submit(alice);
  auto theirs = Submit(bob);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  EXPECT_EQ(mine->owner(), "alice");
  EXPECT_THAT(Cancel(alice, theirs->id()),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("someone else")));
  EXPECT_THAT(Get(alice, theirs->id()),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  v1::FetchWeightsRequest fr;
  fr.set_job_id(theirs->id());
  auto ctx = Ctx();
  auto reader = v1::JobService::NewStub(alice)->FetchWeights(ctx.get(), fr);
  v1::FileChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_THAT(FromGrpc(reader->Finish()),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  // Alice's list shows her job only; bob's job is untouched.
  auto list = List(alice);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->jobs_size(), 1);
  EXPECT_EQ(list->jobs(0).id(), mine->id());
  EXPECT_EQ(Get(bob, theirs->id())->state(), v1::PENDING);
  EXPECT_TRUE(Cancel(alice, mine->id()).ok());
}

TEST_F(AuthTest, ClientTokenOnTheWorkerServiceIsDenied) {
  v1::RegisterWorkerRequest req;
  req.set_name("intruder");
  req.set_protocol_version(v1::WORKER_PROTOCOL_CURRENT);
  v1::RegisterWorkerResponse resp;
  for (const char* who : {"alice", "viewer"}) {
    EXPECT_THAT(FromGrpc(v1::WorkerService::NewStub(As(who))->RegisterWorker(
                    Ctx().get(), req, &resp)),
                StatusIs(absl::StatusCode::kPermissionDenied,
                         HasSubstr("WorkerService")));
  }
  v1::PullRequest pull;
  pull.set_job_id("job-1");
  auto ctx = Ctx();
  // The data plane listens apart (the coordinator's own shard).
  const std::string data = absl::StrCat("localhost:", server_->data_port());
  auto reader = v1::ParameterService::NewStub(
                    Dial(data, As("alice", "node", "ca", nullptr)))
                    ->PullWeights(ctx.get(), pull);
  v1::PullResponse r;
  while (reader->Read(&r)) {
  }
  EXPECT_THAT(FromGrpc(reader->Finish()),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  // A worker token works there, and not on the job service.
  EXPECT_TRUE(FromGrpc(v1::WorkerService::NewStub(As("worker"))
                           ->RegisterWorker(Ctx().get(), req, &resp))
                  .ok());
  EXPECT_THAT(Submit(As("worker")),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  // Shard control is the admin's (the coordinator's) alone: a shard
  // process's data plane refuses a worker, and the coordinator does not
  // serve it at all (it steers its own shard in process).
  ServerOptions so;
  so.join = target_;
  so.security.tls = Tls("node");
  so.security.tokens = *TokenTable::Load(CertPath("tokens.txt"));
  so.coordinator.transport = As("admin", "node", "ca", nullptr);
  auto shard = TallyServer::Start("127.0.0.1:0", so);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::string shard_target =
      absl::StrCat("localhost:", (*shard)->port());
  v1::RetireRangeRequest retire;
  v1::RetireRangeResponse retired;
  EXPECT_THAT(FromGrpc(v1::ShardService::NewStub(
                           Dial(shard_target, As("worker", "node", "ca",
                                                 nullptr)))
                           ->RetireRange(Ctx().get(), retire, &retired)),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(FromGrpc(v1::ShardService::NewStub(As("admin"))
                           ->RetireRange(Ctx().get(), retire, &retired)),
              StatusIs(absl::StatusCode::kUnimplemented, ::testing::_));
}

TEST(ServerSecurityTest, PlaintextBeyondLoopbackNeedsInsecure) {
  ServerSecurity plain;
  EXPECT_TRUE(CheckServerSecurity("127.0.0.1:7070", plain).ok());
  EXPECT_TRUE(CheckServerSecurity("localhost:7070", plain).ok());
  EXPECT_TRUE(CheckServerSecurity("[::1]:7070", plain).ok());
  EXPECT_THAT(CheckServerSecurity("0.0.0.0:7070", plain),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--insecure")));
  EXPECT_THAT(CheckServerSecurity("10.1.2.3:7070", plain),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  plain.insecure = true;
  EXPECT_TRUE(CheckServerSecurity("0.0.0.0:7070", plain).ok());
  // Tokens never travel in plaintext, even on loopback.
  ServerSecurity tokens_only;
  tokens_only.tokens = *TokenTable::Parse("0123456789abcdef0123 admin root");
  EXPECT_THAT(CheckServerSecurity("127.0.0.1:7070", tokens_only),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("TLS")));
  // And TallyServer::Start applies the rule.
  EXPECT_THAT(TallyServer::Start("0.0.0.0:0", ServerOptions{}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

TEST(TokenTableTest, ParsesAndRefusesBadLines) {
  auto t = TokenTable::Parse(
      "# comment\n"
      "aaaaaaaaaaaaaaaa admin root\n"
      "\n"
      "bbbbbbbbbbbbbbbb submitter alice  # trailing comment\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->size(), 2u);
  ASSERT_NE((*t)->Find("bbbbbbbbbbbbbbbb"), nullptr);
  EXPECT_EQ((*t)->Find("bbbbbbbbbbbbbbbb")->name, "alice");
  EXPECT_EQ((*t)->Find("bbbbbbbbbbbbbbbb")->role, Role::kSubmitter);
  EXPECT_EQ((*t)->Find("nope"), nullptr);
  EXPECT_THAT(TokenTable::Parse("short admin x\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 1: token shorter")));
  EXPECT_THAT(TokenTable::Parse("aaaaaaaaaaaaaaaa root x\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown role")));
  EXPECT_THAT(TokenTable::Parse("aaaaaaaaaaaaaaaa admin\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("TOKEN ROLE NAME")));
  EXPECT_THAT(TokenTable::Parse("aaaaaaaaaaaaaaaa admin x\n"
                                "aaaaaaaaaaaaaaaa viewer y\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("line 2: token given twice")));
  EXPECT_THAT(TokenTable::Parse("# nothing\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(RolesTest, WhoMayCallWhat) {
  const std::string jobs = "/tally.v1.JobService/";
  EXPECT_TRUE(RoleMayCall(Role::kAdmin, "/tally.v1.ShardService/HoldRange"));
  EXPECT_TRUE(RoleMayCall(Role::kWorker, "/tally.v1.ParameterService/PullWeights"));
  EXPECT_FALSE(RoleMayCall(Role::kWorker, "/tally.v1.ShardService/HoldRange"));
  EXPECT_FALSE(RoleMayCall(Role::kWorker,
                           "/tally.v1.CoordinatorService/RegisterShard"));
  EXPECT_FALSE(RoleMayCall(Role::kWorker, jobs + "GetJob"));
  EXPECT_TRUE(RoleMayCall(Role::kViewer, jobs + "ListShards"));
  EXPECT_FALSE(RoleMayCall(Role::kViewer, jobs + "FetchWeights"));
  EXPECT_TRUE(RoleMayCall(Role::kSubmitter, jobs + "FetchWeights"));
  EXPECT_FALSE(RoleMayCall(Role::kSubmitter, jobs + "ListShards"));
  EXPECT_FALSE(RoleMayCall(Role::kSubmitter, jobs + "SubmitJobX"));
  EXPECT_TRUE(RoleMayCall(Role::kViewer, "/grpc.health.v1.Health/Check"));
}

}  // namespace
}  // namespace tally
