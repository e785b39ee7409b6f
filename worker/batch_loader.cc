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
  for (int i = 1; i < options.threads; ++i) {
    helpers_.emplace_back([this, i] { Help(static_cast<size_t>(i - 1)); });
  }
  thread_ = std::thread([this] { Produce(); });
}

BatchLoader::~BatchLoader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();  // it may be waiting for the helpers: they quit after
  {
    absl::MutexLock lock(&parts_mu_);
    quit_ = true;
  }
  for (std::thread& t : helpers_) t.join();
}

void BatchLoader::Help(size_t k) {
  int64_t seen = 0;
  while (true) {
    Part part;
    {
      absl::MutexLock lock(&parts_mu_);
      auto more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(parts_mu_) {
        return quit_ || round_ > seen;
      };
      parts_mu_.Await(absl::Condition(&more));
      if (quit_) return;
      seen = round_;
      part = parts_[k];
    }
    absl::Status s = GatherPart(part);
    absl::MutexLock lock(&parts_mu_);
    parts_[k].status = std::move(s);
    --pending_;
  }
}

absl::Status BatchLoader::GatherPart(const Part& part) const {
  if (part.ids != nullptr) {
    return data_->GatherIds(part.indices, part.ids, part.y, context_);
  }
  return data_->Gather(part.indices, part.x, part.y, context_);
}

absl::Status BatchLoader::Fill(std::span<const int64_t> indices, int64_t epoch,
                               HostBatch& batch) {
  context_ = GatherContext{options_.seed, epoch};
  const bool ids = data_->input_type == InputType::kInt64;
  const int64_t feat = data_->sample_numel(), labels = data_->label_numel();
  // Part k: samples [cut(k), cut(k + 1)) of the batch.
  const size_t n = indices.size();
  const size_t parts = n < helpers_.size() + 1 ? 1 : helpers_.size() + 1;
  auto cut = [&](size_t k) { return n * k / parts; };
  auto part = [&](size_t k) {
    const int64_t at = static_cast<int64_t>(cut(k));
    return Part{indices.subspan(cut(k), cut(k + 1) - cut(k)),
                ids ? nullptr : batch.x.data() + at * feat,
                ids ? batch.ids.data() + at * feat : nullptr,
                batch.y.data() + at * labels, absl::OkStatus()};
  };
  if (parts == 1) return GatherPart(part(0));
  {
    absl::MutexLock lock(&parts_mu_);
    parts_.assign(parts - 1, Part{});
    for (size_t k = 1; k < parts; ++k) parts_[k - 1] = part(k);
    pending_ = static_cast<int>(parts - 1);
    ++round_;
  }
  absl::Status status = GatherPart(part(0));
  absl::MutexLock lock(&parts_mu_);
  auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(parts_mu_) {
    return pending_ == 0;
  };
  parts_mu_.Await(absl::Condition(&all));
  for (const Part& p : parts_) status.Update(p.status);
  return status;
}

void BatchLoader::Produce() {
  const int64_t feat = data_->sample_numel();
  const int64_t labels = data_->label_numel();
  const bool ids = data_->input_type == InputType::kInt64;
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
      const size_t values = static_cast<size_t>(options_.batch_size * feat);
      if (ids) {
        batch->ids.resize(values);
      } else {
        batch->x.resize(values);
      }
      batch->y.resize(static_cast<size_t>(options_.batch_size) * labels);
      absl::Status filled = Fill(
          std::span<const int64_t>(order.data() + begin, size), e, *batch);
      if (!filled.ok()) {
        absl::MutexLock lock(&mu_);
        error_ = std::move(filled);
        done_ = true;
        return;
      }
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
  const absl::Time began = absl::Now();
  absl::MutexLock lock(&mu_);
  auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || done_;
  };
  const bool ready = mu_.AwaitWithTimeout(absl::Condition(&has), timeout);
  waited_ += absl::Now() - began;
  if (!ready) return absl::DeadlineExceededError("no batch was ready in time");
  if (ready_.empty()) {
    if (!error_.ok()) return error_;
    return absl::OutOfRangeError("no more batches");
  }
  std::unique_ptr<HostBatch> b = std::move(ready_.front());
  ready_.pop_front();
  return b;
}

void BatchLoader::Recycle(std::unique_ptr<HostBatch> batch) {
  absl::MutexLock lock(&mu_);
  free_.push_back(std::move(batch));
}

}  // namespace tally
