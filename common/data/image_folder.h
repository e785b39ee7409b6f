// An image folder dataset (dataset.name: image_folder, docs/job-spec.md): a
// directory per class holding PNG and JPEG files, as torchvision's
// ImageFolder reads it. Classes are the subdirectories sorted by name
// (label i is the i-th); a class's images are every .png, .jpg and .jpeg
// file under its directory, at any depth, sorted by path; other files are
// passed over. Images are decoded as batches are gathered
// (common/data/image.h), fitted to the sample's shape, scaled to [0, 1],
// normalised per channel, and on the training split augmented with a
// random crop after zero padding and a horizontal flip, drawn from (seed,
// epoch, sample) so that a rerun sees the same.
//
// A file that does not decode fails the batch with its name, unless
// skip_bad: then the next sample that decodes (in the listing's order) takes
// its place, so that counts and the data split stay fixed; each bad file is
// logged once and every substitution counted.
#ifndef TALLY_COMMON_DATA_IMAGE_FOLDER_H_
#define TALLY_COMMON_DATA_IMAGE_FOLDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/data/data_file.h"
#include "common/data/dataset.h"
#include "common/data/image.h"

namespace tally {

struct ImageFolderOptions {
  Shape shape;  // [channels (1 or 3), height, width]
  ImageFit fit = ImageFit::kCrop;
  std::vector<float> mean, std;  // per channel; empty: not normalised
  int crop_padding = 0;          // augmentation, training split only
  bool hflip = false;            // augmentation, training split only
  bool skip_bad = false;
};

struct ImageFolderListing {
  std::string root;
  std::vector<std::string> classes;  // sorted
  std::vector<std::string> files;    // class by class, each sorted by path
  std::vector<int32_t> labels;       // files' classes
  std::vector<int64_t> sizes;        // files' sizes in bytes
};

// The classes and images under `root`. kNotFound for a missing root,
// kInvalidArgument for a root with no class directory or a class with no
// image (named). With `classes` (the training split's), the listing's own
// classes must be among them and labels are their indices there. Links to
// directories are never followed (a cycle of them cannot make the listing
// endless); a link to an image file is taken when it resolves under
// `roots` (kPermissionDenied otherwise). At most 32 levels and 2^26 images.
absl::StatusOr<ImageFolderListing> ListImageFolder(
    const std::string& root, const std::vector<std::string>* classes = nullptr,
    const DataRoots& roots = DataRoots::Any());

class ImageFolder final : public SampleSource {
 public:
  // `augment`: the training split's random crop and flip apply.
  static absl::StatusOr<std::shared_ptr<const ImageFolder>> Open(
      ImageFolderListing listing, const ImageFolderOptions& options,
      bool augment);

  int64_t size() const override {
    return static_cast<int64_t>(listing_.files.size());
  }
  absl::Status Gather(std::span<const int64_t> indices,
                      const GatherContext& context, float* x,
                      int32_t* y) const override;
  int64_t bytes_read() const override { return bytes_.load(); }
  int64_t substituted() const override { return substituted_.load(); }
  // Each file's path under the root, class and size.
  void Describe(Fingerprint* f) const override;

  const ImageFolderListing& listing() const { return listing_; }

 private:
  ImageFolder() = default;
  // Sample i's pixels into x (sample_numel floats), fitted and normalised;
  // the decode's error, if any.
  absl::Status Load(int64_t i, float* x) const;
  void Augment(int64_t i, const GatherContext& context, float* x) const;
  void ReportBad(int64_t i, const absl::Status& why) const;

  ImageFolderListing listing_;
  ImageFolderOptions options_;
  bool augment_ = false;
  mutable std::atomic<int64_t> bytes_{0};
  mutable std::atomic<int64_t> substituted_{0};
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_set<int64_t> reported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_COMMON_DATA_IMAGE_FOLDER_H_
