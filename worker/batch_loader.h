// Prefetching batch loader: a thread assembles the next batches of a
// worker's data shard while the devices compute the current one.
//
// Batches come out in order: epoch by epoch, each epoch the worker's shard of
// EpochOrder(size, seed, epoch, rank, world) cut into batches of batch_size
// (the last one may be short). At most `depth` batches are prepared ahead;
// their buffers are recycled, so the steady state allocates nothing. With
// `threads` > 1 each batch's samples are split between that many threads
// (decoding images is the work worth sharing). A sample that cannot be read
// ends the batches: Next returns its error.
//
// Threading: Next/Recycle are called from one consumer thread.
#ifndef TALLY_WORKER_BATCH_LOADER_H_
#define TALLY_WORKER_BATCH_LOADER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data/dataset.h"

namespace tally {

struct LoaderOptions {
  int64_t batch_size = 64;
  uint64_t seed = 0;
  int rank = 0;
  int world = 1;
  int64_t first_epoch = 0;
  int64_t epochs = 1;       // epochs [first_epoch, first_epoch + epochs)
  int64_t first_batch = 0;  // batches of first_epoch to skip
  int64_t max_batches = 0;  // 0: no limit
  int depth = 3;
  int threads = 1;  // gathering a batch
};

// A batch's inputs are in x (float features) or ids (int64 token ids), as
// the dataset's are; y holds label_numel() labels a sample.
struct HostBatch {
  std::vector<float> x;
  std::vector<int64_t> ids;
  std::vector<int32_t> y;
  int size = 0;
  int64_t epoch = 0;
  int64_t index = 0;  // batch number within its epoch
};

class BatchLoader {
 public:
  // `data` is borrowed and must outlive the loader.
  BatchLoader(const Dataset* data, const LoaderOptions& options);
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;
  ~BatchLoader();

  // Batches per epoch for this rank's shard.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

  // The next batch; kOutOfRange once all are consumed, kDeadlineExceeded if
  // none is ready within `timeout`.
  absl::StatusOr<std::unique_ptr<HostBatch>> Next(absl::Duration timeout);
  // Hands a consumed batch's buffers back for reuse.
  void Recycle(std::unique_ptr<HostBatch> batch);

  // Time Next spent waiting for a batch, in all.
  absl::Duration waited() const { return waited_; }

 private:
  // A batch's samples, split between the producer and the helpers.
  struct Part {
    std::span<const int64_t> indices;
    float* x = nullptr;     // float inputs, or
    int64_t* ids = nullptr;  // int64 ones
    int32_t* y = nullptr;
    absl::Status status;
  };
  // Gathers one part's samples into its rows.
  absl::Status GatherPart(const Part& part) const;

  void Produce();
  absl::Status Fill(std::span<const int64_t> indices, int64_t epoch,
                    HostBatch& batch);
  void Help(size_t part);

  const Dataset* data_;  // borrowed
  LoaderOptions options_;
  int64_t batches_per_epoch_ = 0;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<HostBatch>> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<HostBatch>> free_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::Duration waited_;  // the consumer's
  GatherContext context_;  // the batch being filled (the producer's)
  // The helpers: part i + 1 of the batch of generation `round_` each.
  absl::Mutex parts_mu_;
  std::vector<Part> parts_ ABSL_GUARDED_BY(parts_mu_);
  int64_t round_ ABSL_GUARDED_BY(parts_mu_) = 0;
  int pending_ ABSL_GUARDED_BY(parts_mu_) = 0;
  bool quit_ ABSL_GUARDED_BY(parts_mu_) = false;
  std::vector<std::thread> helpers_;
  std::thread thread_;
};

}  // namespace tally

#endif  // TALLY_WORKER_BATCH_LOADER_H_
