// bfloat16: the top 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa
// bits), for sending tensors in half the bytes. Conversion rounds to
// nearest, ties to even; infinities stay infinities and NaNs stay NaNs.
//
// Buffers are raw bytes (2 per value, little-endian), so they may be any
// part of a protobuf string; no alignment is needed. Thread-safe.
#ifndef TALLY_COMMON_BFLOAT16_H_
#define TALLY_COMMON_BFLOAT16_H_

#include <cstdint>

namespace tally {

// dst: 2 * n bytes.
void FloatToBfloat16(const float* src, char* dst, int64_t n);
// src: 2 * n bytes.
void Bfloat16ToFloat(const char* src, float* dst, int64_t n);

}  // namespace tally

#endif  // TALLY_COMMON_BFLOAT16_H_
