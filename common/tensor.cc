#include "common/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tally {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool CheckedNumElements(const Shape& shape, int64_t* n) {
  int64_t out = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(out, d, &out)) return false;
  }
  *n = out;
  return true;
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace tally
