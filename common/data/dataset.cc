#include "common/data/dataset.h"

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/data_file.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace tally {

void Fingerprint::Add(absl::string_view bytes) {
  any_ = true;
  for (const char c : bytes) {
    hash_ ^= static_cast<uint8_t>(c);
    hash_ *= 0x100000001b3ULL;
  }
}

void Fingerprint::Add(int64_t value) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(value >> (8 * i));
  Add(absl::string_view(bytes, 8));
}

void Fingerprint::AddFile(int64_t size) {
  ++files_;
  bytes_ += size;
  Add(size);
}

std::string Fingerprint::Text() const {
  if (!any_) return "";
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(hash_));
  return absl::StrCat(files_, " files, ", bytes_, " bytes, hash ", hex);
}

absl::Status Dataset::Gather(std::span<const int64_t> indices, float* x,
                             int32_t* y, const GatherContext& context) const {
  if (source != nullptr) return source->Gather(indices, context, x, y);
  const int64_t n = sample_numel();
  for (size_t i = 0; i < indices.size(); ++i) {
    std::memcpy(x + i * n, features.data() + indices[i] * n, n * sizeof(float));
    y[i] = labels[indices[i]];
  }
  return absl::OkStatus();
}

absl::Status Dataset::GatherIds(std::span<const int64_t> indices, int64_t* x,
                                int32_t* y, const GatherContext& context) const {
  if (source != nullptr) return source->GatherIds(indices, context, x, y);
  const int64_t n = sample_numel(), m = label_numel();
  for (size_t i = 0; i < indices.size(); ++i) {
    std::memcpy(x + i * n, ids.data() + indices[i] * n, n * sizeof(int64_t));
    std::memcpy(y + i * m, labels.data() + indices[i] * m, m * sizeof(int32_t));
  }
  return absl::OkStatus();
}

absl::Status Dataset::Materialize() {
  if (source == nullptr) return absl::OkStatus();
  const int64_t n = source->size();
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  labels.resize(static_cast<size_t>(n * label_numel()));
  if (input_type == InputType::kInt64) {
    ids.resize(static_cast<size_t>(n * sample_numel()));
    TALLY_RETURN_IF_ERROR(
        source->GatherIds(all, GatherContext{}, ids.data(), labels.data()));
  } else {
    features.resize(static_cast<size_t>(n * sample_numel()));
    TALLY_RETURN_IF_ERROR(
        source->Gather(all, GatherContext{}, features.data(), labels.data()));
  }
  source.reset();
  return absl::OkStatus();
}

namespace {

// Reads a whole (optionally gzip'd) regular file, at most
// kMaxWholeFileBytes once inflated.
absl::StatusOr<std::vector<uint8_t>> ReadGz(const std::string& path) {
  TALLY_ASSIGN_OR_RETURN(DataFile file, DataFile::Open(path));
  gzFile f = gzdopen(file.fd(), "rb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  file.Release();  // gzclose closes it
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  while (true) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return absl::DataLossError(absl::StrCat(path, ": corrupt data: ", msg));
    }
    if (n == 0) break;
    if (static_cast<int64_t>(out.size()) + n > kMaxWholeFileBytes) {
      gzclose(f);
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": more than ", kMaxWholeFileBytes,
          " bytes once inflated; a file read whole may hold at most that"));
    }
    out.insert(out.end(), buf, buf + n);
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  if (err != Z_OK && err != Z_STREAM_END) {
    std::string m = msg;
    gzclose(f);
    return absl::DataLossError(absl::StrCat(path, ": corrupt data: ", m));
  }
  int rc = gzclose(f);
  if (rc == Z_BUF_ERROR) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated (the gzip stream ends early)"));
  }
  if (rc != Z_OK) {
    return absl::DataLossError(absl::StrCat(path, ": read error ", rc));
  }
  return out;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Parses an IDX header of `dims` dimensions and checks the payload size.
absl::StatusOr<std::vector<int64_t>> ParseIdx(const std::string& path,
                                              const std::vector<uint8_t>& data,
                                              uint32_t magic, int dims) {
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (data.size() < 4) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated (", data.size(), " bytes, no header)"));
  }
  const uint32_t got = BigEndian32(data.data());
  if (got != magic) {
    // The file's first bytes are not quoted: the file may be anything.
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": wrong magic number (expected 0x",
        absl::Hex(magic, absl::kZeroPad8),
        "): not an IDX file of the expected kind"));
  }
  if (data.size() < header) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  std::vector<int64_t> shape;
  int64_t total = 1;
  for (int i = 0; i < dims; ++i) {
    shape.push_back(BigEndian32(data.data() + 4 + 4 * i));
    total *= shape.back();
  }
  if (data.size() - header != static_cast<size_t>(total)) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", data.size() < header + total ? "truncated" : "corrupt",
        ": header promises ", total, " bytes of data, file has ",
        data.size() - header));
  }
  return shape;
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes) {
  TALLY_ASSIGN_OR_RETURN(std::vector<uint8_t> images, ReadGz(images_path));
  TALLY_ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadGz(labels_path));
  TALLY_ASSIGN_OR_RETURN(std::vector<int64_t> ishape,
                         ParseIdx(images_path, images, 0x803, 3));
  TALLY_ASSIGN_OR_RETURN(std::vector<int64_t> lshape,
                         ParseIdx(labels_path, labels, 0x801, 1));
  if (ishape[0] != lshape[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " holds ", ishape[0], " images but ",
                     labels_path, " holds ", lshape[0], " labels"));
  }
  Dataset d;
  d.sample_shape = {1, ishape[1], ishape[2]};
  d.num_classes = num_classes;
  const uint8_t* px = images.data() + 16;
  d.features.resize(images.size() - 16);
  for (size_t i = 0; i < d.features.size(); ++i) d.features[i] = px[i] / 255.0f;
  d.labels.resize(lshape[0]);
  for (int64_t i = 0; i < lshape[0]; ++i) {
    const int v = labels[8 + i];
    if (v >= num_classes) {
      return absl::DataLossError(absl::StrCat(labels_path, ": label ", v,
                                              " at index ", i, " is not below ",
                                              num_classes));
    }
    d.labels[i] = v;
  }
  return d;
}

void Normalize(Dataset& d, float mean, float std) {
  const float inv = 1.0f / std;
  for (float& v : d.features) v = (v - mean) * inv;
}

absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& root,
                                           bool normalize) {
  TrainTest tt;
  TALLY_ASSIGN_OR_RETURN(tt.train,
                         LoadIdx(root + "/train-images-idx3-ubyte.gz",
                                 root + "/train-labels-idx1-ubyte.gz", 10));
  TALLY_ASSIGN_OR_RETURN(tt.test,
                         LoadIdx(root + "/t10k-images-idx3-ubyte.gz",
                                 root + "/t10k-labels-idx1-ubyte.gz", 10));
  if (normalize) {
    Normalize(tt.train, kFashionMnistMean, kFashionMnistStd);
    Normalize(tt.test, kFashionMnistMean, kFashionMnistStd);
  }
  return tt;
}

absl::StatusOr<TrainTest> MakeSynthetic(const SyntheticOptions& o) {
  if (o.train_size <= 0 || o.test_size < 0 || o.features <= 0 ||
      o.num_classes < 2 || o.teacher_hidden <= 0) {
    return absl::InvalidArgumentError(
        "synthetic dataset needs train_size > 0, test_size >= 0, features > 0, "
        "classes >= 2");
  }
  Rng rng(o.seed);
  const int64_t f = o.features, h = o.teacher_hidden, c = o.num_classes;
  std::vector<float> w1(h * f), w2(c * h);
  for (float& w : w1) w = rng.Normal() / std::sqrt(static_cast<float>(f));
  for (float& w : w2) w = rng.Normal();
  auto make = [&](int64_t n) {
    Dataset d;
    d.sample_shape = {f};
    d.num_classes = static_cast<int>(c);
    d.features.resize(n * f);
    d.labels.resize(n);
    std::vector<float> hidden(h);
    for (int64_t s = 0; s < n; ++s) {
      float* x = d.features.data() + s * f;
      for (int64_t i = 0; i < f; ++i) x[i] = rng.Normal();
      for (int64_t j = 0; j < h; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < f; ++i) acc += w1[j * f + i] * x[i];
        hidden[j] = std::tanh(acc);
      }
      int best = 0;
      float best_v = -1e30f;
      for (int64_t k = 0; k < c; ++k) {
        float acc = 0.0f;
        for (int64_t j = 0; j < h; ++j) acc += w2[k * h + j] * hidden[j];
        if (acc > best_v) {
          best_v = acc;
          best = static_cast<int>(k);
        }
      }
      d.labels[s] = best;
    }
    return d;
  };
  TrainTest tt;
  tt.train = make(o.train_size);
  tt.test = make(o.test_size);
  return tt;
}

std::vector<int64_t> EpochOrder(int64_t size, uint64_t seed, int64_t epoch,
                                int rank, int world) {
  std::vector<int64_t> perm(size);
  for (int64_t i = 0; i < size; ++i) perm[i] = i;
  Rng rng(SplitMix64(seed) ^ SplitMix64(0x5eed0000ULL + epoch));
  rng.Shuffle(perm);
  if (world <= 1) return perm;
  std::vector<int64_t> mine;
  mine.reserve(size / world + 1);
  for (int64_t i = rank; i < size; i += world) mine.push_back(perm[i]);
  return mine;
}

}  // namespace tally
