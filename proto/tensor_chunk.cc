#include "proto/tensor_chunk.h"

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
