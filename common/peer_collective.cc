// The peer-copy all-reduce (see CreatePeerCollective in device.h).
//
// With k members and a buffer of n floats, slice r is [r*n/k, (r+1)*n/k).
//   barrier 1: every member has finished writing its buffer;
//   reduce-scatter: member r copies slice r of each peer's buffer into its
//     own scratch and adds it to its own slice r;
//   barrier 2: every slice is reduced;
//   all-gather: member r copies every peer's slice p into its slice p;
//   barrier 3: nobody reads a member's buffer any more.
// Between barriers a member only writes slices of its own buffer that no
// peer reads in that phase, so no two devices ever race on memory.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/device.h"
#include "common/kernels.h"

namespace tally {

namespace {

class PeerCollective final : public Collective {
 public:
  PeerCollective(std::vector<Device*> devices, absl::Duration timeout)
      : devices_(std::move(devices)),
        timeout_(timeout),
        buffers_(devices_.size(), nullptr),
        counts_(devices_.size(), 0),
        scratch_(devices_.size()) {}

  const char* name() const override { return "peer"; }

  absl::Status AllReduceSum(int rank, float* buffer, int64_t count) override {
    const int k = static_cast<int>(devices_.size());
    if (rank < 0 || rank >= k) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-reduce rank ", rank, " outside [0, ", k, ")"));
    }
    Device& dev = *devices_[rank];
    buffers_[rank] = buffer;
    counts_[rank] = count;
    absl::Status own = dev.Synchronize();

    // Barrier 1: all buffers are ready, and all members agree on the size.
    bool all_ok = false;
    if (absl::Status s = Barrier(own.ok(), &all_ok); !s.ok()) return s;
    if (!all_ok) {
      return own.ok() ? absl::AbortedError(
                            "all-reduce abandoned: another member failed")
                      : own;
    }
    for (int p = 0; p < k; ++p) {
      if (counts_[p] != count) {
        return absl::InvalidArgumentError(
            absl::StrCat("all-reduce sizes differ: rank ", rank, " has ", count,
                         ", rank ", p, " has ", counts_[p]));
      }
    }

    // Reduce-scatter into slice `rank`.
    const auto [begin, end] = Slice(count, rank, k);
    absl::Status step = ReduceSlice(rank, buffer + begin, begin, end - begin);
    if (absl::Status s = Barrier(step.ok(), &all_ok); !s.ok()) return s;
    if (!step.ok()) return step;
    if (!all_ok)
      return absl::AbortedError("all-reduce abandoned: another member failed");

    // All-gather every other slice.
    for (int p = 0; p < k && step.ok(); ++p) {
      if (p == rank) continue;
      const auto [pb, pe] = Slice(count, p, k);
      if (pe > pb) {
        step = dev.CopyFromPeer(buffer + pb, *devices_[p], buffers_[p] + pb,
                                (pe - pb) * sizeof(float));
      }
    }
    if (absl::Status s = dev.Synchronize(); step.ok()) step = s;
    if (absl::Status s = Barrier(step.ok(), &all_ok); !s.ok()) return s;
    if (!step.ok()) return step;
    if (!all_ok)
      return absl::AbortedError("all-reduce abandoned: another member failed");
    return absl::OkStatus();
  }

 private:
  static std::pair<int64_t, int64_t> Slice(int64_t n, int r, int k) {
    return {n * r / k, n * (r + 1) / k};
  }

  // Adds slice [begin, begin + n) of every peer's buffer into `own`.
  absl::Status ReduceSlice(int rank, float* own, int64_t begin, int64_t n) {
    if (n == 0) return absl::OkStatus();
    Device& dev = *devices_[rank];
    DeviceBuffer<float>& scratch = scratch_[rank];
    if (scratch.size() < static_cast<size_t>(n)) {
      scratch.Reset();
      auto b = DeviceBuffer<float>::Create(&dev, n);
      if (!b.ok()) return b.status();
      scratch = *std::move(b);
    }
    for (int p = 0; p < static_cast<int>(devices_.size()); ++p) {
      if (p == rank) continue;
      if (absl::Status s =
              dev.CopyFromPeer(scratch.data(), *devices_[p],
                               buffers_[p] + begin, n * sizeof(float));
          !s.ok()) {
        return s;
      }
      // Same stream: the add runs after the copy, the next copy after it.
      dev.kernels().Axpy(n, 1.0f, scratch.data(), own);
    }
    return dev.Synchronize();
  }

  // Waits until every member arrived; *all_ok is whether all passed true.
  absl::Status Barrier(bool ok, bool* all_ok) {
    absl::MutexLock lock(&mu_);
    if (broken_) {
      return absl::FailedPreconditionError(
          "the device all-reduce is broken: a member missed a barrier "
          "earlier");
    }
    const int64_t generation = generation_;
    round_ok_ = round_ok_ && ok;
    if (++arrived_ == static_cast<int>(devices_.size())) {
      last_ok_ = round_ok_;
      round_ok_ = true;
      arrived_ = 0;
      ++generation_;
    } else {
      auto done = [this, generation]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return generation_ != generation || broken_;
      };
      if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout_) ||
          generation_ == generation) {
        broken_ = true;
        return absl::DeadlineExceededError(
            absl::StrCat("device all-reduce: a member did not arrive within ",
                         absl::FormatDuration(timeout_)));
      }
    }
    *all_ok = last_ok_;
    return absl::OkStatus();
  }

  const std::vector<Device*> devices_;  // borrowed
  const absl::Duration timeout_;
  // Slot r is written by member r before barrier 1 and read by the others
  // only after it, so the barrier orders every access.
  std::vector<float*> buffers_;
  std::vector<int64_t> counts_;
  std::vector<DeviceBuffer<float>> scratch_;  // slot r: member r's own

  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool round_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool last_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<Collective> CreatePeerCollective(
    const std::vector<Device*>& devices, absl::Duration timeout) {
  return std::make_unique<PeerCollective>(devices, timeout);
}

}  // namespace tally
