// NumPy's .npy files (format versions 1.0, 2.0 and 3.0), read in place: the
// header is parsed, the data is mapped (mmap, read-only) and converted one
// sample at a time as batches are gathered, never read whole.
//
// An arrays dataset (dataset.name: arrays, docs/job-spec.md) is two such
// files per split: inputs [n, ...] of any integer or floating dtype NumPy
// writes (uint8 images are scaled to [0, 1], as torchvision's ToTensor
// does; the rest converted as they are) and labels [n] of an integer dtype.
// Errors name the file and what is wrong where: kNotFound for a missing
// file, kInvalidArgument for a header that is not a .npy one or a layout
// that does not fit, kDataLoss for a file shorter than its header says.
// Thread-safe once opened (the mapping is immutable).
#ifndef TALLY_COMMON_DATA_NPY_H_
#define TALLY_COMMON_DATA_NPY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/dataset.h"

namespace tally {

enum class NpyType { kBool, kU8, kI8, kU16, kI16, kU32, kI32, kU64, kI64,
                     kF16, kF32, kF64 };

struct NpyHeader {
  NpyType type = NpyType::kF32;
  int width = 4;  // bytes a value
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // where the values start in the file
  int64_t values() const;   // the product of shape (1 for a scalar)
};

// The header at the start of `bytes` (at least the whole header: 10 bytes
// and its stated length); `name` is the file's, for errors. Refuses
// Fortran order, big-endian values, structured and object dtypes.
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes,
                                         const std::string& name);

// A read-only mapping of a whole file.
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(
      const std::string& path);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
  const char* data() const { return data_; }
  int64_t size() const { return size_; }
  // Tells the kernel the file is read in no order (shuffled samples): no
  // read-ahead around each page a sample touches.
  void AdviseRandom() const;
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const char* data_ = nullptr;
  int64_t size_ = 0;
};

// One split of an arrays dataset: inputs and labels, mapped. Gather
// converts the samples it is asked for; nothing else is read.
class NpyArrays final : public SampleSource {
 public:
  // The inputs' per-sample shape must be `sample_shape` (kInvalidArgument,
  // with both, otherwise); the labels one integer per sample, each in
  // [0, num_classes) (the first that is not is named, with its index).
  static absl::StatusOr<std::shared_ptr<const NpyArrays>> Open(
      const std::string& inputs_path, const std::string& labels_path,
      const Shape& sample_shape, int num_classes);

  int64_t size() const override { return size_; }
  absl::Status Gather(std::span<const int64_t> indices,
                      const GatherContext& context, float* x,
                      int32_t* y) const override;
  int64_t bytes_read() const override { return bytes_.load(); }
  // Both files' sizes and headers.
  void Describe(Fingerprint* f) const override;

 private:
  NpyArrays() = default;
  std::shared_ptr<const MappedFile> inputs_, labels_;
  NpyHeader in_, lab_;
  int64_t size_ = 0;
  int64_t sample_values_ = 0;
  mutable std::atomic<int64_t> bytes_{0};
};

// IEEE 754 half precision to float32.
float HalfToFloat(uint16_t h);

}  // namespace tally

#endif  // TALLY_COMMON_DATA_NPY_H_
