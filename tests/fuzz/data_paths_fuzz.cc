// libFuzzer: a directory tree a submitter might point a job at, and the
// dataset opened from it as a worker does (within its data roots), then a
// few samples gathered. The input is a little program: a count of ops,
// each of which makes a directory, a file (small, or sparse and huge), a
// FIFO, or a link (to a sibling, to ".", "..", itself, /dev/zero or a file
// outside the roots); then the path a dataset names and its kind. Whatever the tree, opening
// must return (no crash, no hang: libFuzzer's -timeout), no message may
// carry a file's bytes (every file holds the marker), and no file outside
// the roots (/etc/passwd behind a link) may reach a message.
//
// The tree is built beneath the scratch root only: every op resolves its
// path from the root's descriptor one name at a time and follows no link
// (a link to "..", or to /etc/passwd, is made but never written through),
// and files are opened without blocking (a FIFO is not waited on).
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/data/data_file.h"
#include "common/spec/job_spec.h"

namespace {

constexpr char kMarker[] = "Zq7SECRETx";

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ >= end_; }
  uint8_t Byte() { return empty() ? 0 : *p_++; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// The names the tree's ops use, relative to the scratch root.
const char* const kNames[] = {"d",     "d/c",   "d/c/x.png", "d/y.csv",
                              "t.csv", "l",     "d/l",       "d/c/l.png",
                              "e",     "e/a.txt", "v.txt",   "d/c/e"};
constexpr int kNumNames = sizeof(kNames) / sizeof(kNames[0]);

std::string Target(uint8_t b, const std::string& root) {
  switch (b % 7) {
    case 0: return ".";
    case 1: return "..";
    case 2: return "/dev/zero";
    case 3: return "/etc/passwd";
    case 4: return root;
    default: return root + "/" + kNames[b % kNumNames];
  }
}

// The directory that holds `rel`'s last name, under `root_fd`, reached
// without following a link (-1 when a name on the way is a link, not a
// directory, or missing); that name into *leaf.
int OpenParent(int root_fd, const std::string& rel, std::string* leaf) {
  int dir = ::dup(root_fd);
  size_t begin = 0;
  for (size_t slash; (slash = rel.find('/', begin)) != std::string::npos;
       begin = slash + 1) {
    const std::string name = rel.substr(begin, slash - begin);
    const int next = ::openat(dir, name.c_str(),
                              O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    ::close(dir);
    if (next < 0) return -1;
    dir = next;
  }
  *leaf = rel.substr(begin);
  return dir;
}

// Writes `text` to the file `leaf` in `dir` (made if missing), not through
// a link and not waiting on a FIFO; then sizes it to `size` (0: as
// written).
void WriteFile(int dir, const std::string& leaf, const std::string& text,
               int64_t size) {
  const int fd = ::openat(dir, leaf.c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW |
                              O_NONBLOCK | O_CLOEXEC,
                          0600);
  if (fd < 0) return;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    (void)!::write(fd, text.data(), text.size());
    if (size > 0) (void)!::ftruncate(fd, size);
  }
  ::close(fd);
}

void Build(Reader& in, const std::string& root) {
  const int root_fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) return;
  const int ops = in.Byte() % 24;
  for (int op = 0; op < ops && !in.empty(); ++op) {
    const uint8_t kind = in.Byte();
    const std::string rel = kNames[in.Byte() % kNumNames];
    std::string leaf;
    const int dir = OpenParent(root_fd, rel, &leaf);
    if (dir < 0) {
      if (kind % 6 == 2 || kind % 6 >= 4) in.Byte();  // keep the program
      continue;
    }
    switch (kind % 6) {
      case 0: ::mkdirat(dir, leaf.c_str(), 0700); break;
      case 1: WriteFile(dir, leaf, std::string("x,y\n1,0\n") + kMarker + ",1\n", 0); break;
      case 2: {  // sparse: past the bound of a file read whole (8 GiB
        // and more: refused before allocating), or large to a mapped
        // reader (which scans it, as it would a real corpus of that size)
        const bool whole = rel.ends_with(".csv") || rel.ends_with("v.txt");
        const int shift = whole ? 33 + in.Byte() % 8 : 16 + in.Byte() % 8;
        WriteFile(dir, leaf, kMarker, int64_t{1} << shift);
        break;
      }
      case 3: ::mkfifoat(dir, leaf.c_str(), 0600); break;
      default:
        (void)!::symlinkat(Target(in.Byte(), root).c_str(), dir, leaf.c_str());
    }
    ::close(dir);
  }
  ::close(root_fd);
}

tally::DatasetSpec Spec(Reader& in, const std::string& root) {
  tally::DatasetSpec d;
  const std::string path = root + "/" + kNames[in.Byte() % kNumNames];
  switch (in.Byte() % 5) {
    case 0:
      d.name = "csv";
      d.csv = {path, "", "y", {}, 1, 2, 1};
      break;
    case 1:
      d.name = "image_folder";
      d.images.train = path;
      d.images.shape = {1, 4, 4};
      d.images.num_classes = 1;
      d.images.train_size = 1;
      break;
    case 2:
      d.name = "text";
      d.text.train = {path};
      d.text.seq_len = 2;
      if (in.Byte() % 2) d.text.vocab = root + "/v.txt";
      break;
    case 3:
      d.name = "criteo";
      d.criteo.train = {path, root + "/*/*.txt"};
      break;
    default:
      d.name = "fashion-mnist";
      d.root = path;
  }
  return d;
}

int RemoveOne(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path);
}

void Check(const std::string& message) {
  if (message.find(kMarker) != std::string::npos ||
      message.find("root:x:0") != std::string::npos) {
    std::fprintf(stderr, "a file's bytes in a message: %s\n", message.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char tmpl[] = "/tmp/tally_paths_fuzz_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 0;
  const std::string root = tmpl;
  Reader in(data, size);
  Build(in, root);
  const tally::DatasetSpec spec = Spec(in, root);
  absl::StatusOr<tally::DataRoots> roots = tally::DataRoots::Make({root});
  absl::StatusOr<tally::TrainTest> d = tally::OpenDataset(spec, *roots);
  if (!d.ok()) {
    Check(std::string(d.status().message()));
  } else if (d->train.size() > 0 && d->train.input_type ==
                                        tally::InputType::kFloat32) {
    std::vector<float> x(static_cast<size_t>(d->train.sample_numel()));
    int32_t y = 0;
    const int64_t first = 0;
    absl::Status s = d->train.Gather({&first, 1}, x.data(), &y);
    Check(std::string(s.message()));
  }
  ::nftw(root.c_str(), RemoveOne, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}
