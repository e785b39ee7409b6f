// A range's staging buffers (num_params floats each) for pushes in flight
// or staged, and the streamed sum's: recycled, since allocating megabytes a
// push costs page faults on every step, and counted, so that a flood of
// open push streams cannot exhaust the server's memory.
//
// Not thread-safe: the ParameterShard that owns it guards it with its lock.
#ifndef TALLY_SERVER_DATA_STAGING_POOL_H_
#define TALLY_SERVER_DATA_STAGING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

class StagingPool {
 public:
  using Buffer = std::unique_ptr<std::vector<float>>;

  explicit StagingPool(int64_t num_params) : num_params_(num_params) {}
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Counts one more buffer out, at most `limit` at once (kResourceExhausted
  // beyond), and hands over a pooled one; null when none is pooled (the
  // caller makes one, outside its owner's lock).
  absl::StatusOr<Buffer> Acquire(int limit);
  // A pooled buffer or a new one, counted out (the streamed sum's).
  Buffer Take();
  // A buffer back (null: nothing): no longer counted, and kept for reuse,
  // as many as a step stages (`members` + 8, within 256 MiB), unless the
  // pool is closed.
  void Release(Buffer b, size_t members);
  // A buffer counted out that comes back in no shape to reuse (a push of
  // the wrong size): no longer counted, and not kept.
  void Forget() { --out_; }
  // Keeps `b` if nothing is pooled yet (a streamed range's sum, made at
  // install rather than by the first push of the job).
  void Prime(Buffer b);
  bool empty() const { return pool_.empty(); }
  // The range retired: the pooled buffers go, and none is kept from now on.
  void Close();
  int out() const { return out_; }

 private:
  const int64_t num_params_;
  std::vector<Buffer> pool_;
  int out_ = 0;
  bool closed_ = false;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_STAGING_POOL_H_
