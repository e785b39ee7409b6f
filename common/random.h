// Deterministic random numbers, identical on every platform and compiler
// (std::uniform_real_distribution is not), so that a seed reproduces a run.
//
// Rng is not thread-safe; give each thread its own.
#ifndef TALLY_COMMON_RANDOM_H_
#define TALLY_COMMON_RANDOM_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace tally {

// SplitMix64 step: a good 64-bit mixing function, also used to hash
// (seed, index) pairs into independent streams.
uint64_t SplitMix64(uint64_t x);

// xoshiro256** generator.
class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t Next();
  // Uniform in [0, 1) with 24 bits of precision.
  float UniformFloat();
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi);
  // Standard normal (Box-Muller).
  float Normal();
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n);
  // Fisher-Yates shuffle.
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      size_t j = Below(i);
      std::swap(v[i - 1], v[j]);
    }
  }

 private:
  uint64_t s_[4];
};

// A counter-based uniform float in [0, 1) for element `index` of stream
// `seed`: every device computes the same value without shared state.
float HashUniform(uint64_t seed, uint64_t index);

}  // namespace tally

#endif  // TALLY_COMMON_RANDOM_H_
