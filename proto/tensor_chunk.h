// Reading and writing TensorChunk, the piece of a flat float32 vector that
// pushes and pulls carry, in either wire dtype (FLOAT32, BFLOAT16). One
// place for what the server, the worker and the benchmarks all do.
// Thread-safe (no shared state).
#ifndef TALLY_PROTO_TENSOR_CHUNK_H_
#define TALLY_PROTO_TENSOR_CHUNK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/tally.pb.h"

namespace tally {

// Bytes per value of a wire dtype; kInvalidArgument for one this build does
// not know (a newer peer).
absl::StatusOr<int> DTypeWidth(int dtype);

// Makes `chunk` hold elements [offset, offset + count) of a vector, whose
// values are values[0, count), encoded as `dtype`.
void EncodeChunk(const float* values, int64_t offset, int64_t count,
                 v1::DType dtype, v1::TensorChunk* chunk);

// kInvalidArgument, saying what is wrong, unless `chunk` lies inside a
// vector of n elements (non-empty unless n is 0), has a known dtype and
// carries exactly count values of it.
absl::Status CheckChunk(const v1::TensorChunk& chunk, int64_t n);

// Writes a checked chunk's values, as float32, to vector + chunk.offset().
void DecodeChunk(const v1::TensorChunk& chunk, float* vector);

}  // namespace tally

#endif  // TALLY_PROTO_TENSOR_CHUNK_H_
