#include "common/spec/embedding.h"

#include <cmath>

#include "common/random.h"

namespace tally {

uint64_t TableSalt(absl::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

int64_t HashedRow(int64_t id, uint64_t salt, int64_t n) {
  return static_cast<int64_t>(SplitMix64(static_cast<uint64_t>(id) ^ salt) %
                              static_cast<uint64_t>(n));
}

int BucketOf(int64_t row, uint64_t salt) {
  // Another mix than HashedRow's, so that a hashed table's rows do not all
  // fall in the buckets of their hash's low bits.
  return static_cast<int>(
      SplitMix64(static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ull + salt) %
      kTableBuckets);
}

int SlotOfBucket(int bucket, int slots) {
  return static_cast<int>(static_cast<int64_t>(bucket) * slots /
                          kTableBuckets);
}

void InitRow(const EmbeddingTableSpec& table, uint64_t seed, int64_t row,
             float* out) {
  const uint64_t key = SplitMix64(seed) ^ table.salt;
  const uint64_t base = static_cast<uint64_t>(row) *
                        static_cast<uint64_t>(table.dim) * 2;
  for (int64_t j = 0; j < table.dim; ++j) {
    const uint64_t at = base + 2 * static_cast<uint64_t>(j);
    switch (table.init) {
      case TableInit::kZeros:
        out[j] = 0.0f;
        break;
      case TableInit::kUniform: {
        const double u = static_cast<double>(HashUniform(key, at));
        out[j] = static_cast<float>((2.0 * u - 1.0) * table.init_scale);
        break;
      }
      case TableInit::kNormal: {
        // Box-Muller on two counter-based uniforms; 1 - u keeps log finite.
        const double u1 = 1.0 - static_cast<double>(HashUniform(key, at));
        const double u2 = static_cast<double>(HashUniform(key, at + 1));
        out[j] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                                    std::cos(2.0 * M_PI * u2) *
                                    table.init_scale);
        break;
      }
    }
  }
}

}  // namespace tally
