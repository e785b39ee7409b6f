// Arrays read in place: NumPy's .npy files (format versions 1.0, 2.0 and
// 3.0), the members of an uncompressed .npz archive (np.savez), the tensors
// of a .safetensors file. The header is parsed, the data is mapped (mmap,
// read-only) and converted one sample at a time as batches are gathered,
// never read whole.
//
// An arrays dataset (dataset.name: arrays, docs/job-spec.md) is, per split,
// inputs [n, ...] of any integer or floating dtype (uint8 images are scaled
// to [0, 1], as torchvision's ToTensor does; the rest converted as they
// are) and labels [n] of an integer dtype: two .npy files, or two keys of
// one .npz or .safetensors file; each may be a glob of shards, taken in
// sorted order, whose sample counts add up.
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
                     kF16, kBF16, kF32, kF64 };

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

// One array inside a mapped file: its header's data_offset is within the
// file; `name` says where it is for errors ("x.npy", "d.npz[x]").
struct MappedArray {
  std::shared_ptr<const MappedFile> file;
  NpyHeader header;
  std::string name;
};

// The array `key` of the file at `path` by its extension: .npy (no key),
// .npz (the member key.npy, stored uncompressed: a compressed archive
// cannot be mapped and is refused, saying so) or .safetensors (the tensor
// key). Its values must all be in the file (kDataLoss otherwise).
absl::StatusOr<MappedArray> OpenArray(const std::string& path,
                                      const std::string& key = "");

// The files a path names: itself when it has no glob characters (* ? [),
// else every match, sorted; a pattern that matches nothing is
// kInvalidArgument naming it.
absl::StatusOr<std::vector<std::string>> ExpandGlob(const std::string& path);

// Where one split's arrays are: `inputs` and `labels` .npy paths (globs
// allowed), or, with `file` (a .npz or .safetensors path or glob), the keys
// of the two arrays in each file.
struct ArrayFiles {
  std::string file;
  std::string inputs, labels;
};

// One split of an arrays dataset: inputs and labels, mapped, shard by
// shard. Gather converts the samples it is asked for; nothing else is read.
class NpyArrays final : public SampleSource {
 public:
  // The inputs' per-sample shape must be `sample_shape` (kInvalidArgument,
  // with both, otherwise); the labels one integer per sample, each in
  // [0, num_classes) (the first that is not is named, with its index); a
  // shard's inputs and labels hold as many samples, and two globs of .npy
  // shards match as many files.
  static absl::StatusOr<std::shared_ptr<const NpyArrays>> Open(
      const ArrayFiles& files, const Shape& sample_shape, int num_classes);

  int64_t size() const override { return size_; }
  absl::Status Gather(std::span<const int64_t> indices,
                      const GatherContext& context, float* x,
                      int32_t* y) const override;
  int64_t bytes_read() const override { return bytes_.load(); }
  // Both files' sizes and headers.
  void Describe(Fingerprint* f) const override;

 private:
  struct Shard {
    MappedArray inputs, labels;
    int64_t begin = 0;  // its first sample's index in the split
  };
  NpyArrays() = default;
  absl::Status AddShard(MappedArray inputs, MappedArray labels,
                        const Shape& sample_shape, int num_classes);

  std::vector<Shard> shards_;
  int64_t size_ = 0;
  int64_t sample_values_ = 0;
  mutable std::atomic<int64_t> bytes_{0};
};

// IEEE 754 half precision to float32.
float HalfToFloat(uint16_t h);

}  // namespace tally

#endif  // TALLY_COMMON_DATA_NPY_H_
