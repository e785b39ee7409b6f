// Reading and writing TensorChunk, the piece of a flat float32 vector that
// pushes and pulls carry, in either wire dtype (FLOAT32, BFLOAT16). One
// place for what the server, the worker and the benchmarks all do.
// Thread-safe (no shared state).
#ifndef TALLY_PROTO_TENSOR_CHUNK_H_
#define TALLY_PROTO_TENSOR_CHUNK_H_

#include <grpcpp/support/slice.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/tally.pb.h"

namespace grpc {
class ByteBuffer;
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

// The same check on a chunk's fields: offset, count, dtype and the size in
// bytes of its data.
absl::Status CheckChunkFields(int64_t offset, int64_t count, int dtype,
                              int64_t data_size, int64_t n);

// Writes a checked chunk's values, as float32, to vector + chunk.offset().
void DecodeChunk(const v1::TensorChunk& chunk, float* vector);

// ------------------------------------------------ raw gRPC bytes, no copies --
//
// Pushes and pulls travel as the .proto says, but neither end runs protobuf
// over the values: a sender writes each message as a few small slices of
// fields around a slice of the tensor memory itself, and a receiver reads the
// fields from gRPC's slices and hands the values, where they lie, to a
// decoder that writes them to their destination (the staging buffer, the
// parameters). The bytes are those protobuf writes and reads (tested both
// ways), so a client in any language interoperates.

// A length-delimited field as protobuf writes it: its tag (field number,
// wire type 2), the varint length of `body`, and `body`. For the messages
// built by hand around tensor memory (a push's header, a push's answer).
std::string LengthDelimitedField(int field, const std::string& body);

// A TensorChunk's fields as they lie in a received message.
struct WireChunk {
  int64_t offset = 0;
  int64_t count = 0;
  int dtype = 0;
  int64_t data_size = 0;  // bytes of `data`
  // TensorChunk.shared_offset was set: the values lie in the stream's
  // shared region from that byte (proto/shared_memory.h).
  bool shared = false;
  int64_t shared_offset = 0;
};

// A received message with one TensorChunk field (PushRequest: field 2;
// PullResponse: field 3), read from gRPC's bytes without copying the chunk's
// values. Reads as protobuf does: fields in any order, the last value of a
// repeated scalar wins, occurrences of a message field merge, unknown
// fields (groups included) are skipped.
// Reusable: Parse resets it. Not thread-safe.
class WireMessage {
 public:
  static constexpr int kMaxField = 15;  // fields above are skipped

  // kInvalidArgument, saying where, unless `buffer` is a well-formed
  // protobuf message.
  absl::Status Parse(const grpc::ByteBuffer& buffer, int chunk_field);

  // Whether length-delimited field `field` (a message, bytes, string) was
  // there; the same field with another wire type is unknown to protobuf,
  // and does not count.
  bool has(int field) const { return (present_ >> field) & 1u; }
  // The last value of varint field `field`; 0 when absent.
  int64_t varint(int field) const { return varints_[field]; }
  // Every occurrence of length-delimited field `field`, concatenated: for a
  // message field, bytes that parse to what protobuf's merge gives.
  const std::string& bytes(int field) const { return bytes_[field]; }
  const WireChunk& chunk() const { return chunk_; }

  // A chunk whose values lie in shared memory: from now on (until the next
  // Parse) its data is the `size` bytes at `data`, which the caller found
  // inside its region. ForEachValues hands them out from there, in one run.
  void UseData(const char* data, int64_t size) {
    external_ = data;
    chunk_.data_size = size;
  }

  // Hands out the chunk's data, in order, as runs of whole values of
  // `width` bytes: fn(src, n, first) for values [first, first + n) of the
  // chunk at `src` (not aligned). A value split between two slices comes
  // alone, from a small buffer. Call it only once CheckChunkFields passed.
  void ForEachValues(
      int width,
      absl::FunctionRef<void(const char* src, int64_t n, int64_t first)> fn)
      const;

 private:
  class Cursor;
  absl::Status ParseChunk(Cursor* in);

  std::vector<grpc::Slice> slices_;
  uint32_t present_ = 0;
  int64_t varints_[kMaxField + 1] = {};
  std::string bytes_[kMaxField + 1];
  WireChunk chunk_;
  int chunk_field_ = 0;
  size_t data_slice_ = 0;  // where the data starts: slice, byte in it
  size_t data_skip_ = 0;
  const char* external_ = nullptr;  // UseData's
};

// A PushRequest as gRPC bytes: `header` (the first message's; else null),
// then, when count > 0, the chunk of elements [offset, offset + count),
// whose values are `values` from value `first` on, already in `dtype`.
// The values are not copied: the buffer holds `values`. `suffix`, encoded
// fields of a message that extends PushRequest (ExchangeRequest's
// push_done), goes after them.
void EncodePushRequest(const v1::PushHeader* header, int64_t offset,
                       int64_t count, v1::DType dtype,
                       const grpc::Slice& values, int64_t first,
                       grpc::ByteBuffer* out,
                       const std::string& suffix = std::string());

// A PullResponse {version, total_steps, chunk, buffers} as gRPC bytes, written
// without protobuf and without copying the values: a header slice of a few
// dozen bytes, then a slice of `values` (a whole range's values, already
// encoded as `dtype`; the chunk's are values[first, first + count), its
// elements [offset, offset + count) of the job's vector), then in bfloat16
// the dtype field. Byte for byte what PullResponse::SerializeAsString gives
// for the same fields (tested), so any protobuf client reads it.
void EncodePullResponse(int64_t version, int64_t total_steps, int64_t offset,
                        int64_t count, v1::DType dtype,
                        const grpc::Slice& values, int64_t first,
                        grpc::ByteBuffer* out,
                        const std::string& buffers = std::string());
// Slices over a snapshot of float32 values, or of their bfloat16 encoding,
// that hold it (the memory must not change while gRPC may still send from
// it).
grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<float>> values);
grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<uint16_t>> values);

}  // namespace tally

#endif  // TALLY_PROTO_TENSOR_CHUNK_H_
