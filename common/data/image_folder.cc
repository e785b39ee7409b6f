#include "common/data/image_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/data/data_file.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace tally {

namespace fs = std::filesystem;

namespace {

// Tries the samples after a bad one this many times before failing.
constexpr int kMaxSubstitutes = 16;
// Bounds on what a submitted path can make a listing or a read hold.
constexpr int kMaxFolderDepth = 32;
constexpr size_t kMaxFolderFiles = size_t{1} << 26;
constexpr int64_t kMaxImageBytes = int64_t{256} << 20;

bool IsImageName(const fs::path& p) {
  const std::string ext = absl::AsciiStrToLower(p.extension().string());
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// Every image under `dir`, at any depth, with its size, appended to
// `files` (sorted by the caller). Links to directories are never followed,
// so a link cycle cannot make the walk endless; a link to a file is taken
// when it resolves under `roots`. `depth` bounds a tree of real directories.
absl::Status ImagesUnder(const std::string& dir, const DataRoots& roots,
                         int depth,
                         std::vector<std::pair<std::string, int64_t>>* files) {
  if (depth > kMaxFolderDepth) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": directories nested more than ", kMaxFolderDepth, " deep"));
  }
  TALLY_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ListDirectory(dir));
  for (const DirEntry& e : entries) {
    const std::string path = absl::StrCat(dir, "/", e.name);
    if (e.kind == DirEntry::Kind::kDirectory) {
      TALLY_RETURN_IF_ERROR(ImagesUnder(path, roots, depth + 1, files));
      continue;
    }
    if (!IsImageName(fs::path(e.name))) continue;
    if (e.kind == DirEntry::Kind::kLinkToFile) {
      TALLY_RETURN_IF_ERROR(roots.Resolve("a link in the image folder", path).status());
    }
    if (e.kind == DirEntry::Kind::kFile ||
        e.kind == DirEntry::Kind::kLinkToFile) {
      if (files->size() >= kMaxFolderFiles) {
        return absl::FailedPreconditionError(absl::StrCat(
            dir, ": an image folder holds at most ", kMaxFolderFiles,
            " images"));
      }
      files->emplace_back(path, e.size);
    }
  }
  return absl::OkStatus();
}

// A whole image file, read into `out` (reused between calls).
absl::Status ReadFile(const std::string& path, std::string* out) {
  TALLY_ASSIGN_OR_RETURN(DataFile f, DataFile::Open(path));
  if (f.size() > kMaxImageBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": ", f.size(), " bytes; an image file may hold at most ",
        kMaxImageBytes));
  }
  out->resize(static_cast<size_t>(f.size()));
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = ::pread(f.fd(), out->data() + done, out->size() - done,
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "it shrank";
      return absl::DataLossError(absl::StrCat(path, ": cannot read: ", why));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImageFolderListing> ListImageFolder(
    const std::string& root, const std::vector<std::string>* classes,
    const DataRoots& roots) {
  TALLY_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, ListDirectory(root));
  ImageFolderListing l;
  l.root = root;
  for (const DirEntry& e : entries) {  // sorted by name
    if (e.kind == DirEntry::Kind::kDirectory) l.classes.push_back(e.name);
  }
  if (l.classes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        root, ": no class directories (an image folder holds a directory "
              "per class; links to directories are not followed)"));
  }
  for (size_t c = 0; c < l.classes.size(); ++c) {
    int32_t label = static_cast<int32_t>(c);
    if (classes != nullptr) {
      auto at = std::find(classes->begin(), classes->end(), l.classes[c]);
      if (at == classes->end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            root, ": class '", l.classes[c],
            "' is not one of the training split's"));
      }
      label = static_cast<int32_t>(at - classes->begin());
    }
    std::vector<std::pair<std::string, int64_t>> files;
    TALLY_RETURN_IF_ERROR(ImagesUnder(absl::StrCat(root, "/", l.classes[c]),
                                      roots, 0, &files));
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          root, ": class '", l.classes[c],
          "' holds no .png, .jpg or .jpeg file"));
    }
    for (auto& [path, size] : files) {
      l.files.push_back(std::move(path));
      l.labels.push_back(label);
      l.sizes.push_back(size);
    }
  }
  if (classes != nullptr) l.classes = *classes;
  return l;
}

absl::StatusOr<std::shared_ptr<const ImageFolder>> ImageFolder::Open(
    ImageFolderListing listing, const ImageFolderOptions& options,
    bool augment) {
  const Shape& s = options.shape;
  if (s.size() != 3 || (s[0] != 1 && s[0] != 3) || s[1] < 1 || s[2] < 1) {
    return absl::InvalidArgumentError(
        "an image folder's samples are [channels (1 or 3), height, width]");
  }
  for (const auto* v : {&options.mean, &options.std}) {
    if (!v->empty() && static_cast<int64_t>(v->size()) != s[0]) {
      return absl::InvalidArgumentError(
          "mean and std give one value per channel");
    }
  }
  std::shared_ptr<ImageFolder> f(new ImageFolder);
  f->listing_ = std::move(listing);
  f->options_ = options;
  f->augment_ = augment && (options.crop_padding > 0 || options.hflip);
  return std::shared_ptr<const ImageFolder>(std::move(f));
}

absl::Status ImageFolder::Load(int64_t i, float* x) const {
  thread_local std::string bytes;
  thread_local Image image;
  const std::string& path = listing_.files[i];
  TALLY_RETURN_IF_ERROR(ReadFile(path, &bytes));
  bytes_.fetch_add(static_cast<int64_t>(bytes.size()),
                   std::memory_order_relaxed);
  const int c = static_cast<int>(options_.shape[0]);
  const int h = static_cast<int>(options_.shape[1]);
  const int w = static_cast<int>(options_.shape[2]);
  TALLY_RETURN_IF_ERROR(DecodeImage(
      bytes, c, path, &image, options_.fit == ImageFit::kExact ? 0 : w,
      options_.fit == ImageFit::kExact ? 0 : h));
  TALLY_RETURN_IF_ERROR(FitImage(image, options_.fit, h, w, path, x));
  if (!options_.mean.empty()) {
    const int64_t plane = static_cast<int64_t>(h) * w;
    for (int k = 0; k < c; ++k) {
      const float m = options_.mean[k];
      const float inv = 1.0f / options_.std[k];
      float* p = x + k * plane;
      for (int64_t q = 0; q < plane; ++q) p[q] = (p[q] - m) * inv;
    }
  }
  return absl::OkStatus();
}

// torchvision's RandomCrop(size, padding) then RandomHorizontalFlip: the
// padding is black (after normalisation, (0 - mean) / std).
void ImageFolder::Augment(int64_t i, const GatherContext& context,
                          float* x) const {
  Rng rng(SplitMix64(context.seed ^ SplitMix64(
                         static_cast<uint64_t>(context.epoch) * 0x9e3779b97f4a7c15ULL ^
                         static_cast<uint64_t>(i))));
  const int c = static_cast<int>(options_.shape[0]);
  const int h = static_cast<int>(options_.shape[1]);
  const int w = static_cast<int>(options_.shape[2]);
  const int pad = options_.crop_padding;
  const int dy = pad > 0 ? static_cast<int>(rng.Below(2 * pad + 1)) - pad : 0;
  const int dx = pad > 0 ? static_cast<int>(rng.Below(2 * pad + 1)) - pad : 0;
  const bool flip = options_.hflip && rng.Below(2) == 1;
  if (dy == 0 && dx == 0 && !flip) return;
  thread_local std::vector<float> copy;
  const int64_t plane = static_cast<int64_t>(h) * w;
  copy.assign(x, x + c * plane);
  for (int k = 0; k < c; ++k) {
    const float black =
        options_.mean.empty() ? 0.0f : -options_.mean[k] / options_.std[k];
    for (int r = 0; r < h; ++r) {
      for (int q = 0; q < w; ++q) {
        const int sr = r + dy;
        const int sq = (flip ? w - 1 - q : q) + dx;
        x[k * plane + r * w + q] =
            sr >= 0 && sr < h && sq >= 0 && sq < w
                ? copy[k * plane + sr * w + sq]
                : black;
      }
    }
  }
}

void ImageFolder::Describe(Fingerprint* f) const {
  for (size_t i = 0; i < listing_.files.size(); ++i) {
    // The path under the root: the same files mounted elsewhere agree.
    f->Add(absl::string_view(listing_.files[i]).substr(listing_.root.size()));
    f->Add(listing_.labels[i]);
    f->AddFile(listing_.sizes[i]);
  }
}

void ImageFolder::ReportBad(int64_t i, const absl::Status& why) const {
  substituted_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  if (!reported_.insert(i).second) return;
  std::fprintf(stderr, "tally: skip_bad: another image in place of %s\n",
               std::string(why.message()).c_str());
}

absl::Status ImageFolder::Gather(std::span<const int64_t> indices,
                                 const GatherContext& context, float* x,
                                 int32_t* y) const {
  const int64_t n = NumElements(options_.shape);
  for (size_t j = 0; j < indices.size(); ++j) {
    float* out = x + static_cast<int64_t>(j) * n;
    int64_t i = indices[j];
    absl::Status s = Load(i, out);
    for (int tries = 0; !s.ok() && options_.skip_bad && tries < kMaxSubstitutes;
         ++tries) {
      ReportBad(i, s);
      i = (i + 1) % size();
      s = Load(i, out);
    }
    if (!s.ok()) return s;
    y[j] = listing_.labels[i];
    // The draw is the sample's own, whichever file stood in for it.
    if (augment_) Augment(indices[j], context, out);
  }
  return absl::OkStatus();
}

}  // namespace tally
