// libFuzzer: a PushRequest as it arrives at a shard, read two ways: by the
// generated protobuf parser and by WireMessage, which reads gRPC's slices
// without copying the values (proto/tensor_chunk.h). Whenever protobuf
// reads the bytes, WireMessage must read them too, to the same chunk
// fields and the same values; a chunk accepted by CheckChunkFields is
// decoded into a vector of n elements. The first two bytes choose n
// (1..65536), the third how the rest is cut into slices.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "proto/tally.pb.h"
#include "proto/tensor_chunk.h"

// protobuf logs every string field with invalid UTF-8; the harness runs
// millions of such inputs.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int64_t n = 1 + (data[0] | (data[1] << 8));
  const size_t piece = 1 + data[2] % 16;
  const char* bytes = reinterpret_cast<const char*>(data + 3);
  const size_t len = size - 3;
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < len; at += piece)
    slices.emplace_back(bytes + at, std::min(piece, len - at));
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  tally::WireMessage wire;
  const bool wire_ok = wire.Parse(buffer, 2).ok();
  tally::v1::PushRequest pb;
  if (!pb.ParseFromArray(bytes, static_cast<int>(len))) return 0;
  if (!wire_ok) std::abort();  // protobuf read what WireMessage refused
  if (wire.has(1) != pb.has_header() || wire.has(2) != pb.has_chunk()) {
    std::abort();
  }
  const tally::WireChunk& c = wire.chunk();
  const tally::v1::TensorChunk& want = pb.chunk();
  if (c.offset != want.offset() || c.count != want.count() ||
      c.dtype != want.dtype() ||
      c.data_size != static_cast<int64_t>(want.data().size())) {
    std::abort();
  }
  if (!tally::CheckChunkFields(c.offset, c.count, c.dtype, c.data_size, n)
           .ok()) {
    return 0;
  }
  const int width = c.dtype == tally::v1::BFLOAT16 ? 2 : 4;
  std::string got(c.data_size, '\0');
  wire.ForEachValues(width, [&](const char* src, int64_t m, int64_t first) {
    std::memcpy(&got[first * width], src, m * width);
  });
  if (got != want.data()) std::abort();
  std::vector<float> vector(n);
  tally::DecodeChunk(want, vector.data());
  return 0;
}
