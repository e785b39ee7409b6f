#include "common/random.h"

#include <cmath>

namespace tally {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {
uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) {
    x = SplitMix64(x);
    s = x;
  }
}

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

float Rng::UniformFloat() {
  return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f);
}

float Rng::Uniform(float lo, float hi) {
  return lo + (hi - lo) * UniformFloat();
}

float Rng::Normal() {
  // Box-Muller on doubles; 1 - u keeps the log argument in (0, 1].
  double u1 = 1.0 - static_cast<double>(Next() >> 11) * 0x1.0p-53;
  double u2 = static_cast<double>(Next() >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(2.0 * M_PI * u2));
}

uint64_t Rng::Below(uint64_t n) {
  // Lemire's multiply-shift; the bias for n << 2^64 is negligible here.
  return static_cast<uint64_t>((static_cast<__uint128_t>(Next()) * n) >> 64);
}

float HashUniform(uint64_t seed, uint64_t index) {
  uint64_t h = SplitMix64(seed ^ SplitMix64(index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

}  // namespace tally
