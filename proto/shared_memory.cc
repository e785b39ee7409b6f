#include "proto/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tally {

namespace {

constexpr char kName[] = "tally-shared";
constexpr int64_t kTokenBytes = 16;
constexpr int64_t kHeaderBytes = 64;  // the token, then the parts, aligned
constexpr int64_t kMaxBytes = int64_t{1} << 40;

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Whether the descriptor /proc/.../fd/N at `path` is one of Tally's memfds
// (a readable link "/memfd:tally-shared (deleted)").
bool IsRegionLink(const std::string& path) {
  char link[256];
  const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n < 0) return false;
  link[n] = '\0';
  return absl::StartsWith(link, absl::StrCat("/memfd:", kName));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(
    int64_t push_bytes, int64_t pull_bytes) {
  if (push_bytes < 0 || pull_bytes < 0 ||
      push_bytes + pull_bytes > kMaxBytes) {
    return absl::InvalidArgumentError("a shared region of impossible size");
  }
  std::unique_ptr<SharedRegion> r(new SharedRegion);
  r->push_at_ = kHeaderBytes;
  r->pull_at_ = r->push_at_ + RoundUp(push_bytes, 64);
  r->size_ = RoundUp(r->pull_at_ + pull_bytes, sysconf(_SC_PAGESIZE));
  r->fd_ = memfd_create(kName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r->fd_ < 0) return Errno("memfd_create");
  if (ftruncate(r->fd_, r->size_) != 0) return Errno("ftruncate");
  // Whoever opens it can never make it smaller (an access past its end
  // would fault) nor larger.
  if (fcntl(r->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    return Errno("sealing the region");
  }
  void* p = mmap(nullptr, static_cast<size_t>(r->size_), PROT_READ | PROT_WRITE,
                 MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) return Errno("mmap");
  r->data_ = static_cast<char*>(p);
  r->token_.resize(kTokenBytes);
  if (getrandom(r->token_.data(), kTokenBytes, 0) != kTokenBytes)
    return Errno("getrandom");
  std::memcpy(r->data_, r->token_.data(), kTokenBytes);
  return r;
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Map(
    const v1::SharedMemoryOffer& offer) {
  if (offer.size() <= 0 || offer.size() > kMaxBytes ||
      offer.push_at() < kTokenBytes || offer.pull_at() < offer.push_at() ||
      offer.pull_at() > offer.size() ||
      static_cast<int64_t>(offer.token().size()) != kTokenBytes ||
      offer.pid() <= 0 || offer.fd() < 0) {
    return absl::InvalidArgumentError("a malformed shared memory offer");
  }
  const std::string path =
      absl::StrCat("/proc/", offer.pid(), "/fd/", offer.fd());
  // Only the shard's memfd will do: nothing else of whatever process has
  // that number here is opened.
  if (access(path.c_str(), F_OK) != 0)
    return Errno("the shard's region is not reachable from here");
  if (!IsRegionLink(path)) {
    return absl::NotFoundError("the offered descriptor is not a shared region");
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return Errno("opening the shard's region");
  // The number may have been reused between the look and the open: what
  // was opened is checked again.
  if (!IsRegionLink(absl::StrCat("/proc/self/fd/", fd))) {
    close(fd);
    return absl::NotFoundError("the offered descriptor is not a shared region");
  }
  std::unique_ptr<SharedRegion> r(new SharedRegion);
  struct stat st;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size != offer.size() || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    close(fd);
    return absl::NotFoundError("the offered descriptor is not a sealed region");
  }
  void* p = mmap(nullptr, static_cast<size_t>(offer.size()),
                 PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping holds the region
  if (p == MAP_FAILED) return Errno("mmap");
  r->data_ = static_cast<char*>(p);
  r->size_ = offer.size();
  r->push_at_ = offer.push_at();
  r->pull_at_ = offer.pull_at();
  if (std::memcmp(r->data_, offer.token().data(), kTokenBytes) != 0) {
    return absl::NotFoundError("the shared region's token does not match");
  }
  r->token_ = offer.token();
  return r;
}

SharedRegion::~SharedRegion() {
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  CloseDescriptor();
}

v1::SharedMemoryOffer SharedRegion::Offer() const {
  v1::SharedMemoryOffer o;
  o.set_pid(getpid());
  o.set_fd(fd_);
  o.set_size(size_);
  o.set_token(token_);
  o.set_push_at(push_at_);
  o.set_pull_at(pull_at_);
  return o;
}

void SharedRegion::CloseDescriptor() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace tally
