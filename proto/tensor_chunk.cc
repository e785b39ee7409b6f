#include "proto/tensor_chunk.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/bfloat16.h"

namespace tally {

absl::StatusOr<int> DTypeWidth(int dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::BFLOAT16:
      return 2;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown tensor dtype ", dtype));
  }
}

void EncodeChunk(const float* values, int64_t offset, int64_t count,
                 v1::DType dtype, v1::TensorChunk* chunk) {
  chunk->set_offset(offset);
  chunk->set_count(count);
  chunk->set_dtype(dtype);
  if (dtype == v1::BFLOAT16) {
    std::string* data = chunk->mutable_data();
    data->resize(2 * count);
    FloatToBfloat16(values, data->data(), count);
  } else {
    chunk->set_data(reinterpret_cast<const char*>(values), 4 * count);
  }
}

namespace {

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// A varint field (proto3: absent when 0).
uint8_t* PutField(uint8_t* p, int field, int64_t v) {
  if (v == 0) return p;
  *p++ = static_cast<uint8_t>(field << 3);
  return PutVarint(p, static_cast<uint64_t>(v));
}

size_t FieldSize(int64_t v) {
  return v == 0 ? 0 : 1 + VarintSize(static_cast<uint64_t>(v));
}

}  // namespace

template <typename T>
grpc::Slice HeldSlice(std::shared_ptr<const std::vector<T>> values) {
  auto* held = new std::shared_ptr<const std::vector<T>>(std::move(values));
  return grpc::Slice(
      const_cast<T*>((*held)->data()), (*held)->size() * sizeof(T),
      [](void* p) { delete static_cast<std::shared_ptr<const std::vector<T>>*>(p); },
      held);
}

grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<float>> values) {
  return HeldSlice(std::move(values));
}

grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<uint16_t>> values) {
  return HeldSlice(std::move(values));
}

void EncodePullResponse(int64_t version, int64_t total_steps, int64_t offset,
                        int64_t count, v1::DType dtype,
                        const grpc::Slice& values, int64_t first,
                        grpc::ByteBuffer* out) {
  const bool bf16 = dtype == v1::BFLOAT16;
  const int64_t nb = count * (bf16 ? 2 : 4);
  // PullResponse: 1 version, 2 total_steps, 3 chunk. TensorChunk, in field
  // order as protobuf writes it: 1 offset, 2 count, 3 data, 4 dtype.
  const size_t chunk_len = FieldSize(offset) + FieldSize(count) +
                           (nb > 0 ? 1 + VarintSize(nb) + nb : 0) +
                           FieldSize(dtype);
  uint8_t head[64];
  uint8_t* p = head;
  p = PutField(p, 1, version);
  p = PutField(p, 2, total_steps);
  *p++ = (3 << 3) | 2;
  p = PutVarint(p, chunk_len);
  p = PutField(p, 1, offset);
  p = PutField(p, 2, count);
  if (nb > 0) {
    *p++ = (3 << 3) | 2;
    p = PutVarint(p, static_cast<uint64_t>(nb));
  }
  grpc::Slice slices[3];
  slices[0] = grpc::Slice(head, static_cast<size_t>(p - head));
  size_t n = 1;
  const size_t begin = static_cast<size_t>(first) * (bf16 ? 2 : 4);
  if (nb > 0) slices[n++] = values.sub(begin, begin + nb);
  uint8_t tail[16];
  const uint8_t* tail_end = PutField(tail, 4, dtype);
  if (tail_end > tail) {
    slices[n++] = grpc::Slice(tail, static_cast<size_t>(tail_end - tail));
  }
  grpc::ByteBuffer buffer(slices, n);
  out->Swap(&buffer);
}

absl::Status CheckChunk(const v1::TensorChunk& c, int64_t n) {
  const bool empty_ok = n == 0 && c.offset() == 0 && c.count() == 0;
  if (!empty_ok && (c.offset() < 0 || c.count() <= 0 || c.count() > n ||
                    c.offset() > n - c.count())) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk [", c.offset(), ", +", c.count(),
                     ") is outside the ", n, "-element parameter vector"));
  }
  absl::StatusOr<int> width = DTypeWidth(c.dtype());
  if (!width.ok()) return width.status();
  if (static_cast<int64_t>(c.data().size()) != *width * c.count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk at ", c.offset(), " says ", c.count(), " ",
        v1::DType_Name(c.dtype()), " elements but carries ", c.data().size(),
        " bytes (want ", *width * c.count(), ")"));
  }
  return absl::OkStatus();
}

void DecodeChunk(const v1::TensorChunk& c, float* vector) {
  if (c.dtype() == v1::BFLOAT16) {
    Bfloat16ToFloat(c.data().data(), vector + c.offset(), c.count());
  } else {
    std::memcpy(vector + c.offset(), c.data().data(), c.data().size());
  }
}

}  // namespace tally
