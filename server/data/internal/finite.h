// Copying pushed gradients out of a message while checking them.
#ifndef TALLY_SERVER_DATA_INTERNAL_FINITE_H_
#define TALLY_SERVER_DATA_INTERNAL_FINITE_H_

#include <cstdint>

namespace tally::internal {

// Copies n floats from `src` (any alignment) to `dst` and returns the index
// of the first infinity or NaN among them, or -1. All n are copied only when
// none is found. Block by block, each block checked while still in cache.
int64_t CopyAndFindNonFinite(float* dst, const char* src, int64_t n);

// The same for n bfloat16 values (2 * n bytes at `src`), widened to float.
int64_t DecodeBfloat16AndFindNonFinite(float* dst, const char* src, int64_t n);

}  // namespace tally::internal

#endif  // TALLY_SERVER_DATA_INTERNAL_FINITE_H_
