// Datasets and the per-epoch sample order.
//
// A Dataset holds every sample's inputs back to back, float32 features or
// int64 token ids (text), plus int32 labels, one a sample or, for text, one
// a token (the next one), so that assembling a batch is a gather of
// contiguous rows. Datasets are immutable once built; const methods are
// safe from any thread.
#ifndef TALLY_COMMON_DATA_DATASET_H_
#define TALLY_COMMON_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace tally {

// What a batch's samples are gathered for: augmentations draw from (seed,
// epoch, sample), so that a rerun sees the same.
struct GatherContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
};

// What identifies a dataset's files (their sizes, headers and names), as a
// hash that is the same on every machine (FNV-1a, 64 bits): the workers of
// a job compare theirs (docs/job-spec.md).
class Fingerprint {
 public:
  void Add(absl::string_view bytes);
  void Add(int64_t value);
  // A file of `size` bytes (counted, and its size hashed).
  void AddFile(int64_t size);
  // "N files, B bytes, hash 0123456789abcdef"; empty when nothing was added.
  std::string Text() const;

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
  int64_t files_ = 0, bytes_ = 0;
  bool any_ = false;
};

// What a sample's inputs are: float32 features (images, tables, arrays),
// or int64 token ids (text, which an embedding takes).
enum class InputType { kFloat32, kInt64 };

// Samples read from their files as they are gathered (common/data/npy.h,
// common/data/image_folder.h, common/data/text.h), not held in memory.
// Thread-safe.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual InputType input_type() const { return InputType::kFloat32; }
  // As Dataset::Gather, for float inputs.
  virtual absl::Status Gather(std::span<const int64_t> indices,
                              const GatherContext& context, float* x,
                              int32_t* y) const = 0;
  // As Dataset::GatherIds, for a source of int64 inputs.
  virtual absl::Status GatherIds(std::span<const int64_t> /*indices*/,
                                 const GatherContext& /*context*/,
                                 int64_t* /*x*/, int32_t* /*y*/) const {
    return absl::FailedPreconditionError("the samples' inputs are floats");
  }
  // Bytes read from files so far, and samples that stood in for ones that
  // could not be read (image_folder's skip_bad).
  virtual int64_t bytes_read() const { return 0; }
  virtual int64_t substituted() const { return 0; }
  // Adds what identifies the source's files.
  virtual void Describe(Fingerprint* f) const = 0;
};

struct Dataset {
  Shape sample_shape;  // per sample, e.g. [1, 28, 28]
  InputType input_type = InputType::kFloat32;
  // Labels per sample: empty for one (a class), [seq_len] for text's
  // next-token targets.
  Shape label_shape;
  int num_classes = 0;  // for text: the vocabulary's size
  std::vector<float> features;  // float inputs: size() * sample_numel()
  std::vector<int64_t> ids;     // int64 inputs: size() * sample_numel()
  std::vector<int32_t> labels;  // size() * label_numel()
  // Set instead of features (ids) and labels: the samples stay in their
  // files.
  std::shared_ptr<const SampleSource> source;

  int64_t size() const {
    return source != nullptr
               ? source->size()
               : static_cast<int64_t>(labels.size()) / label_numel();
  }
  int64_t sample_numel() const { return NumElements(sample_shape); }
  int64_t label_numel() const { return NumElements(label_shape); }

  // Copies the samples named by `indices` into x (indices.size() rows of
  // sample_numel() floats) and y (rows of label_numel()). Indices must be
  // in range, and the inputs floats. Fails only for a source's file that
  // cannot be read, with the file's name.
  absl::Status Gather(std::span<const int64_t> indices, float* x, int32_t* y,
                      const GatherContext& context = {}) const;
  // The same for int64 inputs (input_type kInt64).
  absl::Status GatherIds(std::span<const int64_t> indices, int64_t* x,
                         int32_t* y, const GatherContext& context = {}) const;
  // A dataset read from a source, read whole into features and labels
  // (for the test split, which evaluation reads in one go).
  absl::Status Materialize();
};

struct TrainTest {
  Dataset train;
  Dataset test;
  // Fingerprint::Text of the files both splits were read from; empty for
  // datasets that are not the user's files (fashion-mnist, synthetic).
  std::string fingerprint;
};

// Reads one IDX image file (magic 0x803, ubyte, [n, rows, cols]) and its
// label file (magic 0x801, ubyte, [n]); gzip'd or plain. Pixels are scaled to
// [0, 1] and shaped [1, rows, cols]. Errors name the file: kNotFound for a
// missing file, kDataLoss for truncated or corrupt data, kInvalidArgument for
// a wrong magic number or mismatched counts.
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes);

// The training set's pixel mean and standard deviation (after scaling to
// [0, 1]), the values torchvision users pass to transforms.Normalize.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// x = (x - mean) / std for every feature.
void Normalize(Dataset& d, float mean, float std);

// Fashion-MNIST from `root` (Debian's dataset-fashion-mnist installs it in
// /usr/share/datasets/fashion-mnist): train-*-idx?-ubyte.gz, t10k-*. With
// `normalize`, pixels are standardised with kFashionMnistMean/Std.
absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& root,
                                           bool normalize = false);

struct SyntheticOptions {
  int64_t train_size = 4096;
  int64_t test_size = 1024;
  int64_t features = 32;
  int num_classes = 4;
  int64_t teacher_hidden = 16;
  uint64_t seed = 1;
};

// Features drawn from N(0, 1); each label is the argmax of a fixed random
// teacher network (features -> tanh hidden -> classes) drawn from the same
// seed, so a student can learn it well above chance. Deterministic by seed.
absl::StatusOr<TrainTest> MakeSynthetic(const SyntheticOptions& options);

// The order in which worker `rank` of `world` visits its shard in `epoch`:
// a permutation of [0, size) drawn from (seed, epoch), of which rank takes
// positions rank, rank + world, ... When size does not divide by world the
// first size % world ranks get one sample more; every sample is visited
// exactly once per epoch across the world (no padding, no dropping).
std::vector<int64_t> EpochOrder(int64_t size, uint64_t seed, int64_t epoch,
                                int rank = 0, int world = 1);

}  // namespace tally

#endif  // TALLY_COMMON_DATA_DATASET_H_
