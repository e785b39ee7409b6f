// How every Tally program talks gRPC: one place for channel arguments,
// message limits, HTTP/2 tuning for bulk tensor traffic, and credentials.
// The server, the worker daemon (to the coordinator and to every shard), the
// `tally` client, the tests and the benchmarks all dial and listen through
// these functions, so a setting changes in one place.
//
// Credentials: plaintext, or TLS with client certificates (mTLS) and a
// bearer token per call (proto/auth.h says who may call what). Every
// program takes the same flags, read in its main() through
// proto/transport_flags.h. Thread-safe (no shared state).
#ifndef TALLY_PROTO_TRANSPORT_H_
#define TALLY_PROTO_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace google::protobuf {
class MessageLite;
}
namespace grpc {
class Channel;
class ServerBuilder;
}  // namespace grpc

namespace tally {

class TokenTable;

// Largest message a server accepts; a push chunk is at most 1 MiB of data.
inline constexpr int kMaxMessageBytes = 4 * 1024 * 1024;
// Largest message a client accepts (a pull chunk, a job record).
inline constexpr int kMaxClientReceiveBytes = 8 * 1024 * 1024;
// Largest control message (everything but tensor chunks and job specs): a
// handler refuses a bigger one with kResourceExhausted (CheckControlMessage).
inline constexpr size_t kMaxControlBytes = 256 * 1024;
// What gRPC's own buffers may take in a data-plane server (its resource
// quota): under pressure it shrinks flow-control windows and cuts oversized
// calls.
inline constexpr size_t kServerMemoryQuotaBytes = 256 << 20;
// The same for a control-plane server (jobs, workers, shard registrations):
// gRPC 1.51 reads a message whole before its size limit applies, so this is
// what an oversized request can take before it is cut.
inline constexpr size_t kControlMemoryQuotaBytes = 32 << 20;
// A server's receive window per stream (HTTP/2's initial window): what one
// caller may have sent that the server has not read yet. A shard leaves a
// worker's push unread while lower ranks add the same block first, so this
// much (and up to 1 MiB more) per worker is shard memory; one stream moves
// at most a window per round trip (2 MiB / 1 ms = 2 GB/s).
inline constexpr int kServerStreamWindowBytes = 2 * 1024 * 1024;
// Calls one connection may have open at once (HTTP/2 streams).
inline constexpr int kMaxStreamsPerConnection = 128;
// Elements per tensor chunk unless a caller asks for fewer: 1 MiB of float32.
inline constexpr int64_t kDefaultChunkElements = 262144;

// What a program holds to speak TLS: PEM text, not paths.
struct TlsMaterial {
  std::string ca_pem;    // trust anchors for the peer's certificate
  std::string cert_pem;  // this program's certificate chain
  std::string key_pem;   // and its private key
  bool enabled() const { return !ca_pem.empty(); }
};

// Reads --tls_ca, --tls_cert and --tls_key: all three or none (a TLS peer
// without a certificate of its own cannot pass mTLS). NOT_FOUND or
// INVALID_ARGUMENT names the file.
absl::StatusOr<TlsMaterial> LoadTls(const std::string& ca_path,
                                    const std::string& cert_path,
                                    const std::string& key_path);

struct TransportOptions {
  // How soon a client retries a server that went away (reconnect backoff).
  absl::Duration max_reconnect_backoff = absl::Seconds(2);
  // Largest message a client accepts.
  int max_receive_bytes = kMaxClientReceiveBytes;
  // TLS (with this program's certificate) when enabled; plaintext if not.
  TlsMaterial tls;
  // Sent as "authorization: Bearer TOKEN" on every call (TLS only).
  std::string token;
  // A connection of the channel's own. gRPC shares one between the channels
  // of a process that dial the same server with the same settings; a
  // process that stands for many workers (bench/swarm.cc) must not.
  bool own_connection = false;
};

struct ServerSecurity {
  // TLS when enabled, and every client must present a certificate signed by
  // tls.ca_pem (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
  TlsMaterial tls;
  // Bearer tokens and roles checked on every call (needs TLS); null: every
  // caller that completes the handshake may call everything.
  std::shared_ptr<const TokenTable> tokens;
  // Allow listening beyond loopback in plaintext.
  bool insecure = false;
};

// Secure by default: FAILED_PRECONDITION for a plaintext server on an
// address other than loopback unless `insecure`, and for a token table
// without TLS (tokens would cross the network in the clear).
absl::Status CheckServerSecurity(const std::string& address,
                                 const ServerSecurity& security);

// kResourceExhausted when a control request is over kMaxControlBytes (gRPC
// has one receive limit per port, the bulk one; control methods apply this
// smaller one to the parsed request).
absl::Status CheckControlMessage(const google::protobuf::MessageLite& request);

// Turns on the gRPC transport experiments Tally runs with, unless the
// environment names its own (GRPC_EXPERIMENTS, even empty: then none):
// tcp_frame_size_tuning (a read completes once the frame it waits for is
// whole) and tcp_rcv_lowat (SO_RCVLOWAT: the socket wakes its reader once
// that much has arrived, not at every segment). A megabyte message then
// costs one wake-up and one read instead of dozens: between network hosts
// a 67 MB push + pull ran 1.2x faster and the two-worker MLP 1.1x
// (bench/README.md). Call first in main(), before any gRPC object exists:
// gRPC reads the variable once.
void UseTransportExperiments();

// A channel to `target` ("host:port") with Tally's settings.
std::shared_ptr<grpc::Channel> Dial(const std::string& target,
                                    const TransportOptions& options = {});

// What a listener carries. gRPC's memory quota and message limit are per
// server, not per method, so the two planes listen apart: the control
// plane's small calls under a small quota, the data plane's tensor streams
// under a large one with bulk HTTP/2 tuning.
enum class Plane { kControl, kData };

// Adds a listening port on `address` ("0.0.0.0:7070"; port 0 picks one,
// written to *port once the server starts) and applies Tally's server
// settings for `plane`: message limit, memory quota, HTTP/2 tuning (for the
// data plane a receive window of `stream_window_bytes` per stream), and no
// port sharing, so a second server on a busy port fails instead of silently
// taking half its calls.
void ConfigureServer(const std::string& address, grpc::ServerBuilder* builder,
                     int* port, const ServerSecurity& security, Plane plane,
                     int stream_window_bytes = kServerStreamWindowBytes);

// Where a worker reaches a shard named in a shard map (ShardMap.Entry.
// address) that it got from the coordinator at `coordinator`: "host:port"
// as it is; ":port" on the coordinator's host (the coordinator's own shard,
// which listens apart from its control plane); empty, the coordinator's
// address itself.
std::string ResolveShardAddress(const std::string& coordinator,
                                const std::string& address);

}  // namespace tally

#endif  // TALLY_PROTO_TRANSPORT_H_
