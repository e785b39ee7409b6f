// Shapes and tensor views.
//
// A Tensor is a non-owning view: a pointer into memory of some Device plus a
// row-major shape. Whoever allocated the memory (a DeviceBuffer) owns it and
// must outlive every view. Tensors are plain values; copying one copies the
// view, never the data.
#ifndef TALLY_COMMON_TENSOR_H_
#define TALLY_COMMON_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tally {

using Shape = std::vector<int64_t>;

// Product of the dimensions; 1 for a scalar (empty shape).
int64_t NumElements(const Shape& shape);
// The element count, or false when it overflows int64 (a shape from
// outside: a spec, a file).
bool CheckedNumElements(const Shape& shape, int64_t* n);

// "[64, 1, 28, 28]".
std::string ShapeString(const Shape& shape);

struct Tensor {
  float* data = nullptr;
  Shape shape;

  int64_t numel() const { return NumElements(shape); }
  int64_t dim(int i) const { return shape[i]; }
  int rank() const { return static_cast<int>(shape.size()); }
};

}  // namespace tally

#endif  // TALLY_COMMON_TENSOR_H_
