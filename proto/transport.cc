#include "proto/transport.h"

#include <grpcpp/grpcpp.h>

namespace tally {

namespace {

// Weights and gradients are megabytes per step: large HTTP/2 frames and a
// large flow-control window keep the link busy (the defaults, 16 KiB frames
// and a 64 KiB initial window, cap loopback at a fraction of TCP's speed),
// and large TCP reads stop every frame from costing several system calls.
constexpr int kHttp2FrameBytes = 4 * 1024 * 1024;
constexpr int kHttp2WindowBytes = 16 * 1024 * 1024;
constexpr int kTcpReadChunkBytes = 1024 * 1024;

template <typename Args>
void SetBulkTuning(Args& set) {
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kHttp2WindowBytes);
  set(GRPC_ARG_TCP_READ_CHUNK_SIZE, kTcpReadChunkBytes);
  set(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kTcpReadChunkBytes);
  set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, kHttp2FrameBytes);
}

}  // namespace

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
  SetBulkTuning(set);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                   args);
}

void ConfigureServer(const std::string& address, grpc::ServerBuilder* builder,
                     int* port) {
  builder->AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  builder->SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  auto set = [builder](const char* name, int value) {
    builder->AddChannelArgument(name, value);
  };
  SetBulkTuning(set);
}

}  // namespace tally
