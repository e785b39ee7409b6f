// TALLY_VECTORIZE marks a hot loop function for function multi-versioning:
// GCC builds an AVX2/FMA clone next to the baseline x86-64 one and picks at
// load time, so one binary is fast on current CPUs and still runs on old ones.
#ifndef TALLY_COMMON_VECTORIZE_H_
#define TALLY_COMMON_VECTORIZE_H_

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TALLY_VECTORIZE \
  __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TALLY_VECTORIZE
#endif

#endif  // TALLY_COMMON_VECTORIZE_H_
