#include "common/data/data_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tally {
namespace {

// `path` with "." and empty components dropped and ".." folded, for a root
// that does not exist yet (and so has no canonical form).
std::string Normalise(const std::string& path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    const std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  return "/" + absl::StrJoin(parts, "/");
}

}  // namespace

DataRoots DataRoots::Any() {
  DataRoots r;
  r.any_ = true;
  return r;
}

DataRoots DataRoots::Default() {
  return *Make(std::vector<std::string>(std::begin(kDefaultDataRoots),
                                        std::end(kDefaultDataRoots)));
}

absl::StatusOr<DataRoots> DataRoots::Make(const std::vector<std::string>& dirs) {
  if (dirs.empty()) {
    return absl::InvalidArgumentError("--data_root: no directory given");
  }
  DataRoots r;
  for (const std::string& d : dirs) {
    if (d.empty() || d[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data_root: '", d, "' is not an absolute path"));
    }
    char buf[PATH_MAX];
    r.dirs_.push_back(::realpath(d.c_str(), buf) != nullptr ? std::string(buf)
                                                           : Normalise(d));
  }
  return r;
}

bool DataRoots::Contains(absl::string_view canonical) const {
  if (any_) return true;
  for (const std::string& root : dirs_) {
    if (root == "/" || canonical == root ||
        (absl::StartsWith(canonical, root) && canonical.size() > root.size() &&
         canonical[root.size()] == '/')) {
      return true;
    }
  }
  return false;
}

std::string DataRoots::Text() const {
  return any_ ? "any path" : absl::StrJoin(dirs_, ", ");
}

std::string DataRoots::Absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return Normalise(path);
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return Normalise("/" + path);
  return Normalise(absl::StrCat(cwd, "/", path));
}

absl::Status DataRoots::Outside(absl::string_view what,
                                absl::string_view path) const {
  return absl::PermissionDeniedError(absl::StrCat(
      what, ": ", path, " is outside this worker's data roots (", Text(),
      "; tally-worker --data_root)"));
}

absl::StatusOr<std::string> DataRoots::Resolve(absl::string_view what,
                                               const std::string& path) const {
  // Lexically first: a path outside the roots is refused before the file
  // system is asked anything, so the answer never tells whether it exists.
  if (!any_ && !path.empty() && !Contains(Absolute(path))) {
    return Outside(what, path);
  }
  char buf[PATH_MAX];
  if (path.empty() || ::realpath(path.c_str(), buf) == nullptr) {
    const int err = path.empty() ? ENOENT : errno;
    const std::string at = absl::StrCat(what, ": ", path, ": ");
    switch (err) {
      case ENOENT:
      case ENOTDIR:
        return absl::NotFoundError(absl::StrCat(at, "no such file"));
      case ELOOP:
        return absl::FailedPreconditionError(
            absl::StrCat(at, "too many levels of symbolic links (a loop)"));
      default:
        return absl::FailedPreconditionError(
            absl::StrCat(at, "cannot resolve: ", std::strerror(err)));
    }
  }
  std::string canonical(buf);
  if (!Contains(canonical)) return Outside(what, path);  // through a link
  return canonical;
}

absl::StatusOr<DataFile> DataFile::Open(const std::string& path) {
  // Non-blocking: a FIFO must not hang the open until a writer appears.
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        path, dir ? ": a directory, not a file" : ": not a regular file"));
  }
  // Reads of a regular file never block; clear the flag for plain reads.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return DataFile(fd, static_cast<int64_t>(st.st_size));
}

DataFile::DataFile(DataFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

DataFile& DataFile::operator=(DataFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

int DataFile::Release() { return std::exchange(fd_, -1); }

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          int64_t max_bytes) {
  absl::StatusOr<DataFile> f = DataFile::Open(path);
  if (!f.ok()) return f.status();
  if (f->size() > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": ", f->size(), " bytes; a file read whole may hold at most ",
        max_bytes));
  }
  std::string out(static_cast<size_t>(f->size()), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(f->fd(), out.data() + done, out.size() - done,
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": cannot read: ", n < 0 ? std::strerror(errno) : "it shrank"));
    }
    done += static_cast<size_t>(n);
  }
  return out;
}

absl::StatusOr<std::vector<DirEntry>> ListDirectory(const std::string& dir) {
  const int dfd =
      ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  if (dfd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        dir, err == ENOTDIR ? ": not a directory" : ": cannot list: ",
        err == ENOTDIR ? "" : std::strerror(err)));
  }
  DIR* d = ::fdopendir(dfd);
  if (d == nullptr) {
    ::close(dfd);
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot list: ", std::strerror(errno)));
  }
  std::vector<DirEntry> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    DirEntry entry;
    entry.name = name;
    struct stat st;
    if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      entry.kind = DirEntry::Kind::kFile;
      entry.size = static_cast<int64_t>(st.st_size);
    } else if (S_ISDIR(st.st_mode)) {
      entry.kind = DirEntry::Kind::kDirectory;
    } else if (S_ISLNK(st.st_mode) &&
               ::fstatat(dfd, name.c_str(), &st, 0) == 0 &&
               S_ISREG(st.st_mode)) {
      entry.kind = DirEntry::Kind::kLinkToFile;
      entry.size = static_cast<int64_t>(st.st_size);
    }
    out.push_back(std::move(entry));
  }
  ::closedir(d);  // closes dfd
  std::sort(out.begin(), out.end(),
            [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return out;
}

}  // namespace tally
