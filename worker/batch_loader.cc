#include "worker/batch_loader.h"

#include <algorithm>
#include <span>

namespace tally {

BatchLoader::BatchLoader(const Dataset* data, const LoaderOptions& options)
    : data_(data), options_(options) {
  const int64_t n = data->size();
  const int64_t world = std::max(1, options.world);
  const int64_t shard = n / world + (options.rank < n % world ? 1 : 0);
  batches_per_epoch_ = (shard + options.batch_size - 1) / options.batch_size;
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < std::max(1, options.depth); ++i) {
      free_.push_back(std::make_unique<HostBatch>());
    }
  }
  thread_ = std::thread([this] { Produce(); });
}

BatchLoader::~BatchLoader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void BatchLoader::Produce() {
  const int64_t feat = data_->sample_numel();
  int64_t produced = 0;
  for (int64_t e = options_.first_epoch;
       e < options_.first_epoch + options_.epochs; ++e) {
    const std::vector<int64_t> order = EpochOrder(
        data_->size(), options_.seed, e, options_.rank, options_.world);
    const int64_t skip = e == options_.first_epoch ? options_.first_batch : 0;
    for (int64_t b = skip;
         b * options_.batch_size < static_cast<int64_t>(order.size()); ++b) {
      if (options_.max_batches > 0 && produced >= options_.max_batches) break;
      std::unique_ptr<HostBatch> batch;
      {
        absl::MutexLock lock(&mu_);
        auto can_fill = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || !free_.empty();
        };
        while (!mu_.AwaitWithTimeout(absl::Condition(&can_fill),
                                     absl::Seconds(1))) {
        }
        if (stop_) return;
        batch = std::move(free_.back());
        free_.pop_back();
      }
      const int64_t begin = b * options_.batch_size;
      const int size = static_cast<int>(
          std::min<int64_t>(options_.batch_size, order.size() - begin));
      batch->x.resize(static_cast<size_t>(options_.batch_size) * feat);
      batch->y.resize(options_.batch_size);
      data_->Gather(std::span<const int64_t>(order.data() + begin, size),
                    batch->x.data(), batch->y.data());
      batch->size = size;
      batch->epoch = e;
      batch->index = b;
      ++produced;
      absl::MutexLock lock(&mu_);
      ready_.push_back(std::move(batch));
    }
  }
  absl::MutexLock lock(&mu_);
  done_ = true;
}

absl::StatusOr<std::unique_ptr<HostBatch>> BatchLoader::Next(
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || done_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&has), timeout)) {
    return absl::DeadlineExceededError("no batch was ready in time");
  }
  if (ready_.empty()) return absl::OutOfRangeError("no more batches");
  std::unique_ptr<HostBatch> b = std::move(ready_.front());
  ready_.pop_front();
  return b;
}

void BatchLoader::Recycle(std::unique_ptr<HostBatch> batch) {
  absl::MutexLock lock(&mu_);
  free_.push_back(std::move(batch));
}

}  // namespace tally
