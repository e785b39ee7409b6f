// How every Tally program talks gRPC: one place for channel arguments,
// message limits, HTTP/2 tuning for bulk tensor traffic, and credentials.
// The server, the worker daemon (to the coordinator and to every shard), the
// `tally` client, the tests and the benchmarks all dial and listen through
// these functions, so a setting changes in one place.
//
// Credentials: plaintext today (TransportOptions is where TLS and tokens
// come in). Thread-safe (no shared state).
#ifndef TALLY_PROTO_TRANSPORT_H_
#define TALLY_PROTO_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"

namespace grpc {
class Channel;
class ServerBuilder;
}  // namespace grpc

namespace tally {

// Largest message a server accepts; a push chunk is at most 1 MiB of data.
inline constexpr int kMaxMessageBytes = 4 * 1024 * 1024;
// Largest message a client accepts (a pull chunk, a job record).
inline constexpr int kMaxClientReceiveBytes = 8 * 1024 * 1024;
// Elements per tensor chunk unless a caller asks for fewer: 1 MiB of float32.
inline constexpr int64_t kDefaultChunkElements = 262144;

struct TransportOptions {
  // How soon a client retries a server that went away (reconnect backoff).
  absl::Duration max_reconnect_backoff = absl::Seconds(2);
  // Largest message a client accepts.
  int max_receive_bytes = kMaxClientReceiveBytes;
};

// A channel to `target` ("host:port") with Tally's settings.
std::shared_ptr<grpc::Channel> Dial(const std::string& target,
                                    const TransportOptions& options = {});

// Adds a listening port on `address` ("0.0.0.0:7070"; port 0 picks one,
// written to *port once the server starts) and applies Tally's server
// settings: message limit, HTTP/2 tuning, and no port sharing, so a second
// server on a busy port fails instead of silently taking half its calls.
void ConfigureServer(const std::string& address, grpc::ServerBuilder* builder,
                     int* port);

}  // namespace tally

#endif  // TALLY_PROTO_TRANSPORT_H_
