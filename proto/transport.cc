#include "proto/transport.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <google/protobuf/message_lite.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/auth.h"

namespace tally {

namespace {

// Weights and gradients are megabytes per step: large HTTP/2 frames and a
// large flow-control window keep the link busy (the defaults, 16 KiB frames
// and a 64 KiB initial window, cap loopback at a fraction of TCP's speed),
// and large TCP reads stop every frame from costing several system calls.
// The window (GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, with bandwidth-delay
// probes off) is what a peer may send on a stream before it is read: a
// worker's 16 MiB for pulls, a server's kServerStreamWindowBytes.
constexpr int kHttp2FrameBytes = 4 * 1024 * 1024;
constexpr int kClientStreamWindowBytes = 16 * 1024 * 1024;
constexpr int kTcpReadChunkBytes = 1024 * 1024;

template <typename Args>
void SetBulkTuning(Args& set, int window_bytes) {
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, window_bytes);
  set(GRPC_ARG_TCP_READ_CHUNK_SIZE, kTcpReadChunkBytes);
  set(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kTcpReadChunkBytes);
  set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, kHttp2FrameBytes);
}

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", flag, "=", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, " is not a PEM file"));
  }
  return text.str();
}

// The host part of "host:port", "[v6]:port" or "host".
absl::string_view HostOf(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) {
    return address.substr(0, address.find(']'));
  }
  if (address.find(':') != address.rfind(':')) return address;  // bare v6
  return address.substr(0, address.find(':'));
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTls(const std::string& ca_path,
                                    const std::string& cert_path,
                                    const std::string& key_path) {
  TlsMaterial tls;
  const int given =
      !ca_path.empty() + !cert_path.empty() + !key_path.empty();
  if (given == 0) return tls;
  if (given != 3) {
    return absl::InvalidArgumentError(
        "TLS needs all of --tls_ca, --tls_cert and --tls_key (mTLS: every "
        "program presents its own certificate)");
  }
  auto ca = ReadPem(ca_path, "--tls_ca");
  if (!ca.ok()) return ca.status();
  auto cert = ReadPem(cert_path, "--tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(key_path, "--tls_key");
  if (!key.ok()) return key.status();
  tls.ca_pem = *std::move(ca);
  tls.cert_pem = *std::move(cert);
  tls.key_pem = *std::move(key);
  return tls;
}

absl::Status CheckServerSecurity(const std::string& address,
                                 const ServerSecurity& security) {
  if (security.tokens != nullptr && !security.tls.enabled()) {
    return absl::FailedPreconditionError(
        "--tokens needs TLS (--tls_ca, --tls_cert, --tls_key): bearer tokens "
        "are not sent in plaintext");
  }
  if (security.tls.enabled() || security.insecure) return absl::OkStatus();
  const absl::string_view host = HostOf(address);
  if (host == "127.0.0.1" || host == "localhost" || host == "::1" ||
      absl::StartsWith(host, "127.")) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to listen on ", address,
      " without TLS: anyone who reaches the port could submit, cancel and "
      "read jobs. Give --tls_ca, --tls_cert and --tls_key (deploy/"
      "make-certs.sh makes them), listen on 127.0.0.1, or pass --insecure"));
}

absl::Status CheckControlMessage(const google::protobuf::MessageLite& request) {
  const size_t n = request.ByteSizeLong();
  if (n <= kMaxControlBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "a ", request.GetTypeName(), " of ", n, " bytes is over the ",
      kMaxControlBytes, "-byte limit of control messages"));
}

void UseTransportExperiments() {
  // Not overwritten: the operator's word wins.
  setenv("GRPC_EXPERIMENTS", "tcp_frame_size_tuning,tcp_rcv_lowat", 0);
}

std::shared_ptr<grpc::Channel> Dial(const std::string& target,
                                    const TransportOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_bytes);
  args.SetMaxSendMessageSize(-1);  // the server's limit is what counts
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(
                  absl::ToInt64Milliseconds(options.max_reconnect_backoff)));
  auto set = [&args](const char* name, int value) {
    args.SetInt(name, value);
  };
  SetBulkTuning(set, kClientStreamWindowBytes);
  // A stream's receive window stays at the lookahead here too: probes grew
  // it until a worker pulling the 74M model held 150 MiB more at its peak
  // (941 against 769 MiB), for no faster pulls (67 MB push+pull 1.20
  // against 1.15 GB/s, medians of 5 alternating runs). 16 MiB is above
  // the bandwidth-delay product of a datacenter link.
  set(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (options.own_connection) set(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.tls.enabled()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls.ca_pem;
    ssl.pem_cert_chain = options.tls.cert_pem;
    ssl.pem_private_key = options.tls.key_pem;
    creds = grpc::SslCredentials(ssl);
    if (!options.token.empty()) {
      creds = grpc::CompositeChannelCredentials(
          creds, grpc::AccessTokenCredentials(options.token));
    }
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(target, creds, args);
}

void ConfigureServer(const std::string& address, grpc::ServerBuilder* builder,
                     int* port, const ServerSecurity& security, Plane plane,
                     int stream_window_bytes) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (security.tls.enabled()) {
    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = security.tls.ca_pem;
    ssl.pem_key_cert_pairs.push_back(
        {security.tls.key_pem, security.tls.cert_pem});
    creds = grpc::SslServerCredentials(ssl);
    if (security.tokens != nullptr) {
      creds->SetAuthMetadataProcessor(
          std::make_shared<TokenAuthProcessor>(security.tokens));
    }
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  builder->AddListeningPort(address, creds, port);
  builder->SetMaxReceiveMessageSize(kMaxMessageBytes);
  // One peer cannot open calls without bound: a worker needs a push and a
  // pull per shard at a time, a client a few watches.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              kMaxStreamsPerConnection);
  // gRPC reads a message whole before it checks the size limit: without a
  // memory quota one 1 GB request costs 1 GB; with it the call is cut at
  // the quota (measured: 1,045 MB peak before, 280 MB after with the data
  // plane's quota).
  grpc::ResourceQuota quota(plane == Plane::kControl ? "tally-control"
                                                     : "tally-data");
  quota.Resize(plane == Plane::kControl ? kControlMemoryQuotaBytes
                                        : kServerMemoryQuotaBytes);
  builder->SetResourceQuota(quota);
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (plane == Plane::kControl) return;
  auto set = [builder](const char* name, int value) {
    builder->AddChannelArgument(name, value);
  };
  SetBulkTuning(set, stream_window_bytes);
  // A shard's receive window stays at the lookahead: bandwidth-delay probes
  // grew it to tens of MiB a stream on loopback, and what workers' pushes
  // have in flight is shard memory (measured with four workers of the 74M
  // model: peak 1,625 MiB with probes, 1,200 without; push+pull of 67 MB
  // unchanged). So is the lookahead itself, per worker whose push waits for
  // lower ranks: gRPC's read buffers at the peak were 46 MiB with 16 MiB
  // windows, 16 MiB with 2 MiB ones.
  set(GRPC_ARG_HTTP2_BDP_PROBE, 0);
}

std::string ResolveShardAddress(const std::string& coordinator,
                                const std::string& address) {
  if (address.empty()) return coordinator;
  if (address[0] != ':') return address;
  // The coordinator's host: everything before its last colon ("[::1]:7070"
  // keeps its brackets).
  const size_t colon = coordinator.rfind(':');
  return absl::StrCat(coordinator.substr(0, colon), address);
}

}  // namespace tally
