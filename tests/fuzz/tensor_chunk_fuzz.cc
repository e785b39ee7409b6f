// libFuzzer: a TensorChunk as it arrives in a push (protobuf bytes), checked
// against a vector of n elements and, when accepted, decoded into it. The
// first two bytes choose n (1..65536), the rest is the message.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "proto/tally.pb.h"
#include "proto/tensor_chunk.h"

// protobuf logs every string field with invalid UTF-8; the harness runs
// millions of such inputs.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t n = 1 + (data[0] | (data[1] << 8));
  tally::v1::TensorChunk chunk;
  if (!chunk.ParseFromArray(data + 2, static_cast<int>(size - 2))) return 0;
  if (!tally::CheckChunk(chunk, n).ok()) return 0;
  std::vector<float> vector(n);
  tally::DecodeChunk(chunk, vector.data());
  return 0;
}
