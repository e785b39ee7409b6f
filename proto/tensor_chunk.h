// Reading and writing TensorChunk, the piece of a flat float32 vector that
// pushes and pulls carry, in either wire dtype (FLOAT32, BFLOAT16). One
// place for what the server, the worker and the benchmarks all do.
// Thread-safe (no shared state).
#ifndef TALLY_PROTO_TENSOR_CHUNK_H_
#define TALLY_PROTO_TENSOR_CHUNK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/tally.pb.h"

namespace grpc {
class ByteBuffer;
class Slice;
}  // namespace grpc

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

// A PullResponse {version, total_steps, chunk} as gRPC bytes, written
// without protobuf and without copying the values: a header slice of a few
// dozen bytes, then a slice of `values` (a whole range's values, already
// encoded as `dtype`; the chunk's are values[first, first + count), its
// elements [offset, offset + count) of the job's vector), then in bfloat16
// the dtype field. Byte for byte what PullResponse::SerializeAsString gives
// for the same fields (tested), so any protobuf client reads it.
void EncodePullResponse(int64_t version, int64_t total_steps, int64_t offset,
                        int64_t count, v1::DType dtype,
                        const grpc::Slice& values, int64_t first,
                        grpc::ByteBuffer* out);
// Slices over a snapshot of float32 values, or of their bfloat16 encoding,
// that hold it (the memory must not change while gRPC may still send from
// it).
grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<float>> values);
grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<uint16_t>> values);

}  // namespace tally

#endif  // TALLY_PROTO_TENSOR_CHUNK_H_
