#include "proto/tensor_chunk.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/bfloat16.h"
#include "common/status_macros.h"

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

std::string LengthDelimitedField(int field, const std::string& body) {
  std::string out(1 + VarintSize(body.size()) + body.size(), '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  *p++ = static_cast<uint8_t>((field << 3) | 2);
  p = PutVarint(p, body.size());
  std::memcpy(p, body.data(), body.size());
  return out;
}

template <typename T>
grpc::Slice HeldSlice(std::shared_ptr<const std::vector<T>> values) {
  auto* held = new std::shared_ptr<const std::vector<T>>(std::move(values));
  return grpc::Slice(
      const_cast<T*>((*held)->data()), (*held)->size() * sizeof(T),
      [](void* p) {
        delete static_cast<std::shared_ptr<const std::vector<T>>*>(p);
      },
      held);
}

grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<float>> values) {
  return HeldSlice(std::move(values));
}

grpc::Slice SnapshotSlice(std::shared_ptr<const std::vector<uint16_t>> values) {
  return HeldSlice(std::move(values));
}

namespace {

// A message of `prefix` (its other fields, already encoded) then, if
// with_chunk, field `chunk_field`: a TensorChunk whose data is `values` from
// value `first` on. TensorChunk's fields go in the order protobuf writes
// them: 1 offset, 2 count, 3 data, 4 dtype (zeros omitted, as proto3 does).
void EncodeChunkMessage(const std::string& prefix, bool with_chunk,
                        int chunk_field, int64_t offset, int64_t count,
                        v1::DType dtype, const grpc::Slice& values,
                        int64_t first, grpc::ByteBuffer* out,
                        const std::string& suffix = std::string()) {
  const bool bf16 = dtype == v1::BFLOAT16;
  const int64_t nb = count * (bf16 ? 2 : 4);
  const size_t chunk_len = FieldSize(offset) + FieldSize(count) +
                           (nb > 0 ? 1 + VarintSize(nb) + nb : 0) +
                           FieldSize(dtype);
  uint8_t head[64];
  uint8_t* p = head;
  if (with_chunk) {
    *p++ = static_cast<uint8_t>((chunk_field << 3) | 2);
    p = PutVarint(p, chunk_len);
    p = PutField(p, 1, offset);
    p = PutField(p, 2, count);
    if (nb > 0) {
      *p++ = (3 << 3) | 2;
      p = PutVarint(p, static_cast<uint64_t>(nb));
    }
  }
  grpc::Slice slices[5];
  size_t n = 0;
  if (!prefix.empty()) slices[n++] = grpc::Slice(prefix);
  if (p > head) {
    slices[n++] = grpc::Slice(head, static_cast<size_t>(p - head));
  }
  const size_t begin = static_cast<size_t>(first) * (bf16 ? 2 : 4);
  if (with_chunk && nb > 0) slices[n++] = values.sub(begin, begin + nb);
  uint8_t tail[16];
  const uint8_t* tail_end = with_chunk ? PutField(tail, 4, dtype) : tail;
  if (tail_end > tail) {
    slices[n++] = grpc::Slice(tail, static_cast<size_t>(tail_end - tail));
  }
  if (!suffix.empty()) slices[n++] = grpc::Slice(suffix);
  grpc::ByteBuffer buffer(slices, n);
  out->Swap(&buffer);
}

}  // namespace

void EncodePullResponse(int64_t version, int64_t total_steps, int64_t offset,
                        int64_t count, v1::DType dtype,
                        const grpc::Slice& values, int64_t first,
                        grpc::ByteBuffer* out, const std::string& buffers) {
  // PullResponse: 1 version, 2 total_steps, 3 chunk, 6 buffers.
  uint8_t head[32];
  uint8_t* p = PutField(head, 1, version);
  p = PutField(p, 2, total_steps);
  const std::string prefix(reinterpret_cast<const char*>(head),
                           static_cast<size_t>(p - head));
  EncodeChunkMessage(prefix, /*with_chunk=*/true, 3, offset, count, dtype,
                     values, first, out,
                     buffers.empty() ? std::string()
                                     : LengthDelimitedField(6, buffers));
}

void EncodePushRequest(const v1::PushHeader* header, int64_t offset,
                       int64_t count, v1::DType dtype,
                       const grpc::Slice& values, int64_t first,
                       grpc::ByteBuffer* out, const std::string& suffix) {
  // PushRequest: 1 header, 2 chunk.
  std::string prefix;
  if (header != nullptr) {
    const std::string h = header->SerializeAsString();
    uint8_t tag[16];
    tag[0] = (1 << 3) | 2;
    const uint8_t* end = PutVarint(tag + 1, h.size());
    prefix.assign(reinterpret_cast<const char*>(tag),
                  static_cast<size_t>(end - tag));
    prefix += h;
  }
  EncodeChunkMessage(prefix, /*with_chunk=*/count > 0, 2, offset, count, dtype,
                     values, first, out, suffix);
}

// ---------------------------------------------------------- WireMessage --

// Reads bytes in order across the slices, within a limit (a message or a
// field inside it).
class WireMessage::Cursor {
 public:
  Cursor(const std::vector<grpc::Slice>& slices, uint64_t limit)
      : slices_(slices), left_(limit) {
    Settle();
  }

  uint64_t left() const { return left_; }
  size_t slice() const { return slice_; }
  size_t skip() const { return off_; }

  // A cursor over the next n bytes (the caller has checked n <= left()).
  Cursor Sub(uint64_t n) const {
    Cursor c = *this;
    c.left_ = n;
    return c;
  }

  // A tag, as protobuf reads it: at most 5 bytes, the value kept to 32
  // bits.
  bool ReadVarint32(uint32_t* v) {
    uint64_t x;
    if (!ReadShort(&x)) return false;
    *v = static_cast<uint32_t>(x);
    return true;
  }

  // A length, as protobuf reads it: at most 5 bytes, below 2^31.
  bool ReadLength(uint32_t* v) {
    uint64_t x;
    if (!ReadShort(&x) || x > 0x7fffffff) return false;
    *v = static_cast<uint32_t>(x);
    return true;
  }

  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (left_ == 0) return false;
      const uint8_t b = slices_[slice_].begin()[off_];
      Advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  bool Skip(uint64_t n) {
    if (n > left_) return false;
    while (n > 0) {
      const size_t take = std::min<uint64_t>(n, Here());
      Advance(take);
      n -= take;
    }
    return true;
  }

  bool Append(uint64_t n, std::string* out) {
    if (n > left_) return false;
    while (n > 0) {
      const size_t take = std::min<uint64_t>(n, Here());
      out->append(reinterpret_cast<const char*>(slices_[slice_].begin()) + off_,
                  take);
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  // A varint of at most 5 bytes, whole.
  bool ReadShort(uint64_t* v) {
    uint64_t x = 0;
    for (int i = 0; i < 5; ++i) {
      if (left_ == 0) return false;
      const uint8_t b = slices_[slice_].begin()[off_];
      Advance(1);
      x |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
      if ((b & 0x80) == 0) {
        *v = x;
        return true;
      }
    }
    return false;
  }

  // Bytes left in the current slice.
  size_t Here() const { return slices_[slice_].size() - off_; }
  void Advance(size_t n) {
    off_ += n;
    left_ -= n;
    Settle();
  }
  // Steps past exhausted (and empty) slices.
  void Settle() {
    while (slice_ < slices_.size() && off_ == slices_[slice_].size()) {
      ++slice_;
      off_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t off_ = 0;
  uint64_t left_;
};

namespace {


absl::Status Malformed(const char* what) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed protobuf message: ", what));
}

constexpr int kMaxGroupDepth = 100;  // protobuf's recursion limit

}  // namespace

// Skips a group (wire type 3, which proto3 never writes but protobuf's
// parser skips as an unknown field) up to its end tag.
template <typename Cursor>
bool SkipGroup(Cursor* in, uint32_t field, int depth) {
  if (depth > kMaxGroupDepth) return false;
  for (;;) {
    uint32_t tag;
    if (!in->ReadVarint32(&tag)) return false;
    const int type = static_cast<int>(tag & 7);
    if ((tag >> 3) == 0) return false;
    switch (type) {
      case 0: {
        uint64_t v;
        if (!in->ReadVarint(&v)) return false;
        break;
      }
      case 1:
        if (!in->Skip(8)) return false;
        break;
      case 2: {
        uint32_t len;
        if (!in->ReadLength(&len) || !in->Skip(len))
          return false;
        break;
      }
      case 3:
        if (!SkipGroup(in, tag >> 3, depth + 1)) return false;
        break;
      case 4:
        return (tag >> 3) == field;
      case 5:
        if (!in->Skip(4)) return false;
        break;
      default:
        return false;
    }
  }
}

absl::Status WireMessage::ParseChunk(Cursor* in) {
  while (in->left() > 0) {
    uint32_t tag;
    if (!in->ReadVarint32(&tag)) return Malformed("bad tag in a chunk");
    const uint32_t field = tag >> 3;
    const int type = static_cast<int>(tag & 7);
    if (field == 0) return Malformed("field 0 in a chunk");
    if (type == 0) {
      uint64_t v;
      if (!in->ReadVarint(&v)) return Malformed("bad varint in a chunk");
      if (field == 1) chunk_.offset = static_cast<int64_t>(v);
      if (field == 2) chunk_.count = static_cast<int64_t>(v);
      if (field == 4) chunk_.dtype = static_cast<int32_t>(v);
      if (field == 5) {
        chunk_.shared = true;
        chunk_.shared_offset = static_cast<int64_t>(v);
      }
    } else if (type == 2) {
      uint32_t len;
      if (!in->ReadLength(&len) || len > in->left())
        return Malformed("truncated field in a chunk");
      if (field == 3) {
        chunk_.data_size = static_cast<int64_t>(len);
        data_slice_ = in->slice();
        data_skip_ = in->skip();
      }
      in->Skip(len);
    } else if (type == 1 || type == 5) {
      if (!in->Skip(type == 1 ? 8 : 4))
        return Malformed("truncated field in a chunk");
    } else if (type == 3) {
      if (!SkipGroup(in, field, 2)) return Malformed("bad group in a chunk");
    } else {
      return Malformed("unsupported wire type in a chunk");
    }
  }
  return absl::OkStatus();
}

absl::Status WireMessage::Parse(const grpc::ByteBuffer& buffer,
                                int chunk_field) {
  slices_.clear();
  present_ = 0;
  for (int64_t& v : varints_) v = 0;
  for (std::string& b : bytes_) b.clear();
  chunk_ = WireChunk();
  chunk_field_ = chunk_field;
  data_slice_ = data_skip_ = 0;
  external_ = nullptr;
  if (!buffer.Valid()) return absl::OkStatus();  // an empty message
  if (!buffer.Dump(&slices_).ok()) return Malformed("unreadable buffer");
  Cursor in(slices_, buffer.Length());
  while (in.left() > 0) {
    uint32_t tag;
    if (!in.ReadVarint32(&tag)) return Malformed("bad tag");
    const uint32_t field = tag >> 3;
    const int type = static_cast<int>(tag & 7);
    if (field == 0) return Malformed("field 0");
    const bool known = field <= kMaxField;
    if (type == 0) {
      uint64_t v;
      if (!in.ReadVarint(&v)) return Malformed("bad varint");
      if (known && static_cast<int>(field) != chunk_field) {
        varints_[field] = static_cast<int64_t>(v);
      }
    } else if (type == 2) {
      uint32_t len;
      if (!in.ReadLength(&len) || len > in.left())
        return Malformed("truncated field");
      if (known && static_cast<int>(field) == chunk_field) {
        Cursor sub = in.Sub(len);
        TALLY_RETURN_IF_ERROR(ParseChunk(&sub));
        present_ |= 1u << field;
        in.Skip(len);
      } else if (known) {
        in.Append(len, &bytes_[field]);
        present_ |= 1u << field;
      } else {
        in.Skip(len);
      }
    } else if (type == 1 || type == 5) {
      if (!in.Skip(type == 1 ? 8 : 4)) return Malformed("truncated field");
    } else if (type == 3) {
      if (!SkipGroup(&in, field, 1)) return Malformed("bad group");
    } else {
      return Malformed("unsupported wire type");
    }
  }
  return absl::OkStatus();
}

void WireMessage::ForEachValues(
    int width,
    absl::FunctionRef<void(const char* src, int64_t n, int64_t first)> fn)
    const {
  if (external_ != nullptr) {
    if (chunk_.data_size >= width) fn(external_, chunk_.data_size / width, 0);
    return;
  }
  char carry[8];
  int have = 0;
  int64_t first = 0;
  uint64_t left = static_cast<uint64_t>(chunk_.data_size);
  size_t skip = data_skip_;
  for (size_t i = data_slice_; left > 0 && i < slices_.size(); ++i) {
    const char* p = reinterpret_cast<const char*>(slices_[i].begin()) + skip;
    size_t n = std::min<uint64_t>(left, slices_[i].size() - skip);
    skip = 0;
    left -= n;
    if (have > 0) {
      const size_t take = std::min<size_t>(n, width - have);
      std::memcpy(carry + have, p, take);
      have += static_cast<int>(take);
      p += take;
      n -= take;
      if (have == width) {
        fn(carry, 1, first++);
        have = 0;
      }
    }
    const int64_t whole = static_cast<int64_t>(n / width);
    if (whole > 0) {
      fn(p, whole, first);
      first += whole;
      p += whole * width;
      n -= whole * width;
    }
    if (n > 0) {
      std::memcpy(carry, p, n);
      have = static_cast<int>(n);
    }
  }
}

absl::Status CheckChunkFields(int64_t offset, int64_t count, int dtype,
                              int64_t data_size, int64_t n) {
  const bool empty_ok = n == 0 && offset == 0 && count == 0;
  if (!empty_ok &&
      (offset < 0 || count <= 0 || count > n || offset > n - count)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk [", offset, ", +", count, ") is outside the ", n,
                     "-element parameter vector"));
  }
  absl::StatusOr<int> width = DTypeWidth(dtype);
  if (!width.ok()) return width.status();
  if (data_size != *width * count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk at ", offset, " says ", count, " ",
        v1::DType_Name(static_cast<v1::DType>(dtype)), " elements but carries ",
        data_size, " bytes (want ", *width * count, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckChunk(const v1::TensorChunk& c, int64_t n) {
  return CheckChunkFields(c.offset(), c.count(), c.dtype(),
                          static_cast<int64_t>(c.data().size()), n);
}

void DecodeChunk(const v1::TensorChunk& c, float* vector) {
  if (c.dtype() == v1::BFLOAT16) {
    Bfloat16ToFloat(c.data().data(), vector + c.offset(), c.count());
  } else {
    std::memcpy(vector + c.offset(), c.data().data(), c.data().size());
  }
}

}  // namespace tally
