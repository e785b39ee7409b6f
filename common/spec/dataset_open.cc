// A dataset spec's facts known without its data (TrainSize,
// DescribeDataset), the check of its paths under the data roots, and the
// opening of its splits on a worker.
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/criteo.h"
#include "common/data/csv.h"
#include "common/data/image_folder.h"
#include "common/data/npy.h"
#include "common/data/text.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"

namespace tally {

int64_t TrainSize(const DatasetSpec& spec) {
  if (spec.name == "synthetic") return spec.synthetic.train_size;
  if (spec.name == "arrays") return spec.arrays.train_size;
  if (spec.name == "csv") return spec.csv.train_size;
  if (spec.name == "image_folder") return spec.images.train_size;
  if (spec.name == "text") return spec.text.train_size;
  if (spec.name == "clicks") return spec.clicks.train_size;
  if (spec.name == "criteo") return spec.criteo.train_size;
  return 60000;  // fashion-mnist
}

namespace {

absl::Status DescribeSamples(const DatasetSpec& spec, Shape* input_shape,
                             int* num_classes) {
  if (spec.name == "fashion-mnist") {
    *input_shape = {1, 28, 28};
    *num_classes = 10;
    return absl::OkStatus();
  }
  if (spec.name == "synthetic") {
    *input_shape = {spec.synthetic.features};
    *num_classes = spec.synthetic.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "clicks") {
    *input_shape = {spec.clicks.integer_features +
                    spec.clicks.categorical_features};
    *num_classes = 2;
    return absl::OkStatus();
  }
  if (spec.name == "criteo") {
    *input_shape = {spec.criteo.integer_features +
                    spec.criteo.categorical_features};
    *num_classes = 2;
    return absl::OkStatus();
  }
  if (spec.name == "arrays") {
    *input_shape = spec.arrays.shape;
    *num_classes = spec.arrays.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "csv") {
    *input_shape = {spec.csv.num_features};
    *num_classes = spec.csv.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "image_folder") {
    *input_shape = spec.images.shape;
    *num_classes = spec.images.num_classes;
    return absl::OkStatus();
  }
  if (spec.name == "text") {
    *input_shape = {spec.text.seq_len};
    *num_classes = static_cast<int>(spec.text.vocab_size);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dataset.name: unknown dataset '", spec.name, "'"));
}

}  // namespace

absl::Status DescribeDataset(JobSpec* spec) {
  TALLY_RETURN_IF_ERROR(
      DescribeSamples(spec->dataset, &spec->input_shape, &spec->num_classes));
  if (spec->dataset.name == "text") {
    spec->input_type = InputType::kInt64;
    spec->label_shape = {spec->dataset.text.seq_len};
  }
  if (spec->dataset.name == "clicks" || spec->dataset.name == "criteo")
    spec->input_type = InputType::kInt64;
  return absl::OkStatus();
}

namespace {

// The arrays' splits, mapped; the test split (evaluated in one go) read
// into memory. A worker whose files disagree with the spec says how.
absl::StatusOr<TrainTest> OpenArrays(const ArraysSpec& a) {
  TrainTest out;
  TALLY_ASSIGN_OR_RETURN(
      std::shared_ptr<const NpyArrays> train,
      NpyArrays::Open(a.train, a.shape, a.num_classes));
  if (train->size() != a.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        a.train.file.empty() ? a.train.inputs : a.train.file, " holds ",
        train->size(),
        " samples; the job was submitted with dataset.train_size ",
        a.train_size));
  }
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = a.shape;
    d->num_classes = a.num_classes;
  }
  out.train.source = std::move(train);
  Fingerprint f;
  out.train.source->Describe(&f);
  if (!a.test.inputs.empty()) {
    TALLY_ASSIGN_OR_RETURN(out.test.source,
                           NpyArrays::Open(a.test, a.shape, a.num_classes));
    out.test.source->Describe(&f);
    TALLY_RETURN_IF_ERROR(out.test.Materialize());
  }
  out.fingerprint = f.Text();
  return out;
}

// A file's size and its first 4 KiB (a CSV's header and first rows).
void DescribeFile(const std::string& path, Fingerprint* f) {
  absl::StatusOr<DataFile> file = DataFile::Open(path);
  std::string head(4096, '\0');
  ssize_t n = file.ok() ? ::pread(file->fd(), head.data(), head.size(), 0) : 0;
  head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  f->AddFile(file.ok() ? file->size() : -1);
  f->Add(head);
}

// A table's splits, checked against the spec.
absl::StatusOr<TrainTest> OpenCsv(const CsvSpec& c) {
  CsvOptions o;
  o.label = c.label;
  o.features = c.features;
  o.num_classes = c.num_classes;
  TrainTest out;
  TALLY_ASSIGN_OR_RETURN(out.train, LoadCsv(c.train, o));
  if (out.train.sample_numel() != c.num_features ||
      out.train.size() != c.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        c.train, " holds ", out.train.size(), " rows of ",
        out.train.sample_numel(), " features; the job was submitted with ",
        c.train_size, " of ", c.num_features));
  }
  if (!c.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(out.test, LoadCsv(c.test, o));
    if (out.test.sample_numel() != c.num_features) {
      return absl::FailedPreconditionError(
          absl::StrCat(c.test, " has ", out.test.sample_numel(),
                       " features; ", c.train, " ", c.num_features));
    }
  } else {
    out.test.sample_shape = out.train.sample_shape;
    out.test.num_classes = c.num_classes;
  }
  Fingerprint f;
  for (const std::string* path : {&c.train, &c.test}) {
    if (!path->empty()) DescribeFile(*path, &f);
  }
  out.fingerprint = f.Text();
  return out;
}

// An image folder's splits: the files listed (each worker checks its own
// count against the spec's), the test split decoded into memory.
absl::StatusOr<TrainTest> OpenImageFolder(const ImageFolderSpec& f,
                                          const DataRoots& roots) {
  ImageFolderOptions o;
  o.shape = f.shape;
  o.fit = f.fit;
  o.mean = f.mean;
  o.std = f.std;
  o.crop_padding = f.crop_padding;
  o.hflip = f.hflip;
  o.skip_bad = f.skip_bad;
  TALLY_ASSIGN_OR_RETURN(ImageFolderListing train, ListImageFolder(f.train, nullptr, roots));
  if (static_cast<int>(train.classes.size()) != f.num_classes ||
      static_cast<int64_t>(train.files.size()) != f.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        f.train, " holds ", train.files.size(), " images in ",
        train.classes.size(), " classes; the job was submitted with ",
        f.train_size, " in ", f.num_classes,
        " (dataset.train_size, dataset.classes)"));
  }
  TrainTest out;
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = f.shape;
    d->num_classes = f.num_classes;
  }
  std::vector<std::string> classes = train.classes;
  TALLY_ASSIGN_OR_RETURN(out.train.source,
                         ImageFolder::Open(std::move(train), o, true));
  Fingerprint print;
  out.train.source->Describe(&print);
  if (!f.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(ImageFolderListing test,
                           ListImageFolder(f.test, &classes, roots));
    TALLY_ASSIGN_OR_RETURN(out.test.source,
                           ImageFolder::Open(std::move(test), o, false));
    out.test.source->Describe(&print);
    TALLY_RETURN_IF_ERROR(out.test.Materialize());
  }
  out.fingerprint = print.Text();
  return out;
}

// The files of a list of paths and globs, in order.
absl::StatusOr<std::vector<std::string>> ExpandAll(
    const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    TALLY_ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandGlob(p));
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

// Criteo logs' splits, both read as they are gathered (evaluation gathers
// the test split in pieces). A worker whose files
// hold another count of lines than the job was submitted with says so.
absl::StatusOr<TrainTest> OpenCriteo(const CriteoSpec& c) {
  CriteoOptions o;
  o.integer_features = c.integer_features;
  o.categorical_features = c.categorical_features;
  TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(c.train));
  o.end = 1.0 - c.test_fraction;
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const CriteoLines> train,
                         CriteoLines::Open(o));
  if (train->size() != c.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(c.train, ", "), " hold ", train->size(),
        " training lines (", train->lines(),
        " in all); the job was submitted with dataset.train_size ",
        c.train_size));
  }
  if (!c.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(c.test));
    o.end = 1.0;
  } else {
    o.begin = 1.0 - c.test_fraction;
    o.end = 1.0;
  }
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const CriteoLines> test,
                         CriteoLines::Open(o));
  TrainTest out;
  Fingerprint print;
  train->Describe(&print);
  test->Describe(&print);
  out.fingerprint = print.Text();
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = {c.integer_features + c.categorical_features};
    d->input_type = InputType::kInt64;
    d->num_classes = 2;
  }
  out.train.source = std::move(train);
  if (test->size() > 0) out.test.source = std::move(test);
  return out;
}

// A corpus's splits, both read as they are gathered (evaluation gathers
// the test split in pieces). A worker whose files give another vocabulary
// or another count of windows than the job was submitted with says so.
absl::StatusOr<TrainTest> OpenText(const TextSpec& t) {
  TextOptions o;
  o.vocab = t.vocab;
  o.seq_len = t.seq_len;
  TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(t.train));
  o.end = 1.0 - t.test_fraction;
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const TextTokens> train,
                         TextTokens::Open(o));
  if (train->vocabulary() != t.vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        t.vocab, " holds ", train->vocabulary(),
        " tokens; the job was submitted with dataset.vocab_size ",
        t.vocab_size));
  }
  if (train->size() != t.train_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        absl::StrJoin(t.train, ", "), " hold ", train->size(),
        " training windows of ", t.seq_len + 1, " tokens (", train->tokens(),
        " tokens); the job was submitted with dataset.train_size ",
        t.train_size));
  }
  if (!t.test.empty()) {
    TALLY_ASSIGN_OR_RETURN(o.files, ExpandAll(t.test));
    o.end = 1.0;
  } else {
    o.begin = 1.0 - t.test_fraction;
    o.end = 1.0;
  }
  TALLY_ASSIGN_OR_RETURN(std::shared_ptr<const TextTokens> test,
                         TextTokens::Open(o));
  TrainTest out;
  for (Dataset* d : {&out.train, &out.test}) {
    d->sample_shape = {t.seq_len};
    d->input_type = InputType::kInt64;
    d->label_shape = {t.seq_len};
    d->num_classes = static_cast<int>(t.vocab_size);
  }
  Fingerprint f;
  train->Describe(&f);
  if (!t.test.empty()) test->Describe(&f);
  out.fingerprint = f.Text();
  out.train.source = std::move(train);
  if (test->size() > 0) out.test.source = std::move(test);
  return out;
}

// A field's path as its reader opens it, literally, under the roots.
absl::Status CheckPath(absl::string_view what, const std::string& path,
                       const DataRoots& roots) {
  if (path.empty()) return absl::OkStatus();
  return roots.Resolve(what, path).status();
}

// What a glob can match: at most this many files a pattern.
constexpr size_t kMaxGlobMatches = size_t{1} << 20;

// Each path of a list its reader expands (globs), under the roots: the
// pattern's fixed directory first, lexically, so that a pattern outside
// the roots is refused before it is expanded (its matches never reach a
// message), then every match.
absl::Status CheckPaths(absl::string_view what,
                        const std::vector<std::string>& paths,
                        const DataRoots& roots) {
  for (const std::string& p : paths) {
    if (p.empty()) continue;
    const size_t glob = p.find_first_of("*?[");
    if (glob != std::string::npos) {
      const size_t slash = p.rfind('/', glob);
      const std::string dir =
          slash == std::string::npos ? "." : p.substr(0, slash + 1);
      if (!roots.Contains(DataRoots::Absolute(dir))) {
        return roots.Outside(what, p);
      }
    }
    TALLY_ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandGlob(p));
    if (files.size() > kMaxGlobMatches) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": ", p, " matches more than ", kMaxGlobMatches,
                       " files"));
    }
    for (const std::string& file : files) {
      TALLY_RETURN_IF_ERROR(roots.Resolve(what, file).status());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDataPaths(const DatasetSpec& spec, const DataRoots& roots) {
  if (roots.any()) return absl::OkStatus();
  if (spec.name == "fashion-mnist") {
    for (const char* f :
         {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      TALLY_RETURN_IF_ERROR(CheckPath(
          "dataset.root", absl::StrCat(spec.root, "/", f), roots));
    }
    return absl::OkStatus();
  }
  if (spec.name == "arrays") {
    const ArraysSpec& a = spec.arrays;
    for (const ArrayFiles* split : {&a.train, &a.test}) {
      // With a file (.npz, .safetensors), inputs and labels are its keys.
      TALLY_RETURN_IF_ERROR(CheckPaths(
          split == &a.train ? "dataset.train" : "dataset.test",
          split->file.empty()
              ? std::vector<std::string>{split->inputs, split->labels}
              : std::vector<std::string>{split->file},
          roots));
    }
    return absl::OkStatus();
  }
  if (spec.name == "csv") {
    TALLY_RETURN_IF_ERROR(CheckPath("dataset.train", spec.csv.train, roots));
    return CheckPath("dataset.test", spec.csv.test, roots);
  }
  if (spec.name == "image_folder") {
    TALLY_RETURN_IF_ERROR(
        CheckPath("dataset.train", spec.images.train, roots));
    return CheckPath("dataset.test", spec.images.test, roots);
  }
  if (spec.name == "text") {
    TALLY_RETURN_IF_ERROR(CheckPaths("dataset.train", spec.text.train, roots));
    TALLY_RETURN_IF_ERROR(CheckPaths("dataset.test", spec.text.test, roots));
    return CheckPath("dataset.vocab", spec.text.vocab, roots);
  }
  if (spec.name == "criteo") {
    TALLY_RETURN_IF_ERROR(
        CheckPaths("dataset.train", spec.criteo.train, roots));
    return CheckPaths("dataset.test", spec.criteo.test, roots);
  }
  return absl::OkStatus();  // synthetic and clicks name no file
}

absl::StatusOr<TrainTest> OpenDataset(const DatasetSpec& spec,
                                      const DataRoots& roots) {
  TALLY_RETURN_IF_ERROR(CheckDataPaths(spec, roots));
  if (spec.name == "fashion-mnist") {
    return LoadFashionMnist(spec.root, spec.normalize);
  }
  if (spec.name == "synthetic") return MakeSynthetic(spec.synthetic);
  if (spec.name == "arrays") return OpenArrays(spec.arrays);
  if (spec.name == "csv") return OpenCsv(spec.csv);
  if (spec.name == "image_folder") return OpenImageFolder(spec.images, roots);
  if (spec.name == "text") return OpenText(spec.text);
  if (spec.name == "clicks") return MakeClicks(spec.clicks);
  if (spec.name == "criteo") return OpenCriteo(spec.criteo);
  return absl::InvalidArgumentError(
      absl::StrCat("dataset.name: unknown dataset '", spec.name, "'"));
}

}  // namespace tally
