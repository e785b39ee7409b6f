// Opening the files a job spec names.
//
// A spec comes from a submitter, and the worker that reads it runs with its
// operator's rights, so every dataset path goes through here:
//   - DataRoots: the directories the operator lets jobs read
//     (tally-worker --data_root); a path is resolved (symlinks followed,
//     loops refused) and must lie under one of them.
//   - DataFile::Open: a regular file only. A FIFO, a device, a socket or a
//     directory is refused without blocking (the open is O_NONBLOCK).
//   - ReadWholeFile: a file read into memory, refused beyond a size bound
//     before anything is allocated.
//   - ListDirectory: a directory's entries without following a link to a
//     directory, so a link cycle cannot make a listing endless.
// Errors name the path and say why; they never quote a file's bytes.
// Everything here is thread-safe: DataRoots is immutable once made.
#ifndef TALLY_COMMON_DATA_DATA_FILE_H_
#define TALLY_COMMON_DATA_DATA_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

// The default data roots of a worker: the operator's data and Debian's
// read-only package data (/usr/share/datasets, corpora), never a place that
// holds secrets. docs/security.md, "Data roots".
inline constexpr const char* kDefaultDataRoots[] = {"/srv/tally/data",
                                                    "/usr/share"};

class DataRoots {
 public:
  // Every path allowed: for a standalone run of one's own spec, and tests.
  static DataRoots Any();
  // kDefaultDataRoots.
  static DataRoots Default();
  // The given directories, made absolute and canonical where they exist
  // (a root that does not exist yet is kept as written, normalised).
  // kInvalidArgument for an empty list or a relative path.
  static absl::StatusOr<DataRoots> Make(const std::vector<std::string>& dirs);

  // The canonical path of `path` (every link resolved) when it lies under a
  // root. kPermissionDenied: outside every root (the message names the
  // roots and the flag), checked lexically before the file system is asked
  // (so it does not tell whether such a file exists), then again after the
  // links are resolved; kNotFound: no such file; kFailedPrecondition: a
  // link loop or a path too long. `what` names the spec's field in the message
  // ("dataset.train").
  absl::StatusOr<std::string> Resolve(absl::string_view what,
                                      const std::string& path) const;
  // Whether the canonical `path` lies under a root.
  bool Contains(absl::string_view canonical) const;
  // kPermissionDenied: `path` (named as given) is outside the roots.
  absl::Status Outside(absl::string_view what, absl::string_view path) const;
  // `path` made absolute (against the working directory) with "." and ".."
  // folded, without asking the file system: what a lexical check compares.
  static std::string Absolute(const std::string& path);

  bool any() const { return any_; }
  const std::vector<std::string>& dirs() const { return dirs_; }
  // "/srv/tally/data, /usr/share", or "any path".
  std::string Text() const;

 private:
  bool any_ = false;
  std::vector<std::string> dirs_;
};

// A regular file open for reading; closed when destroyed. Movable.
class DataFile {
 public:
  // kNotFound for a missing file, kFailedPrecondition for anything that is
  // not a regular file (checked without blocking) or cannot be opened.
  static absl::StatusOr<DataFile> Open(const std::string& path);

  DataFile(DataFile&& other) noexcept;
  DataFile& operator=(DataFile&& other) noexcept;
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile();

  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  // Gives up the descriptor (the caller closes it).
  int Release();

 private:
  DataFile(int fd, int64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  int64_t size_ = 0;
};

// What a file read whole into memory may hold (a CSV table, a vocabulary, a
// gzip'd IDX file once inflated): larger data belongs in arrays, which are
// mapped rather than read.
inline constexpr int64_t kMaxWholeFileBytes = int64_t{4} << 30;

// A whole regular file; kFailedPrecondition past max_bytes (nothing is
// allocated for it), kDataLoss for a read error.
absl::StatusOr<std::string> ReadWholeFile(
    const std::string& path, int64_t max_bytes = kMaxWholeFileBytes);

struct DirEntry {
  enum class Kind { kFile, kDirectory, kLinkToFile, kOther };
  std::string name;  // within the directory
  Kind kind = Kind::kOther;
  int64_t size = 0;  // files and links to files: the file's size
};

// A directory's entries, sorted by name. A link is looked through only to
// a regular file (kLinkToFile); a link to a directory, a dangling link and a
// loop are kOther, so nothing that walks the result can cycle.
absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& dir);

}  // namespace tally

#endif  // TALLY_COMMON_DATA_DATA_FILE_H_
